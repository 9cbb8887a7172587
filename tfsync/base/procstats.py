"""CPU and memory use of this machine and of processes (psutil), and the worker reading
policies see as ``view.resources``. One sampler for the engine's ``ResourceMonitor``
(workers on this machine) and the node hook's ``ResourceSampler`` (its tasks, read by a
coordinator elsewhere), so the two report the same figures.

Each ``CpuBusy`` and ``ProcessReader`` keeps its own baselines (not psutil's module-wide
one), so several readers in one process each see the use over their own interval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil


def busy_total(times) -> tuple[float, float]:
    """(busy, total) seconds of CPU times (idle and iowait count as not busy; steal counts
    as busy: it is contention too). Linux counts guest time in user time already."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total


class CpuBusy:
    """Busy % (0..100) of each CPU (``percpu``) or of all together, since the previous ``sample()``."""

    def __init__(self, percpu: bool = True):
        self.percpu = percpu
        self._base = self._times()

    def _times(self) -> list[tuple[float, float]]:
        times = psutil.cpu_times(percpu=self.percpu)
        return [busy_total(t) for t in (times if self.percpu else [times])]

    def sample(self) -> list[float]:
        now = self._times()
        busy = [min(max(100.0 * (b1 - b0) / (t1 - t0), 0.0), 100.0) if t1 > t0 else 0.0
                for (b0, t0), (b1, t1) in zip(self._base, now)]
        self._base = now
        return busy


@dataclass(frozen=True)
class ProcessUse:
    pid: int
    cpu: float | None           # % of one core since this reader's previous reading (may exceed
                                # 100); None at the first reading, which only sets the baseline
    rss_bytes: int
    mem: float                  # resident memory, % of the machine's RAM
    cpus: tuple[int, ...] = ()  # the CPU affinity set (read by a ProcessReader(affinity=True))


class ProcessReader:
    """``read(pid)``: a process's use since the previous read of it; None once it has ended,
    is a zombie, or cannot be read (its baseline is then forgotten)."""

    def __init__(self, affinity: bool = False):
        self.affinity = affinity
        self._procs: dict[int, psutil.Process] = {}
        self._base: dict[int, tuple[float, float]] = {}  # pid -> (cpu seconds, monotonic time)
        self._ram = psutil.virtual_memory().total

    def read(self, pid: int) -> ProcessUse | None:
        try:
            proc = self._procs.get(pid)
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
            with proc.oneshot():
                if proc.status() == psutil.STATUS_ZOMBIE:
                    raise psutil.NoSuchProcess(pid)
                t = proc.cpu_times()
                now = time.monotonic()
                rss = proc.memory_info().rss
                cpus = tuple(sorted(proc.cpu_affinity())) if self.affinity else ()
        except (psutil.Error, OSError):  # gone, a zombie, or not ours to read
            self.forget(pid)
            return None
        used = t.user + t.system
        base = self._base.get(pid)
        self._base[pid] = (used, now)
        cpu = max(100.0 * (used - base[0]) / (now - base[1]), 0.0) if base and now > base[1] else None
        return ProcessUse(pid, cpu, int(rss), rss / self._ram * 100, cpus)  # as psutil's memory_percent

    def forget(self, pid: int) -> None:
        self._procs.pop(pid, None)
        self._base.pop(pid, None)

    def keep(self, pids) -> None:
        """Forget the baselines of every pid not in ``pids``."""
        for pid in set(self._procs) | set(self._base):
            if pid not in pids:
                self.forget(pid)


def worker_reading(busy_sum: float, n_cpus: int, proc_cpu: float, mem: float, pid: int, at: float,
                   **extra) -> dict:
    """A worker's reading as policies see it (``tfsync.engine.resources`` documents the
    fields) from the busy % of its ``n_cpus`` CPUs summed, its process's CPU % of one core
    and memory %, at the Unix time ``at``. ``cpu``, the contention LB-BSP's predictors take, is the share of those
    CPUs other processes keep busy: max(0, busy_sum - proc_cpu) / n_cpus, at most 100."""
    return {"cpu": round(min(max(busy_sum - proc_cpu, 0.0) / n_cpus, 100.0), 2), "mem": round(float(mem), 3),
            "proc_cpu": round(proc_cpu, 2), "set_cpu": round(busy_sum / n_cpus, 2), "pid": pid, **extra,
            "time": at}
