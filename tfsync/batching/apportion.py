"""Split a total batch X among workers in proportion to weights, as integers.

This is LB-BSP's CPU rule (LB-BSP §3.2): with t_i = x_i / v_i, the batch sizes that
equalise every worker's time under sum x_i = X are x_i = v_i / sum_j v_j * X. Bounds
[lo_i, hi_i] are met by water-filling (a worker whose share falls outside its bounds
gets the bound and the rest is re-shared among the others in proportion), and the real-valued
shares are rounded by largest remainder so that the integers sum to X exactly and each
differs from its share by less than 1.

Beyond the paper, ``affine_rule``: where part of a worker's step does not shrink with its
batch (its pull and push over a slow link, per-step overheads on a slow CPU), t_i = x_i /
v_i is wrong: a smaller batch saves less time than it predicts, and the proportional rule
reaches equal times only over many rounds, or never within its hysteresis. The affine
rule equalises t_i(x) = a_i + b_i x directly.
"""

from __future__ import annotations

import logging
import math
from typing import Sequence

import numpy as np

logger = logging.getLogger(__name__)


def _per_worker(value, n: int, name: str, default: int) -> list[int]:
    if value is None:
        return [default] * n
    if isinstance(value, (int, float)):
        return [int(value)] * n
    out = [int(v) for v in value]
    if len(out) != n:
        raise ValueError(f"{name} has {len(out)} entries for {n} workers; give one per worker or a number")
    return out


def bounds(n: int, total: int, lo=1, hi=None) -> tuple[list[int], list[int]]:
    """Per-worker integer bounds; ValueError when no integer split of ``total`` fits."""
    lo_, hi_ = _per_worker(lo, n, "lo", 1), _per_worker(hi, n, "hi", total)
    bad = [i for i in range(n) if lo_[i] > hi_[i] or lo_[i] < 0]
    if bad:
        i = bad[0]
        raise ValueError(f"worker {i} has batch bounds [{lo_[i]}, {hi_[i]}]; need 0 <= lo <= hi")
    if sum(lo_) > total or sum(hi_) < total:
        raise ValueError(f"total batch {total} cannot be split among {n} workers within their bounds "
                         f"(lower bounds sum to {sum(lo_)}, upper bounds to {sum(hi_)}); "
                         "lower lo, raise hi or change the total")
    return lo_, hi_


def water_fill(weights: Sequence[float], total: float, lo: Sequence[float],
               hi: Sequence[float], offsets: Sequence[float] | None = None) -> list[float]:
    """Real shares x_i = clip(lam * w_i - c_i, lo_i, hi_i) with sum x_i = total (weights
    > 0; offsets c_i, default 0).

    f(lam) = sum clip(lam * w_i - c_i, lo_i, hi_i) is piecewise linear and non-decreasing,
    with breakpoints (lo_i + c_i) / w_i and (hi_i + c_i) / w_i: binary-search the segment
    holding ``total`` and solve the linear piece exactly."""
    w = np.asarray(weights, dtype=float)
    lo_, hi_ = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    c = np.zeros_like(w) if offsets is None else np.asarray(offsets, dtype=float)

    def f(lam: float) -> float:
        return float(np.clip(lam * w - c, lo_, hi_).sum())

    points = np.unique(np.concatenate([(lo_ + c) / w, (hi_ + c) / w]))
    a, b = 0, len(points) - 1  # f(points[0]) = sum lo <= total <= sum hi = f(points[-1])
    if f(points[b]) <= total:
        return np.clip(points[b] * w - c, lo_, hi_).tolist()
    while b - a > 1:
        mid = (a + b) // 2
        if f(points[mid]) <= total:
            a = mid
        else:
            b = mid
    fa, fb = f(points[a]), f(points[b])
    lam = points[a] if fb == fa else points[a] + (total - fa) / (fb - fa) * (points[b] - points[a])
    return np.clip(lam * w - c, lo_, hi_).tolist()


def round_to_total(shares: Sequence[float], total: int, lo: Sequence[int], hi: Sequence[int]) -> list[int]:
    """Largest-remainder rounding: floors, then +1 to the largest fractional parts
    (among workers below their upper bound) until the sum is ``total``."""
    out = [min(max(int(math.floor(s + 1e-9)), lo[i]), hi[i]) for i, s in enumerate(shares)]
    missing = total - sum(out)
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - out[i]), i))
    if missing >= 0:
        for i in order:
            if missing == 0:
                break
            if out[i] < hi[i]:
                out[i] += 1
                missing -= 1
    else:  # floors clipped up to lo overshot: take back from the smallest remainders
        for i in reversed(order):
            if missing == 0:
                break
            if out[i] > lo[i]:
                out[i] -= 1
                missing += 1
    if missing:
        raise ValueError(f"could not round shares {list(shares)} to total {total} within bounds")
    return out


def cpu_rule(speeds: Sequence[float], total: int, lo=1, hi=None) -> list[int]:
    """Integer batch sizes proportional to ``speeds`` (samples/s), summing to ``total``,
    each within [lo, hi] (numbers or one per worker); LB-BSP §3.2."""
    n = len(speeds)
    if n == 0:
        raise ValueError("cpu_rule needs at least one worker's speed")
    total = int(total)
    v = [float(s) for s in speeds]
    if any(not math.isfinite(s) or s <= 0 for s in v):
        raise ValueError(f"speeds must be finite and > 0 (samples/s), got {list(speeds)!r}")
    lo_, hi_ = bounds(n, total, lo, hi)
    return round_to_total(water_fill(v, total, lo_, hi_), total, lo_, hi_)


def affine_rule(fixed: Sequence[float], per_sample: Sequence[float], total: int, lo=1, hi=None) -> list[int]:
    """Integer batch sizes that equalise t_i(x) = fixed_i + per_sample_i * x (seconds),
    summing to ``total``, each within [lo, hi]: x_i = (T - a_i) / b_i for the common T
    that sums to ``total``. A worker whose fixed part alone exceeds T gets ``lo``: the
    round then waits for it whatever the others get."""
    n = len(fixed)
    if n == 0 or len(per_sample) != n:
        raise ValueError(f"affine_rule needs one fixed time and one time per sample per worker, got {n} and "
                         f"{len(per_sample)}")
    a, b = [float(v) for v in fixed], [float(v) for v in per_sample]
    if any(not math.isfinite(v) or v < 0 for v in a) or any(not math.isfinite(v) or v <= 0 for v in b):
        raise ValueError(f"affine_rule needs fixed times >= 0 and times per sample > 0 (seconds), got {a!r} "
                         f"and {b!r}")
    total = int(total)
    lo_, hi_ = bounds(n, total, lo, hi)
    shares = water_fill([1.0 / v for v in b], total, lo_, hi_, offsets=[ai / bi for ai, bi in zip(a, b)])
    return round_to_total(shares, total, lo_, hi_)
