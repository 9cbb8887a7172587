"""Steps granted ahead by time (ASP, SSP): a worker is granted the steps it runs in
``queue_s`` seconds, from the mean time between the starts of its recent steps, so that on
a fast model every release of tokens and every drain of records carries many steps (each
is a remote call that costs the coordinator about a millisecond of CPU), the way
``steps_per_execution`` packs steps into one call. TF-free."""

from __future__ import annotations

import math

from .base import Push

MAX_PATIENCE_S = 0.08
MAX_DEPTH = 64   # steps granted ahead of a worker, at most
GAP_EMA = 0.2    # the weight of a worker's latest time between steps in its mean


class StepGaps:
    """Each worker's mean time between the starts of its steps."""

    def __init__(self, depth: int, queue_s: float):
        self.depth, self.queue_s = depth, queue_s
        self._last: dict[int, float] = {}   # each worker's last step's start
        self._gap: dict[int, float] = {}

    def observe(self, push: Push) -> None:
        w = push.worker
        last, self._last[w] = self._last.get(w), push.start
        if last is not None and push.start > last:
            gap = self._gap.get(w)
            self._gap[w] = push.start - last if gap is None else (1 - GAP_EMA) * gap + GAP_EMA * (push.start - last)

    def ahead(self, worker: int) -> int:
        """The steps ``worker`` runs in ``queue_s``, within [``depth``, ``MAX_DEPTH``]
        (``depth`` until it has run two steps, or where ``queue_s`` is 0)."""
        gap = self._gap.get(worker)
        if not gap or not self.queue_s:
            return self.depth
        return max(self.depth, min(MAX_DEPTH, math.ceil(self.queue_s / gap)))

    def patience(self, queued: dict[int, int]) -> float:
        """A quarter of the time the shortest of these queues lasts (``{worker: steps}``:
        its steps times its steps' time apart; of the workers that have run two steps), at
        most ``MAX_PATIENCE_S``; 0 until one has."""
        lasts = [n * self._gap[w] for w, n in queued.items() if self._gap.get(w)]
        return min(MAX_PATIENCE_S, min(lasts) / 4) if lasts else 0.0
