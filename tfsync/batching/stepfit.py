"""How much of a worker's step does not shrink with its batch: a least-squares line
t = a + b * batch over its last steps (LB-BSP's affine model, ``apportion.affine_rule``).

The fit needs batches that differ: while a worker runs one batch size (BSP's equal split,
before LB-BSP first moves the sizes) it says nothing, and the share is 0, the paper's
proportional model. A slope of 0 or less says nothing either (share 0): steps are noisy,
and batches a few samples apart give a slope of either sign; read as a step all of
whose time is fixed, it handed that worker two and a half times the even split in the
simulator (step noise of 15 %, issue 54). A share is at most ``MAX_FIXED``.
"""

from __future__ import annotations

import math
from collections import deque

MAX_FIXED = 0.95   # below 1: the affine rule divides by the part that grows with the batch


class StepFit:
    def __init__(self, window: int = 16, min_spread: float = 1.2):
        self.points: deque[tuple[float, float]] = deque(maxlen=window)
        self.min_spread = min_spread

    def add(self, batch: int, seconds: float) -> None:
        if batch > 0 and seconds > 0 and math.isfinite(seconds):
            self.points.append((float(batch), float(seconds)))

    def fixed_share(self, batch: float) -> float:
        """a / (a + b * batch) from the fit; 0 while the batches seen do not differ by
        ``min_spread`` times."""
        if len(self.points) < 3:
            return 0.0
        xs, ts = [p[0] for p in self.points], [p[1] for p in self.points]
        if max(xs) < self.min_spread * min(xs):
            return 0.0
        mx, mt = sum(xs) / len(xs), sum(ts) / len(ts)
        b = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sum((x - mx) ** 2 for x in xs)
        if b <= 0:
            return 0.0
        a = max(mt - b * mx, 0.0)
        return min(a / (a + b * batch), MAX_FIXED)

    def save_state(self) -> list[list[float]]:
        return [list(p) for p in self.points]

    def restore_state(self, points) -> None:
        self.points.clear()
        for x, t in points:
            self.add(x, t)
