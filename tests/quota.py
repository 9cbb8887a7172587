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


@dataclasses.dataclass
class PeriodQuota(SpeedModel):
    """A container's CPU quota as the kernel enforces it (CFS bandwidth): each worker may use
    ``shares[w]`` x ``period`` seconds of CPU in every period; a step whose CPU
    (``fixed + per_sample x batch``, ``jitter`` as SpeedModel's) does not fit in what is
    left of the period runs on in the next one. Step times are bimodal: a step inside the
    quota takes its CPU time, one across a period's end most of a period more."""
    shares: tuple = (1.0,)
    period: float = 0.1
    _used: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

    def step_time(self, worker, batch_size, now):
        need = super().step_time(worker, batch_size, now)
        quota = self.shares[worker % len(self.shares)] * self.period
        index, used = self._used.get(worker, (-1, 0.0))
        if int(now // self.period) > index:
            index, used = int(now // self.period), 0.0
        t = now
        while True:
            run = min(need, quota - used)
            need, used, t = need - run, used + run, t + run
            if need <= 1e-12:
                break
            index, used = index + 1, 0.0   # the quota spent: the rest waits for the next period
            t = max(t, index * self.period)
        self._used[worker] = (index, used)
        return t - now
