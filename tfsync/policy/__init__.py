"""Synchronization policies: one interface (``base``), one file per protocol.

``get(name_or_policy, **options)`` builds a policy by name; unknown names or options
raise ValueError listing what is valid.
"""

from __future__ import annotations

from ..registry import build

from .asp import ASP
from .base import (NOTHING, BatchSizer, ClusterView, Decision, Grant, Policy, PolicyError,
                   Push, PushMode)
from .bsp import BSP
from .elastic_bsp import ElasticBSP
from .fluentps import PSSP, FluentPS
from .lbbsp import LBBSP
from .rlp import RLP
from .sizing import FixedSizer
from .ssp import SSP

REGISTRY: dict[str, type[Policy]] = {"bsp": BSP, "asp": ASP, "ssp": SSP, "fluentps": FluentPS, "pssp": PSSP,
                                   "elastic_bsp": ElasticBSP, "rlp": RLP,
                                   "lbbsp": LBBSP}


def register(name: str, cls: type[Policy]) -> None:
    REGISTRY[name] = cls


def get(spec, **options) -> Policy:
    """A policy from a name (``"ssp"``), a dict (``{"name": "ssp", "staleness": 2}``) or an instance."""
    return build(REGISTRY, spec, Policy, "protocol", **options)


__all__ = [
    "ASP", "BSP", "ElasticBSP", "FluentPS", "LBBSP", "PSSP", "RLP", "SSP", "BatchSizer", "ClusterView",
    "Decision", "FixedSizer", "Grant", "NOTHING", "Policy", "PolicyError", "Push", "PushMode",
    "REGISTRY", "get", "register",
]
