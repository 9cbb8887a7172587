"""Synchronization policies: one interface (``base``), one file per protocol, and the
catalogue that names them (``catalogue``: options, traits, look-up).

``get(name_or_policy, **options)`` builds a policy by name; unknown names or options
raise ValueError listing what is valid. ``register(cls)`` adds a protocol.
"""

from __future__ import annotations

from .asp import ASP
from .auto import AutoPolicy
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

# in the order they became nameable in job files, which messages keep
for _cls in (BSP, ASP, SSP, PSSP, ElasticBSP, RLP, LBBSP, FluentPS, AutoPolicy):
    register(_cls)

__all__ = [
    "ASP", "AutoPolicy", "BSP", "ElasticBSP", "FluentPS", "LBBSP", "PSSP", "RLP", "SSP", "BatchSizer", "ClusterView",
    "Decision", "FixedSizer", "Grant", "NOTHING", "Option", "Policy", "PolicyError", "Push", "PushMode",
    "REGISTRY", "get", "make", "names", "register", "spec",
]
