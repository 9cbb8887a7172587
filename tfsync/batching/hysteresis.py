"""Anti-churn for adaptive batch sizes.

Predicted speeds are noisy, and a sizing rule that follows every wiggle changes batch
sizes every round (users of AdaptDL complained of exactly that): each change can cost
a retrace or a new input pipeline shape, and buys nothing when the gain is noise.

The rule (``Hysteresis.choose``): keep the current sizes unless
  (a) the round time they are predicted to take (the slowest worker's finish time, what
      the barrier waits for) exceeds that of the proposed sizes by more than
      ``min_gain`` (relative; default 5 %), or
  (b) some worker's proposed size differs from its current one by more than
      ``max_change`` (relative; default 50 %): a real, large shift in speeds, or
  (c) the current sizes no longer apply (other workers, or another total).
Otherwise the current sizes are kept. Both thresholds at 0 give the plain rule.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping

logger = logging.getLogger(__name__)

Times = Callable[[Mapping[int, int]], Mapping[int, float]]


@dataclass
class Hysteresis:
    min_gain: float = 0.05
    max_change: float = 0.5
    moves: int = 0
    holds: int = 0

    def __post_init__(self):
        if not (self.min_gain >= 0 and self.max_change >= 0):
            raise ValueError(f"Hysteresis needs min_gain >= 0 and max_change >= 0, got "
                             f"{self.min_gain}, {self.max_change}")

    def choose(self, current: Mapping[int, int] | None, proposed: Mapping[int, int],
               times: Times) -> dict[int, int]:
        """``proposed`` or ``current``; ``times(sizes)`` predicts each worker's finish time."""
        proposed = dict(proposed)
        if not current or set(current) != set(proposed) or sum(current.values()) != sum(proposed.values()):
            self.moves += 1
            return proposed
        if proposed == dict(current):
            self.holds += 1
            return proposed
        t_cur, t_new = max(times(current).values()), max(times(proposed).values())
        gain = 1.0 - t_new / t_cur if t_cur > 0 else 0.0
        change = max(abs(proposed[w] - current[w]) / max(current[w], 1) for w in proposed)
        if gain > self.min_gain or change > self.max_change:
            self.moves += 1
            logger.debug("batch sizes move: predicted round time -%.1f%%, largest change %.0f%%",
                         100 * gain, 100 * change)
            return proposed
        self.holds += 1
        logger.debug("batch sizes held: predicted gain %.1f%% <= %.1f%%, largest change %.0f%% <= %.0f%%",
                     100 * gain, 100 * self.min_gain, 100 * change, 100 * self.max_change)
        return dict(current)

    def describe(self) -> dict:
        return {"min_gain": self.min_gain, "max_change": self.max_change,
                "moves": self.moves, "holds": self.holds}
