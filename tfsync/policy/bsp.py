"""BSP: every member computes on the same weights; the update is the batch-size-weighted
mean of their gradients (LB-BSP, eq. 8), applied when the last one has pushed.

In the unified framework (RLP, §3.1): A = {} while |I| < k, A = I once |I| = k.
"""

from __future__ import annotations

from .actions import ALL, NONE
from .base import NOTHING, BatchSizer, ClusterView, Decision, Policy, Push, PushMode
from .sizing import FixedSizer


def bsp_teacher(push: Push, view: ClusterView) -> int:
    """BSP in the three-action space (RLP §3.1): A = {} while |I| < k, A = I once
    every worker is idle."""
    return ALL if len(view.idle) == len(view.members) else NONE


class BSP(Policy):
    name = "bsp"
    mode = PushMode.AGGREGATE
    aggregating = True

    @staticmethod
    def three_action():
        return bsp_teacher

    def on_push(self, push: Push, view: ClusterView) -> Decision:
        if view.in_flight:
            return NOTHING
        return Decision(self.grants_for(sorted(view.members), view), barrier=True)

    def steady_round(self, view: ClusterView) -> Decision | None:
        """Every member again, with the same sizes (LB-BSP, a subclass, sizes per round)."""
        if type(self) is not BSP or type(self.sizer) not in (BatchSizer, FixedSizer):
            return None
        return Decision(self.grants_for(sorted(view.members), view), barrier=True)

    def start(self, view: ClusterView) -> Decision:
        # A round may be open (resume after a switch from a policy that aggregates).
        return Decision(self.grants_for(sorted(view.idle), view), barrier=view.pending > 0)
