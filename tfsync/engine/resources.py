"""CPU and memory of each worker's task process, sampled in a background thread: the
driving resources c^k, m^k that NARX predicts worker speed from (LB-BSP §3.2.1, eq. 4).

``ResourceMonitor({worker: pid}, interval=1.0)`` samples every ``interval`` s; ``latest()``
returns ``{worker: reading}``, a reading being a dict:

- ``cpu``: contention, the busy share of the worker's CPUs taken by *other* processes,
  0..100 (100 = every CPU in its affinity set fully used by others). This is the figure
  ``tfsync.policy.lbbsp.resource_reading`` feeds to the predictors, because it is the
  one that moves with a competing process and with nothing else:
  * the process's own CPU % (``proc_cpu``) is mostly an *effect* of its speed: under
    BSP a fast worker waiting at the barrier shows low CPU although nothing slows it,
    so for NARX it repeats the speed history it already has;
  * the busy % of its CPUs (``set_cpu``) saturates at 100 whenever the worker computes,
    so a lone busy worker and one sharing its core with a burner read the same.
  ``cpu = max(0, sum of set CPUs' busy % - proc_cpu) / len(set)``.
- ``proc_cpu``: the task process's CPU %, per core (100 = one core busy; may exceed 100).
- ``set_cpu``: mean busy % of the CPUs in the process's affinity set (all processes).
- ``mem``: the process's resident memory as % of the machine's RAM.
- ``pid``, ``cpus`` (the affinity set), ``time`` (``time.time()`` of the sample).

CPU figures cover the time since the previous sample; a pid's first sample only sets
its baseline, so a worker appears from its second sample on. The monitor keeps its own
baselines (``tfsync.base.procstats``, not psutil's module-wide one), so other samplers in the
process do not disturb it. A pid that has ended (or is a zombie) disappears from
``latest()``; pids can be replaced while running (``set_pids``, after a worker restart).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Iterator, Mapping

from tfsync.base.procstats import CpuBusy, ProcessReader, worker_reading

logger = logging.getLogger(__name__)


class ResourceMonitor:
    """Per-worker CPU / memory readings; see the module docstring."""

    def __init__(self, pids: Mapping[int, int] | None = None, interval: float = 1.0, *,
                 on_sample: Callable[[dict], None] | None = None):
        if not float(interval) > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}; 1.0 is the default")
        self.interval = float(interval)
        self.on_sample = on_sample  # called with latest() after every sample (in the thread)
        self._lock = threading.Lock()  # pids and readings
        self._sample_lock = threading.Lock()  # one sample at a time (baselines)
        self._pids: dict[int, int] = {}
        self._cpus = CpuBusy(percpu=True)  # the CPUs' and the pids' baselines (under _sample_lock)
        self._procs = ProcessReader(affinity=True)
        self._latest: dict[int, dict] = {}
        self._remote: Callable[[], dict[int, dict]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.set_pids(pids or {})

    # -- pids ---------------------------------------------------------------------------
    def set_pids(self, pids: Mapping[int, int]) -> None:
        """Watch ``{worker: pid}`` from now on; workers whose pid changed start afresh."""
        new = {int(w): int(p) for w, p in pids.items()}
        with self._lock:
            for w, pid in self._pids.items():
                if new.get(w) != pid:
                    self._latest.pop(w, None)
            self._pids = new  # baselines of pids no longer watched go at the next sample

    def set_remote(self, source: Callable[[], dict[int, dict]] | None) -> None:
        """Readings of workers on other nodes, which this process cannot sample:
        ``source()`` returns ``{worker: reading}`` in the same form (their hooks measure
        them, ``tfsync.engine.hook_cluster``); a worker sampled here takes precedence."""
        self._remote = source

    # -- sampling -----------------------------------------------------------------------
    def sample(self) -> dict[int, dict]:
        """Take one sample now (the thread calls this; safe from any thread); returns
        ``latest()``."""
        with self._sample_lock:
            busy_pct = self._cpus.sample()
            with self._lock:
                pids = dict(self._pids)
            uses = {w: self._procs.read(pid) for w, pid in pids.items()}
            with self._lock:
                for w, pid in pids.items():
                    if self._pids.get(w) != pid:
                        continue  # replaced by set_pids while sampling
                    if uses[w] is None:  # dead
                        self._latest.pop(w, None)
                    elif uses[w].cpu is not None:  # not the pid's first sample (that sets its baseline)
                        self._latest[w] = self._reading(uses[w], busy_pct)
                self._procs.keep(set(self._pids.values()))
        out = self.latest()
        if self.on_sample is not None:
            self.on_sample(out)
        return out

    @staticmethod
    def _reading(use, busy_pct: list[float]) -> dict:
        cpus = [c for c in use.cpus if c < len(busy_pct)] or list(range(len(busy_pct)))
        return worker_reading(sum(busy_pct[c] for c in cpus), len(cpus), use.cpu, use.mem, use.pid, time.time(),
                              cpus=tuple(cpus))

    def latest(self) -> dict[int, dict]:
        """``{worker: reading}`` of the last sample (copies; dead workers left out), and
        the remote source's readings of the others."""
        remote = self._remote() if self._remote is not None else {}
        with self._lock:
            return {**{w: dict(r) for w, r in remote.items()}, **{w: dict(r) for w, r in self._latest.items()}}

    # -- the thread ---------------------------------------------------------------------
    def start(self) -> "ResourceMonitor":
        """Start sampling in a daemon thread (no-op if running)."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tfsync-resource-monitor", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a sampler must not die silently mid-run
                logger.exception("resource sample failed; the next one is tried in %.1f s", self.interval)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (no-op if not running); the last readings stay readable."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout)
            if t.is_alive():
                logger.warning("resource monitor thread did not stop within %s s (a daemon: it "
                               "ends with the process)", timeout)

    def __enter__(self) -> "ResourceMonitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class LatestReadings(Mapping):
    """``monitor.latest()``, read at the first look (``ClusterView.resources``): the
    engine makes a view for every push, and most policies never look (LB-BSP's predictors
    do). Each read copies every worker's reading, and the remote ones too: 32 us a push
    at 32 workers, a sixth of the coordinator's CPU asked for an ASP push (issue 55)."""

    __slots__ = ("_monitor", "_readings")

    def __init__(self, monitor: "ResourceMonitor"):
        self._monitor, self._readings = monitor, None

    def _read(self) -> dict[int, dict]:
        if self._readings is None:
            self._readings = self._monitor.latest()
        return self._readings

    def __getitem__(self, worker: int) -> dict:
        return self._read()[worker]

    def __iter__(self) -> Iterator[int]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())
