"""CPU and memory of a node and of its task processes (psutil), sampled by the hook.

Each sampler keeps its own CPU baselines (not psutil's module-wide one), so several
concurrent streams each report the CPU use over their own interval.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass

import psutil

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeUsage:
    time: float
    cpu_percent: float          # all cores, 0..100, since the previous sample
    memory_used_bytes: int
    memory_total_bytes: int
    memory_percent: float


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    alive: bool
    cpu_percent: float          # of one core since the previous sample; may exceed 100
    rss_bytes: int


def node_name() -> str:
    return socket.gethostname()


def _busy_total(times) -> tuple[float, float]:
    total = sum(times)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class ResourceSampler:
    """Samples the node and given pids; CPU figures cover the time since the last sample."""

    def __init__(self):
        self._cpu = _busy_total(psutil.cpu_times())
        self._procs: dict[int, psutil.Process] = {}

    def node(self) -> NodeUsage:
        busy, total = _busy_total(psutil.cpu_times())
        d_busy, d_total = busy - self._cpu[0], total - self._cpu[1]
        self._cpu = (busy, total)
        cpu = 100.0 * d_busy / d_total if d_total > 0 else 0.0
        vm = psutil.virtual_memory()
        return NodeUsage(time.time(), round(min(max(cpu, 0.0), 100.0), 2), int(vm.total - vm.available),
                         int(vm.total), float(vm.percent))

    def process(self, pid: int, alive: bool = True) -> ProcessUsage:
        """Usage of ``pid``; ``alive=False`` (the owner knows it ended) skips psutil."""
        if not alive:
            self._procs.pop(pid, None)
            return ProcessUsage(pid, False, 0.0, 0)
        try:
            proc = self._procs.get(pid)
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
                proc.cpu_percent()  # baseline: psutil's first reading is always 0.0
            with proc.oneshot():
                if proc.status() == psutil.STATUS_ZOMBIE:
                    raise psutil.NoSuchProcess(pid)
                return ProcessUsage(pid, True, round(proc.cpu_percent(), 2), int(proc.memory_info().rss))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._procs.pop(pid, None)
            return ProcessUsage(pid, False, 0.0, 0)

    def forget(self, live_pids: set[int]) -> None:
        """Drop baselines of pids no longer sampled."""
        for pid in set(self._procs) - live_pids:
            del self._procs[pid]
