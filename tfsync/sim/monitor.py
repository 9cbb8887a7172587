"""Resource readings in ``ClusterView.resources``: what the engine and the simulator give
policies, in one place.

Both give ``{worker: reading}``, a reading a dict whose ``cpu`` is *contention*: the
percentage (0..100) of the worker's CPUs that other processes keep busy, averaged over
the monitor's last sampling interval. LB-BSP feeds it (``resource_reading`` in
tfsync.policy.lbbsp) to its predictors with the speed of the step that just ended:
NARX's c^k of LB-BSP eq. 4, the resources the next step *starts* with. It is the
last reading a monitor has at push time, never the load the next step will run under.

Engine (``tfsync.engine.resources.ResourceMonitor``, read by ``Loop.view``): a thread
samples every ``interval`` s (1.0 in the engine); a sample covers the time since the
previous one; a view shows the latest sample, so at push time the reading is 0 to 1
interval old and describes the load while the step ran. Keys: ``cpu``, ``mem`` (RSS %
of RAM), ``proc_cpu``, ``set_cpu``, ``pid``, ``cpus``, ``time`` (``time.time()``). A
worker appears from its second sample (the first sets its baseline).

Simulator (:class:`SimMonitor`, read by ``Simulator.view``): the same figure from the
speed model, ``cpu = 100 * (1 - share)`` with ``share`` the CPU share the worker's traced
machine leaves it (``SpeedModel.share``: ``max(1 - util / 100, min_share)``); 0 without
traces (straggler sleeps and jitter take no CPU from the worker: a monitor sees no
contention there either). With ``interval`` I > 0 (default 1.0 simulated s, the
engine's) samples are taken at I, 2I, ...; the one at kI is the mean contention over
[(k-1)I, kI] (``SpeedModel.contention``); a view at time t shows the last sample at or
before t, none before I. With ``interval=0`` a view shows the contention at its own
time: at a push, the trace's share at push time. Keys: ``cpu`` and ``time`` (the
sample's simulated time). No ``mem``: the simulator models no memory, and predictors
treat a missing reading as the last one (0 before any).
"""

from __future__ import annotations

import math
from typing import Iterator, Mapping

from .speeds import SpeedModel


class SimMonitor:
    """Readings of ``n`` simulated workers from ``speeds``; ``at(now)`` gives a view's."""

    def __init__(self, speeds: SpeedModel, n: int, interval: float = 1.0):
        if not float(interval) >= 0 or not math.isfinite(float(interval)):
            raise ValueError(f"monitor_interval must be >= 0 simulated seconds (0: read at the view's "
                             f"time), got {interval!r}")
        self.speeds, self.n, self.interval = speeds, int(n), float(interval)

    def at(self, now: float) -> "Readings":
        """The readings a view at simulated time ``now`` shows."""
        if self.interval == 0:
            return Readings(self, now, None)
        k = math.floor(now / self.interval + 1e-9)  # samples taken so far
        return Readings(self, k * self.interval, self.interval) if k >= 1 else Readings(self, None, None)


class Readings(Mapping):
    """``{worker: {"cpu": ..., "time": ...}}``, computed when a worker is looked up (a view
    of 1000 workers costs nothing until a policy reads it)."""

    def __init__(self, monitor: SimMonitor, time: float | None, interval: float | None):
        self._monitor, self._time, self._interval = monitor, time, interval
        self._cache: dict[int, dict] = {}

    def __getitem__(self, worker: int) -> dict:
        r = self._cache.get(worker)
        if r is None:
            if self._time is None or not (isinstance(worker, int) and 0 <= worker < self._monitor.n):
                raise KeyError(worker)
            t, i, speeds = self._time, self._interval, self._monitor.speeds
            cpu = speeds.contention(worker, t) if i is None else speeds.contention(worker, t - i, t)
            r = self._cache[worker] = {"cpu": cpu, "time": t}
        return dict(r)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self._monitor.n) if self._time is not None else ())

    def __len__(self) -> int:
        return self._monitor.n if self._time is not None else 0
