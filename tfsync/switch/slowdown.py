"""Transient stragglers for the simulator: a :class:`SpeedModel` whose listed workers are
slowed by a factor during given time intervals (Sync-Switch §VI-B3 injects network latency
on 1 or 2 workers for a while; §IV-B2 assumes each slowdown lasts at most ~100 s).

``TransientSlowdown(fixed=0.01, slowdowns=(Slowdown(worker=2, start=5, end=15, factor=3),))``
multiplies worker 2's step time by 3 for steps that *start* in [5, 15).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..sim.speeds import SpeedModel


@dataclass(frozen=True)
class Slowdown:
    worker: int
    start: float
    end: float
    factor: float  # step time multiplier, > 1 slows the worker

    def __post_init__(self):
        if not self.end > self.start:
            raise ValueError(f"slowdown of worker {self.worker}: end {self.end} must be after start {self.start}")
        if not self.factor > 0:
            raise ValueError(f"slowdown factor {self.factor!r}: must be > 0 (e.g. 3 for three times slower)")


@dataclass
class TransientSlowdown(SpeedModel):
    slowdowns: Sequence[Slowdown] = ()

    def step_time(self, worker: int, batch_size: int, now: float) -> float:
        t = super().step_time(worker, batch_size, now)
        for s in self.slowdowns:
            if s.worker == worker and s.start <= now < s.end:
                t *= s.factor
        return t

    def describe(self) -> dict:
        d = super().describe()
        d["slowdowns"] = [s.__dict__ for s in self.slowdowns]
        return d
