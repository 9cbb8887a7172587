"""A phase of a run (one policy until a share of the workload) and the engine's error."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..policy.base import Policy
from ..base.exits import TfsyncError


class EngineError(TfsyncError, RuntimeError):
    """Training cannot go on (a dead task, a step past its timeout, a stalled policy)."""


@dataclass
class Phase:
    """Run ``policy`` until ``until`` (a fraction of the workload, in samples).

    ``switch``: how this phase is entered from the previous one ("hot" or "restart").
    ``lr_scale`` multiplies the base learning rate; ``momentum`` replaces the base
    momentum (None: keep), or is a function of the epochs since the phase began (the
    ramps of Sync-Switch Fig. 8b); both from the configuration policy (§IV-C).
    ``changed``: what commands changed while it ran (a switch's ``protocol``, ``options``
    and ``lr_scale``; ``batch_sizes``), saved with checkpoints so that a resumed run
    starts as the stop left it (``tfsync.engine.switching.carry_changes``).
    """

    policy: Policy
    until: float = 1.0
    switch: str = "hot"
    lr_scale: float = 1.0
    momentum: float | Callable[[float], float] | None = None
    changed: dict = field(default_factory=dict)

    def set_batch_sizes(self, sizes, max_batch: int) -> None:
        """A command's batch sizes: granted from the next grant on, kept by checkpoints."""
        self.policy.set_batch_sizes(sizes, max_batch)
        self.changed["batch_sizes"] = list(sizes)

    def switched(self, new: Policy, method: str, lr_scale: float, options: dict) -> None:
        """A command's switch: ``new`` (built with ``options``) runs the rest of this phase
        at learning rate x ``lr_scale``; kept by checkpoints."""
        self.policy, self.lr_scale, self.switch = new, lr_scale, method
        self.changed.update(protocol=new.name, options=options, lr_scale=lr_scale)
        if new.self_sizing:
            self.changed.pop("batch_sizes", None)
