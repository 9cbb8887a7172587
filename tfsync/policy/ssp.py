"""SSP with staleness bound s: no worker starts step c + s + 1 before every member has
finished step c (RLP §3.1; FluentPS Table III). Pushes are applied on arrival.

A worker may be granted steps up to ``min_clock + s + 1``, and at most the steps it runs in
``queue_s`` seconds (at least ``depth``) ahead of its own clock, so fast workers keep steps
queued while they are within the bound, and on a fast model each release and drain
carries several steps (tfsync.policy.pacing, as ASP). Its records can wait a quarter of
the time the shortest member's room lasts: 0 while any member is at the bound, which
waits for the slowest's push. On the tiny model of
``experiments/bench_coordinator_scale.py`` (loopback, s = 3) the coordinator's CPU per
push went from 2.73 to 1.15 ms at 4 workers and from 1.09 to 0.55 at 8 (depth 2 alone
drained and released about once a push); with s = 3 a worker's room is at most 4 steps,
so SSP's records still wait far less than ASP's.

SSP keeps no state across a restart (``save_state`` gives ``{}``): its bound is on the
clocks, which the driver keeps, ``start`` recomputes what it caches (``_seen``), and the
steps' times apart are learnt again from two steps (``depth`` until then).
"""

from __future__ import annotations

from .actions import ALL, NONE, SUBMITTER, Teacher
from .base import BatchSizer, ClusterView, Decision, Policy, Push
from .options import Option
from .pacing import MAX_DEPTH, StepGaps


def ssp_teacher(s: int) -> Teacher:
    """SSP with threshold s in the three-action space, as RLP §3.1 writes it:
    p_s = min p -> A = I; 0 < p_s - min < s -> {W_s}; p_s - min = s -> {}."""
    def teach(push: Push, view: ClusterView) -> int:
        gap = view.clocks[push.worker] - view.min_clock
        return ALL if gap <= 0 else SUBMITTER if gap < s else NONE
    teach.__name__ = f"ssp{s}"
    return teach


class SSP(Policy):
    name = "ssp"
    options = (Option("staleness", int, lo=0, help="the bound s (0: lock-step)"),
               Option("depth", int, lo=1, help="steps granted ahead per worker, at least (within the bound)"),
               Option("queue_s", float, lo=0.0, help="grant each worker the steps it runs in this many seconds "
                                                     f"(within the bound, at most {MAX_DEPTH}, or depth if more); "
                                                     "0: depth"))

    def __init__(self, staleness: int = 3, sizer: BatchSizer | None = None, depth: int = 2,
                 seed: int | None = None, queue_s: float = 0.25):
        super().__init__(sizer, seed)
        if int(staleness) < 0:
            raise ValueError(f"SSP staleness must be >= 0, got {staleness!r}")
        if int(depth) < 1:
            raise ValueError(f"SSP depth must be >= 1, got {depth!r}")
        if not float(queue_s) >= 0:
            raise ValueError(f"SSP queue_s must be >= 0, got {queue_s!r}")
        self.staleness = int(staleness)
        self.depth, self.queue_s = int(depth), float(queue_s)
        self.gaps = StepGaps(self.depth, self.queue_s)
        self._seen = None

    def allowed(self, view: ClusterView) -> int:
        """The highest step number (1-based) any worker may start now."""
        return view.min_clock + self.staleness + 1

    def _top_up(self, view: ClusterView, workers) -> Decision:
        bound = self.allowed(view)
        self._seen = (bound, len(view.members))
        grants = []
        for w in workers:
            target = min(bound, view.clocks[w] + self.gaps.ahead(w))
            grants += self.grants_for([w] * (target - view.granted[w]), view)
        return Decision(tuple(grants))

    def start(self, view: ClusterView) -> Decision:
        return self._top_up(view, sorted(view.members))

    def on_push(self, push: Push, view: ClusterView) -> Decision:
        self.gaps.observe(push)
        if (self.allowed(view), len(view.members)) == self._seen:  # only the pusher's room changed
            workers = [push.worker] if push.worker in view.members else []
        else:
            workers = sorted(view.members)
        return self._top_up(view, workers)

    def patience(self, view: ClusterView) -> float:
        """A quarter of the time the shortest room of a member lasts (its steps to the
        bound or to its queue's end: ``StepGaps.patience``); 0 while one is at the bound."""
        bound = self.allowed(view)
        room = {w: min(self.gaps.ahead(w), bound - view.clocks[w]) for w in view.members}
        return 0.0 if min(room.values(), default=0) <= 0 else self.gaps.patience(room)

    def describe(self) -> dict:
        return {**super().describe(), "staleness": self.staleness, "depth": self.depth, "queue_s": self.queue_s}

    @staticmethod
    def three_action(staleness: int):
        return ssp_teacher(staleness)
