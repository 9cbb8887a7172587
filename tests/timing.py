"""CPU shares measured against what a process could get, so that timing tests hold on a
loaded machine: a process's *runnable* time (on a CPU, or ready and waiting in the run
queue; /proc/PID/task/*/schedstat) does not shrink when other work competes for the CPU,
while its CPU time does. Sleeping or stopped (SIGSTOP) time counts in neither."""

import glob
import time


def runnable_seconds(pid: int) -> float:
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as f:
                on_cpu, waiting, _ = f.read().split()
        except (OSError, ValueError):  # a thread that just ended
            continue
        total += int(on_cpu) + int(waiting)
    return total / 1e9


def runnable_share(pid: int, seconds: float = 1.0) -> float:
    """Percent of ``seconds`` that ``pid`` was runnable (100: it never slept nor stopped)."""
    r0, t0 = runnable_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (runnable_seconds(pid) - r0) / (time.monotonic() - t0)
