"""A real competing process that takes CPU (and optionally memory) from a worker: the
straggler injection of LB-BSP §5.2 ("a competing process that consumes designated
CPU cycles and memory space", run or sleep periodically).

``CpuBurner(duty=0.5, cpus={0})`` starts ``processes`` child processes pinned to
``cpus`` (os.sched_setaffinity). Each repeats: spin for duty * period, sleep for
(1 - duty) * period (period 0.1 s), reading ``duty`` from a shared value every period,
so it can change while running (``set_duty``; trace-driven mode in ``inject.trace``).
``mem_mb`` > 0 makes each child allocate and touch that many MB first.

Never left behind: ``stop()`` asks the children to end, then terminates and finally
kills them (each wait has a timeout); ``with CpuBurner(...)`` stops on exit even when
the body raises; every burner still running at interpreter exit is stopped (atexit);
and a child whose parent died exits on its own within one period.
Children are started with the "spawn" method: forking a process that runs TensorFlow
threads is unsafe.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import time
import weakref
from typing import Iterable

logger = logging.getLogger(__name__)

_live: "weakref.WeakSet[CpuBurner]" = weakref.WeakSet()


def _burn(duty, period: float, mem_mb: int, cpus, parent: int, ready) -> None:  # runs in the child
    if cpus:
        os.sched_setaffinity(0, cpus)
    hog = None
    if mem_mb > 0:
        hog = bytearray(mem_mb << 20)
        for i in range(0, len(hog), 4096):  # touch every page so it is resident
            hog[i] = 1
    with ready.get_lock():
        ready.value += 1
    x = 0
    while True:
        d = duty.value
        if d < 0 or os.getppid() != parent:  # asked to stop, or orphaned
            return
        start = time.perf_counter()
        busy_until = start + min(d, 1.0) * period
        while time.perf_counter() < busy_until:
            for _ in range(1000):
                x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        left = start + period - time.perf_counter()
        if left > 0:
            time.sleep(left)


def _stop_all() -> None:
    for b in list(_live):
        b.stop()


atexit.register(_stop_all)


class CpuBurner:
    """Competing load on ``cpus``; see the module docstring."""

    def __init__(self, duty: float = 0.5, cpus: Iterable[int] | None = None, *, processes: int = 1,
                 mem_mb: int = 0, period: float = 0.1, start_timeout: float = 60.0):
        if not 0.0 <= float(duty) <= 1.0:
            raise ValueError(f"duty must be in [0, 1] (share of each period spent busy), got {duty!r}")
        if int(processes) < 1 or int(mem_mb) < 0 or not float(period) > 0:
            raise ValueError(f"CpuBurner needs processes >= 1, mem_mb >= 0 and period > 0; got "
                             f"processes={processes}, mem_mb={mem_mb}, period={period}")
        self.cpus = frozenset(int(c) for c in cpus) if cpus is not None else None
        if self.cpus is not None:
            allowed = os.sched_getaffinity(0)
            if not self.cpus or not self.cpus <= allowed:
                raise ValueError(f"cpus {sorted(self.cpus)} are not a non-empty subset of this "
                                 f"process's CPUs {sorted(allowed)}")
        self.processes, self.mem_mb, self.period = int(processes), int(mem_mb), float(period)
        self.start_timeout = float(start_timeout)
        self._ctx = mp.get_context("spawn")
        self._target = float(duty)
        self._duty = self._ctx.RawValue("d", self._target)
        self._procs: list = []

    @property
    def duty(self) -> float:
        return self._target

    def set_duty(self, duty: float) -> None:
        """Change the busy share (clipped to [0, 1]); running children pick it up within
        one period."""
        self._target = min(max(float(duty), 0.0), 1.0)
        if self._procs:
            self._duty.value = self._target

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def start(self) -> "CpuBurner":
        if self._procs:
            raise RuntimeError("CpuBurner already started; stop() it first")
        self._duty.value = self._target
        cpus = sorted(self.cpus) if self.cpus is not None else None
        ready = self._ctx.Value("i", 0)
        for _ in range(self.processes):
            p = self._ctx.Process(target=_burn, daemon=True, name="tfsync-cpu-burner",
                                  args=(self._duty, self.period, self.mem_mb, cpus, os.getpid(), ready))
            p.start()
            self._procs.append(p)
            if cpus:  # pin from here too, so the affinity holds from the start
                try:
                    os.sched_setaffinity(p.pid, cpus)
                except ProcessLookupError:
                    pass
        _live.add(self)
        deadline = time.monotonic() + self.start_timeout
        while ready.value < self.processes:  # started, memory touched: burning from now on
            if time.monotonic() > deadline or any(not p.is_alive() for p in self._procs):
                self.stop()
                raise RuntimeError(f"CPU burner processes did not start within {self.start_timeout:.0f} s")
            time.sleep(0.01)
        logger.info("started %d CPU burner(s) %s at duty %.2f on cpus %s", self.processes, self.pids,
                    self.duty, cpus if cpus else "any")
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """End every child: ask, then terminate, then kill, waiting ``timeout`` s each time."""
        self._duty.value = -1.0
        for p in self._procs:
            p.join(timeout)
            if p.is_alive():
                p.terminate()
                p.join(timeout)
            if p.is_alive():
                p.kill()
                p.join(timeout)
            if p.is_alive():
                logger.error("CPU burner %s survived kill; end it by hand (kill -9 %s)", p.pid, p.pid)
        self._procs = []
        _live.discard(self)

    def __enter__(self) -> "CpuBurner":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def describe(self) -> dict:
        return {"duty": self.duty, "cpus": sorted(self.cpus) if self.cpus else None,
                "processes": self.processes, "mem_mb": self.mem_mb, "period": self.period}
