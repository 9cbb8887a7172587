"""ASP: every push is applied on arrival and its worker runs on at once (RLP §3.1:
A = {W_s}).

Steps are granted ahead per worker, at least ``depth`` (default 8: one running, seven
queued on the PS), so a worker never waits for the coordinator's answer between its steps: the
coordinator sees a push and its grant reaches the PS two round trips or more after the
push lands (more while the coordinator shares its CPU), while an ASP step is one round
trip (one remote call: tfsync.engine.step). On the testbed at 10 ms a node, 4 workers,
ASP ran 52.3 worker steps/s at depth 4 (2.4 round trips a step) and 59.0 at 8 (1.0); at
30 ms 23.0 and 36.8 (``experiments/bench_control_path.py``). The engine grants no step a
phase has no work for (``Ledger.within``), so a deeper queue does not make a phase
overshoot its workload.

On a fast model a worker granted ``depth`` steps needs a grant every few milliseconds,
and every drain of records and every release of tokens is a remote call that costs the
coordinator about a millisecond of CPU (TensorFlow's runtime; tfsync.engine.links). So a
worker is granted as many steps as it runs in ``queue_s`` seconds (tfsync.policy.pacing):
4 workers of the tiny model of ``experiments/bench_coordinator_scale.py`` on loopback,
``queue_s`` 0.25 against depth 8, took the coordinator's CPU per push from 0.79 to 0.40
ms. A drain (a switch, a checkpoint, the end) then waits for at most ``queue_s`` of each
worker's steps.

Its records can wait (``patience``): a worker's queue lasts its steps ahead, so the engine
may take the pushes in batches every quarter of that time, which saves the coordinator
the CPU of a drain per push (tfsync.engine.links).
"""

from __future__ import annotations

from .actions import SUBMITTER
from .base import BatchSizer, ClusterView, Decision, Policy, Push
from .options import Option
from .pacing import MAX_DEPTH, StepGaps


def asp_teacher(push: Push, view: ClusterView) -> int:
    """ASP in the three-action space (RLP §3.1): A = {W_s}."""
    return SUBMITTER


class ASP(Policy):
    name = "asp"
    options = (Option("depth", int, lo=1, help="steps granted ahead per worker, at least"),
               Option("queue_s", float, lo=0.0, help="grant each worker the steps it runs in this many seconds "
                                                     f"(at most {MAX_DEPTH}, or depth if more); 0: depth"))

    def __init__(self, sizer: BatchSizer | None = None, depth: int = 8, queue_s: float = 0.25,
                 seed: int | None = None):
        super().__init__(sizer, seed)
        if int(depth) < 1:
            raise ValueError(f"ASP depth must be >= 1, got {depth!r}")
        if not float(queue_s) >= 0:
            raise ValueError(f"ASP queue_s must be >= 0, got {queue_s!r}")
        self.depth, self.queue_s = int(depth), float(queue_s)
        self.gaps = StepGaps(self.depth, self.queue_s)

    def ahead(self, worker: int) -> int:
        """The steps granted ahead of ``worker`` (``StepGaps.ahead``)."""
        return self.gaps.ahead(worker)

    def start(self, view: ClusterView) -> Decision:
        grants = []
        for w in sorted(view.members):
            grants += self.grants_for([w] * (self.ahead(w) - view.outstanding(w)), view)
        return Decision(tuple(grants))

    def on_push(self, push: Push, view: ClusterView) -> Decision:
        self.gaps.observe(push)
        w = push.worker
        if w not in view.members:
            return Decision()
        return Decision(self.grants_for([w] * (self.ahead(w) - view.outstanding(w)), view))

    def patience(self, view: ClusterView) -> float:
        """A quarter of the time the shortest queue of a member lasts (``StepGaps.patience``)."""
        return self.gaps.patience({w: self.ahead(w) for w in view.members})

    def describe(self) -> dict:
        return {**super().describe(), "depth": self.depth, "queue_s": self.queue_s}

    @staticmethod
    def three_action():
        return asp_teacher
