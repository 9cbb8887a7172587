"""How long a simulated worker's step takes.

One :class:`SpeedModel` covers the cases of RLP §4 and of the issues:
- constant speed: ``fixed + per_sample * batch_size`` seconds;
- heterogeneous workers: a per-worker ``factors`` multiplier;
- random transient stragglers: with probability ``straggle_p`` a step sleeps an extra
  N(``straggle_mean``, ``straggle_std``) seconds (clipped at 0); mean and std may be
  per-worker sequences (RLP §4: some workers sleep, others never do);
- trace-driven: a worker placed on a traced machine gets the CPU share the machine's
  other load leaves it, ``share(w, t) = max(1 - util(t) / 100, min_share)``, so its
  compute time is divided by the share at the step's start (traces: tfsync.base.traces;
  ``contention`` is what a resource monitor reads, tfsync.sim.monitor);
- ``jitter``: log-normal noise on every step (sigma), as real step times have.

Draws come from one random stream per worker, taken in step order, so worker w's k-th
step is equally slow under every policy run with the same seed: policies are compared
on the same luck.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Sequence

from ..base.traces import CpuTrace


def _of(value, worker: int) -> float:
    """A per-worker value: the number itself, or entry ``worker`` of a sequence."""
    return float(value) if isinstance(value, (int, float)) else float(value[worker % len(value)])


@dataclass
class SpeedModel:
    """Step time of every simulated worker; see the module docstring."""

    fixed: float = 0.01
    per_sample: float = 0.001
    factors: Sequence[float] | None = None
    straggle_p: float = 0.0
    straggle_mean: float | Sequence[float] = 0.0
    straggle_std: float | Sequence[float] = 0.0
    jitter: float = 0.0
    traces: Sequence[CpuTrace] | None = None
    trace_scale: float = 1.0  # trace seconds per simulated second
    min_share: float = 0.05  # a machine never leaves a worker less than this CPU share
    seed: int = 0
    _rngs: dict = field(default_factory=dict, init=False, repr=False)
    _loads: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        if self.fixed < 0 or self.per_sample < 0 or self.fixed + self.per_sample <= 0:
            raise ValueError("step time needs fixed >= 0, per_sample >= 0 and one of them > 0")
        if not 0.0 <= self.straggle_p <= 1.0:
            raise ValueError(f"straggle_p must be in [0, 1], got {self.straggle_p}")
        if self.factors is not None and min(self.factors) <= 0:
            raise ValueError("speed factors must be > 0")

    def rng(self, worker: int) -> random.Random:
        r = self._rngs.get(worker)
        if r is None:
            r = self._rngs[worker] = random.Random(self.seed * 1_000_003 + worker)
        return r

    def factor(self, worker: int) -> float:
        return self.factors[worker % len(self.factors)] if self.factors else 1.0

    def _trace_time(self, worker: int, now: float) -> float:
        # Workers sharing a trace start at different points of it.
        return now * self.trace_scale + (worker // len(self.traces)) * 3600.0

    def share(self, worker: int, now: float) -> float:
        """The CPU share worker ``worker``'s machine leaves it at simulated time ``now``:
        ``max(1 - util / 100, min_share)`` of its trace, 1 without traces."""
        if not self.traces:
            return 1.0
        trace = self.traces[worker % len(self.traces)]
        return max(1.0 - trace.at(self._trace_time(worker, now)) / 100.0, self.min_share)

    def contention(self, worker: int, t0: float, t1: float | None = None) -> float:
        """Percent of the worker's CPU other load takes, ``100 * (1 - share)``, at ``t0``
        or averaged over [t0, t1]: the engine monitor's ``cpu`` (tfsync.sim.monitor)."""
        if not self.traces:
            return 0.0
        if t1 is None or t1 <= t0:
            return 100.0 * (1.0 - self.share(worker, t0))
        i = worker % len(self.traces)
        load = self._loads.get(i)
        if load is None:  # what the other load can take: all but min_share
            load = self._loads[i] = self.traces[i].clipped(100.0 * (1.0 - self.min_share))
        return load.mean(self._trace_time(worker, t0), self._trace_time(worker, t1))

    def step_time(self, worker: int, batch_size: int, now: float) -> float:
        t = (self.fixed + self.per_sample * batch_size) * self.factor(worker)
        if self.traces:
            t /= self.share(worker, now)
        if self.jitter or self.straggle_p:
            r = self.rng(worker)
            if self.jitter:
                t *= math.exp(r.gauss(0.0, self.jitter))
            if self.straggle_p and r.random() < self.straggle_p:
                t += max(0.0, r.gauss(_of(self.straggle_mean, worker), _of(self.straggle_std, worker)))
        return t

    def describe(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if not k.startswith("_") and k != "traces"}
        d["factors"] = list(self.factors) if self.factors else None
        for k in ("straggle_mean", "straggle_std"):
            d[k] = d[k] if isinstance(d[k], (int, float)) else list(d[k])
        d["traces"] = [t.name for t in self.traces] if self.traces else None
        return d
