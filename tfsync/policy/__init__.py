"""Synchronization policies: one interface (``base``), one file per protocol, and the
catalogue that names them (``catalogue``: options, traits, look-up).

``get(name_or_policy, **options)`` builds a policy by name; unknown names or options
raise ValueError listing what is valid. ``register(cls)`` adds a protocol.
"""

from __future__ import annotations

from .asp import ASP
from .base import (NOTHING, BatchSizer, ClusterView, Decision, Grant, Policy, PolicyError,
                   Push, PushMode)
from .bsp import BSP
from .catalogue import CLASSES as REGISTRY
from .catalogue import get, make, names, register, spec
from .elastic_bsp import ElasticBSP
from .fluentps import PSSP, FluentPS
from .lbbsp import LBBSP
from .options import Option
from .rlp import RLP
from .sizing import FixedSizer
from .ssp import SSP

# fluentps last: it became nameable in job files after the others, whose order messages keep
for _cls in (BSP, ASP, SSP, PSSP, ElasticBSP, RLP, LBBSP, FluentPS):
    register(_cls)

__all__ = [
    "ASP", "BSP", "ElasticBSP", "FluentPS", "LBBSP", "PSSP", "RLP", "SSP", "BatchSizer", "ClusterView",
    "Decision", "FixedSizer", "Grant", "NOTHING", "Option", "Policy", "PolicyError", "Push", "PushMode",
    "REGISTRY", "get", "make", "names", "register", "spec",
]
