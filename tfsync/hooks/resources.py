"""CPU and memory of a node and of its task processes, sampled by the hook with
``tfsync.base.procstats`` (the engine's sampler). Each sampler keeps its own baselines, so
several concurrent streams each report the use over their own interval.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass

import psutil

from tfsync.base.procstats import CpuBusy, ProcessReader

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


class ResourceSampler:
    """Samples the node and given pids; CPU figures cover the time since the last sample."""

    def __init__(self):
        self._cpu = CpuBusy(percpu=False)
        self._procs = ProcessReader()

    def node(self) -> NodeUsage:
        cpu = self._cpu.sample()[0]
        vm = psutil.virtual_memory()
        return NodeUsage(time.time(), round(cpu, 2), int(vm.total - vm.available), int(vm.total), float(vm.percent))

    def process(self, pid: int, alive: bool = True) -> ProcessUsage:
        """Usage of ``pid`` (CPU 0.0 at its first sample); ``alive=False`` (the owner knows it
        ended) skips psutil."""
        use = self._procs.read(pid) if alive else None
        if use is None:
            self._procs.forget(pid)
            return ProcessUsage(pid, False, 0.0, 0)
        return ProcessUsage(pid, True, round(use.cpu or 0.0, 1), use.rss_bytes)  # 0.1 %, as it always reported

    def forget(self, live_pids: set[int]) -> None:
        """Drop baselines of pids no longer sampled."""
        self._procs.keep(live_pids)
