"""A simulated worker under a container's CPU quota (LB-BSP's guard and auto's tests)."""

import dataclasses

from tfsync.sim import SpeedModel


@dataclasses.dataclass
class QuotaSpeeds(SpeedModel):
    """A container's CPU quota, simply: a step over ``cap`` samples spends the period's
    quota and waits ``stall`` s for the next (a cliff that no line through the sizes seen
    predicts)."""
    cap: int = 64
    stall: float = 0.06

    def step_time(self, worker, batch_size, now):
        return super().step_time(worker, batch_size, now) + (self.stall if batch_size > self.cap else 0.0)
