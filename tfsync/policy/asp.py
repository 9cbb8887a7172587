"""ASP: every push is applied on arrival and its worker runs on at once (paper 004 §3.1:
A = {W_s}).

``depth`` steps are granted ahead per worker (default 8: one running, seven queued on
the PS), so a worker never waits for the coordinator's answer between its steps: the
coordinator sees a push and its grant reaches the PS two round trips or more after the
push lands (more while the coordinator shares its CPU), while an ASP step is one round
trip (one remote call: tfsync.engine.step). On the testbed at 10 ms a node, 4 workers,
ASP ran 52.3 worker steps/s at depth 4 (2.4 round trips a step) and 59.0 at 8 (1.0); at
30 ms 23.0 and 36.8 (``experiments/bench_control_path.py``). The engine grants no step a
phase has no work for (``Ledger.within``), so a deeper queue does not make a phase
overshoot its workload.

Its records can wait (``patience``): a worker's queue lasts ``depth`` steps, so the engine
may take the pushes in batches every quarter of that time (at most ``MAX_PATIENCE_S``),
which on a model of a few milliseconds a step saves the coordinator the CPU of a drain
per push (tfsync.engine.links).
"""

from __future__ import annotations

import statistics

from .actions import SUBMITTER
from .base import BatchSizer, ClusterView, Decision, Policy, Push
from .options import Option


MAX_PATIENCE_S = 0.02


def asp_teacher(push: Push, view: ClusterView) -> int:
    """ASP in the three-action space (paper 004 §3.1): A = {W_s}."""
    return SUBMITTER


class ASP(Policy):
    name = "asp"
    options = (Option("depth", int, lo=1, help="steps granted ahead per worker"),)

    def __init__(self, sizer: BatchSizer | None = None, depth: int = 8, seed: int | None = None):
        super().__init__(sizer, seed)
        if int(depth) < 1:
            raise ValueError(f"ASP depth must be >= 1, got {depth!r}")
        self.depth = int(depth)

    def start(self, view: ClusterView) -> Decision:
        grants = []
        for w in sorted(view.members):
            grants += self.grants_for([w] * (self.depth - view.outstanding(w)), view)
        return Decision(tuple(grants))

    def on_push(self, push: Push, view: ClusterView) -> Decision:
        if push.worker not in view.members:
            return Decision()
        return Decision(self.grants_for([push.worker] * (self.depth - view.outstanding(push.worker)), view))

    def patience(self, view: ClusterView) -> float:
        """A quarter of the time a worker's queue lasts: ``depth`` of its recent steps
        (the median time between the starts of its successive steps), at most
        ``MAX_PATIENCE_S``; 0 until a worker has run two steps."""
        last: dict[int, float] = {}
        gaps = []
        for p in list(view.history)[-64:]:
            if p.worker in last and p.start > last[p.worker]:
                gaps.append(p.start - last[p.worker])
            last[p.worker] = p.start
        return min(MAX_PATIENCE_S, self.depth * statistics.median(gaps) / 4) if gaps else 0.0

    def describe(self) -> dict:
        return {**super().describe(), "depth": self.depth}

    @staticmethod
    def three_action():
        return asp_teacher
