"""The heterogeneity levels of LB-BSP §5.2 as burner settings.

The paper: Homo, no stragglers; Hetero-L2 (L3), the slowest worker's sample processing
speed is roughly 1/2 (1/3) of the fastest one's. Our mapping: worker i of n gets a target
speed share s_i spaced evenly from 1 (worker 0, no burner) down to 1/2 or 1/3 (worker
n-1). A training process sharing its CPUs with k spinning burners gets, under Linux's
fair scheduler, 1/(k+1) of them while the burners spin and all of them otherwise, so
with duty d its share is s = 1 - d * k / (k + 1). Hence:
- s >= 1/2: k = 1 burner per CPU, d = 2 (1 - s) (Hetero-L2's slowest: d = 1);
- s <  1/2: k = 2 burners per CPU, d = 1.5 (1 - s) (Hetero-L3's slowest: d = 1).
This assumes the burners are pinned to the worker's CPUs and the worker keeps them
busy; it is a starting point to be checked against measured speeds, not a guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass

LEVELS = {"homo": 1.0, "hetero-l2": 1.0 / 2.0, "hetero-l3": 1.0 / 3.0}


@dataclass(frozen=True)
class BurnSpec:
    """Burners for one worker: ``processes`` per CPU, each busy ``duty`` of the time."""

    share: float  # the speed share the worker should keep (1 = unslowed)
    processes: int
    duty: float


def spec_for_share(share: float) -> BurnSpec:
    """Burner settings that leave a CPU-bound process about ``share`` of its CPUs."""
    if not 1.0 / 3.0 - 1e-9 <= share <= 1.0:
        raise ValueError(f"speed share must be in [1/3, 1] (what 2 burners per CPU can do), got {share!r}")
    if share >= 1.0 - 1e-9:
        return BurnSpec(1.0, 0, 0.0)
    if share >= 0.5:
        return BurnSpec(share, 1, min(2.0 * (1.0 - share), 1.0))
    return BurnSpec(share, 2, min(1.5 * (1.0 - share), 1.0))


def level_plan(level: str, num_workers: int) -> list[BurnSpec]:
    """One :class:`BurnSpec` per worker for a LB-BSP level (``homo``, ``hetero-l2``,
    ``hetero-l3``); worker 0 is the fastest, worker n-1 the slowest."""
    key = str(level).lower().replace("_", "-")
    if key not in LEVELS:
        raise ValueError(f"unknown heterogeneity level {level!r}; valid: {', '.join(LEVELS)}")
    if int(num_workers) < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
    n, slowest = int(num_workers), LEVELS[key]
    shares = [1.0 - (1.0 - slowest) * i / (n - 1) if n > 1 else 1.0 for i in range(n)]
    return [spec_for_share(s) for s in shares]
