"""Sync-Switch's configuration policy (Sync-Switch §IV-C, Fig. 8): the hyper-parameters a
protocol runs with, given the user's per-worker batch B, learning rate eta and momentum.

Paper defaults: BSP runs the global batch n*B (B on each worker) with learning rate
n*eta (linear scaling rule); ASP runs B per worker with eta; momentum is kept.
Alternatives (Fig. 8): no LR scaling; ASP keeping the global batch n*B on each worker
(Fig. 8a); momentum after the switch set to 0, 1/n, or ramped up per epoch as 2^i/n or
i/n until it reaches the BSP value (Fig. 8b).

"BSP" here is every protocol the catalogue marks ``aggregating`` (its update averages n
workers' gradients: BSP, LB-BSP); "ASP" every other.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policy.catalogue import aggregating

LR_RULES = ("linear", "constant")
BATCH_RULES = ("local", "global")
MOMENTUM_RULES = ("keep", "zero", "inverse_n", "ramp_exp", "ramp_linear")


@dataclass(frozen=True)
class Hyper:
    batch_size: int  # per worker
    lr_scale: float  # multiplies eta
    momentum: float


@dataclass(frozen=True)
class ConfigPolicy:
    lr: str = "linear"
    batch: str = "local"
    momentum: str = "keep"

    def __post_init__(self):
        for name, value, allowed in (("lr", self.lr, LR_RULES), ("batch", self.batch, BATCH_RULES),
                                     ("momentum", self.momentum, MOMENTUM_RULES)):
            if value not in allowed:
                raise ValueError(f"switch.{name} = {value!r}: must be one of {', '.join(allowed)}")

    def hyper(self, protocol: str, workers: int, batch_size: int, momentum: float,
              epochs_since_switch: float = 0.0, after_switch: bool = False) -> Hyper:
        """Hyper-parameters for ``protocol``; ``after_switch``: a non-aggregating protocol
        entered from an aggregating one (where the momentum rules apply)."""
        n = int(workers)
        if aggregating(protocol):
            return Hyper(batch_size, float(n) if self.lr == "linear" else 1.0, momentum)
        b = batch_size * n if self.batch == "global" else batch_size
        return Hyper(b, 1.0, self.momentum_after(momentum, n, epochs_since_switch) if after_switch else momentum)

    def momentum_after(self, momentum: float, n: int, epochs: float) -> float:
        i = int(epochs)
        rule = self.momentum
        if rule == "keep":
            return momentum
        if rule == "zero":
            return 0.0
        if rule == "inverse_n":
            return min(momentum, 1.0 / n)
        if rule == "ramp_exp":
            return min(momentum, 2.0 ** i / n)
        return min(momentum, max(i, 1) / n) if rule == "ramp_linear" else momentum
