"""How long a simulated worker's step takes.

One :class:`SpeedModel` covers the cases of paper 004 §4 and of the issues:
- constant speed: ``fixed + per_sample * batch_size`` seconds;
- heterogeneous workers: a per-worker ``factors`` multiplier;
- random transient stragglers: with probability ``straggle_p`` a step sleeps an extra
  N(``straggle_mean``, ``straggle_std``) seconds (clipped at 0); mean and std may be
  per-worker sequences (paper 004 §4: some workers sleep, others never do);
- trace-driven: a worker placed on a traced machine gets the CPU share the machine's
  other load leaves it, ``1 - util(t)``, so its compute time is divided by that share;
- ``jitter``: log-normal noise on every step (sigma), as real step times have.

Draws come from one random stream per worker, taken in step order, so worker w's k-th
step is equally slow under every policy run with the same seed: policies are compared
on the same luck.
"""

from __future__ import annotations

import csv
import math
import os
import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class CpuTrace:
    """CPU utilisation (percent) of one machine over time, sampled at ``times`` (s)."""

    name: str
    times: np.ndarray
    util: np.ndarray

    def at(self, t: float) -> float:
        """Utilisation at trace time ``t`` (wraps around the trace's span)."""
        span = float(self.times[-1] - self.times[0]) or 1.0
        t = self.times[0] + (t % span)
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        return float(self.util[max(i, 0)])


def load_cpu_traces(path: str, limit: int | None = None) -> list[CpuTrace]:
    """CPU traces from ``../shared/data/traces`` formats: the Alibaba 2018
    ``machine_usage.csv`` (one trace per machine id), a Bitbrains VM ``N.csv`` (or a
    folder of them), or a data-centre aggregate CSV with a ``cpu_util_percent`` column."""
    if os.path.isdir(path):
        files = sorted((f for f in os.listdir(path) if f.endswith(".csv")),
                       key=lambda f: (len(f), f))
        traces = [t for f in files for t in load_cpu_traces(os.path.join(path, f))]
        return traces[:limit] if limit else traces
    with open(path, newline="") as f:
        head = f.readline()
    if ";" in head:  # Bitbrains: "Timestamp [ms];\tCPU cores;\t...;\tCPU usage [%];..."
        rows = np.genfromtxt(path, delimiter=";", skip_header=1, usecols=(0, 4))
        traces = [CpuTrace(os.path.basename(path), rows[:, 0] - rows[0, 0], rows[:, 1])]
    elif "cpu_util_percent" in head:  # data-centre aggregate, one row per 30 s / 300 s
        with open(path, newline="") as f:
            util = np.array([float(r["cpu_util_percent"]) for r in csv.DictReader(f)])
        step = 300.0 if "300s" in path else 30.0
        traces = [CpuTrace(os.path.basename(path), np.arange(len(util)) * step, util)]
    else:  # Alibaba machine_usage: machine_id, time_stamp, cpu_util_percent, ...
        by_machine: dict[str, list[tuple[float, float]]] = {}
        with open(path, newline="") as f:
            for row in csv.reader(f):
                if len(row) > 2 and row[2]:
                    by_machine.setdefault(row[0], []).append((float(row[1]), float(row[2])))
        traces = []
        for name, rows in by_machine.items():
            rows.sort()
            a = np.array(rows)
            traces.append(CpuTrace(name, a[:, 0] - a[0, 0], a[:, 1]))
    if not traces or any(len(t.times) < 2 for t in traces):
        raise ValueError(f"{path}: no CPU trace with at least two samples found")
    return traces[:limit] if limit else traces


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

    def step_time(self, worker: int, batch_size: int, now: float) -> float:
        t = (self.fixed + self.per_sample * batch_size) * self.factor(worker)
        if self.traces:
            trace = self.traces[worker % len(self.traces)]
            # Workers sharing a trace start at different points of it.
            offset = (worker // len(self.traces)) * 3600.0
            share = max(1.0 - trace.at(now * self.trace_scale + offset) / 100.0, self.min_share)
            t /= share
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
