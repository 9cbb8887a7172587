"""LB-BSP's GPU rule (LB-BSP §3.3): batch sizes that minimise the slowest worker's
iteration time, for workers whose compute time is linear between two sizes.

Per worker i (eq. 5): t_i = m_i * x_i + b_i + comm_i with x_s_i <= x_i <= x_o_i, where
x_s is the minimum saturation point (below it the GPU is not saturated and time is
flat, so a smaller batch gains nothing) and x_o the largest batch that fits in memory.
The linear program over (x_1..x_n, T): minimise T subject to m_i x_i + b_i + comm_i <= T
and sum x_i = X is solved with scipy's ``linprog``; its real solution is then rounded to
integers that keep sum x_i = X and the bounds, adding the leftover samples one at a time
to the worker whose time grows least.

The profile (m, b, x_s, x_o) comes from a profiling phase (``profile_worker``); the
communication time is predicted with an EMA (§3.3), here measured as the part of an
iteration the profile does not explain.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .apportion import bounds

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuProfile:
    """One worker's compute time: t_p(x) = m * x + b for x_s <= x <= x_o (LB-BSP eq. 5)."""

    m: float  # seconds per sample (slope)
    b: float  # seconds (intercept)
    x_s: int = 1  # minimum saturation point: below it t_p is flat
    x_o: int | None = None  # out-of-memory point: the largest size that fits (None: no limit)

    def __post_init__(self):
        if not (math.isfinite(self.m) and math.isfinite(self.b)) or self.m < 0:
            raise ValueError(f"GpuProfile needs finite m >= 0 and b, got m={self.m}, b={self.b}")
        if self.x_s < 1 or (self.x_o is not None and self.x_o < self.x_s):
            raise ValueError(f"GpuProfile needs 1 <= x_s <= x_o, got x_s={self.x_s}, x_o={self.x_o}")

    def time(self, x: float) -> float:
        """Compute time of a batch of ``x`` (flat below x_s)."""
        return self.m * max(x, self.x_s) + self.b


def profile_worker(samples: Sequence[tuple[float, float]], x_o: int | None = None,
                   flat_tol: float = 0.05) -> GpuProfile:
    """Fit a profile from (batch size, compute time) observations.

    x_s is the largest profiled size whose median time is within ``flat_tol`` (relative)
    of the smallest size's median time (with no flat part, the smallest size profiled:
    nothing is known below it); m and b are least squares over the sizes >= x_s.
    ``x_o`` is given (the largest size that fits); by default the largest size profiled."""
    by_size: dict[int, list[float]] = {}
    for x, t in samples:
        if not (x >= 1 and math.isfinite(t) and t >= 0):
            raise ValueError(f"profile samples must be (batch size >= 1, time >= 0), got {(x, t)!r}")
        by_size.setdefault(int(x), []).append(float(t))
    if len(by_size) < 2:
        raise ValueError(f"profiling needs at least 2 distinct batch sizes, got {sorted(by_size)}; "
                         "time a few more sizes")
    sizes = sorted(by_size)
    med = [float(np.median(by_size[s])) for s in sizes]
    k = 0
    while k + 1 < len(sizes) and med[k + 1] <= med[0] * (1 + flat_tol):
        k += 1
    x_s = sizes[k]
    xs = np.array([s for s in sizes[k:] for _ in by_size[s]], dtype=float)
    ts = np.array([t for s in sizes[k:] for t in by_size[s]], dtype=float)
    if len(set(xs.tolist())) >= 2:
        m, b = np.polyfit(xs, ts, 1)
    else:  # flat everywhere profiled: time does not grow with the batch yet
        m, b = 0.0, float(np.mean(ts))
    top = sizes[-1] if x_o is None else int(x_o)
    return GpuProfile(float(max(m, 0.0)), float(b), int(x_s), max(top, int(x_s)))


def gpu_rule(profiles: Sequence[GpuProfile], total: int, comm: Sequence[float] | None = None) -> list[int]:
    """Integer batch sizes summing to ``total`` that minimise max_i t_i (LB-BSP eq. 3
    with the linear constraints of eq. 5). ValueError when the bounds cannot hold ``total``."""
    from scipy.optimize import linprog

    n, total = len(profiles), int(total)
    if n == 0:
        raise ValueError("gpu_rule needs at least one worker's profile")
    comm = [0.0] * n if comm is None else [float(c) for c in comm]
    if len(comm) != n:
        raise ValueError(f"comm has {len(comm)} entries for {n} profiles; give one per worker")
    lo, hi = bounds(n, total, [p.x_s for p in profiles],
                    [p.x_o if p.x_o is not None else total for p in profiles])
    const = np.array([p.b + c for p, c in zip(profiles, comm)])
    slope = np.array([p.m for p in profiles])
    # Variables (x_1..x_n, T): minimise T; m_i x_i - T <= -(b_i + comm_i); sum x_i = X.
    c = np.r_[np.zeros(n), 1.0]
    a_ub = np.c_[np.diag(slope), -np.ones(n)]
    a_eq = np.r_[np.ones(n), 0.0][None, :]
    res = linprog(c, A_ub=a_ub, b_ub=-const, A_eq=a_eq, b_eq=[total],
                  bounds=[(lo[i], hi[i]) for i in range(n)] + [(None, None)], method="highs")
    if res.status != 0:
        raise ValueError(f"the GPU batch-size program has no solution ({res.message}); check the "
                         f"profiles' bounds against the total {total}")
    x = res.x[:n]
    out = [min(max(int(math.floor(v + 1e-9)), lo[i]), hi[i]) for i, v in enumerate(x)]
    while sum(out) > total:  # float noise above a bound: take from the slowest
        i = max((i for i in range(n) if out[i] > lo[i]), key=lambda i: slope[i] * out[i] + const[i])
        out[i] -= 1
    while sum(out) < total:  # the leftover samples, each where the time grows least
        i = min((i for i in range(n) if out[i] < hi[i]),
                key=lambda i: (slope[i] * (out[i] + 1) + const[i], i))
        out[i] += 1
    logger.debug("gpu_rule: sizes %s, predicted max time %.4g s", out, float(np.max(slope * out + const)))
    return out


def predicted_times(profiles: Sequence[GpuProfile], sizes: Sequence[int],
                    comm: Sequence[float] | None = None) -> list[float]:
    """t_i = m_i * max(x_i, x_s_i) + b_i + comm_i for each worker."""
    comm = [0.0] * len(profiles) if comm is None else comm
    return [p.time(x) + c for p, x, c in zip(profiles, sizes, comm)]
