"""Transient stragglers by pausing a task process: the "simpler delay injector".

Within every ``period_s`` the process is stopped (SIGSTOP) for ``1 - 1/slowdown`` of the
period and continued (SIGCONT) for the rest, so whatever it computes takes ``slowdown``
times as long, however many cores the machine has and whoever shares them. Paper 003
§VI-B3 slows a node by emulated network latency (10 ms mild, 30 ms moderate) for
transient episodes of at most 100 s; a paused worker is the same kind of slowdown to
the training: its steps arrive late. Unlike the CPU burner (tfsync.inject.burner) it
needs no core of its own to pin.

``Episode``s run on one schedule whose clock starts at ``start()``. The pid is looked up
on every period through ``pid_of(worker)``, so a worker whose task was restarted (a
restart switch, a recovery) is followed; a pid that is gone is skipped. ``stop()`` (and
the end of every episode) always continues the process.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Episode:
    worker: int
    slowdown: float  # >= 1: steps take this many times as long
    start_s: float  # after the schedule starts
    duration_s: float

    def __post_init__(self):
        if not self.slowdown >= 1.0:
            raise ValueError(f"slowdown {self.slowdown!r}: must be >= 1 (1 = no slowdown)")
        if not (self.start_s >= 0 and self.duration_s > 0):
            raise ValueError(f"episode start {self.start_s!r} s, duration {self.duration_s!r} s: "
                             "need start >= 0 and duration > 0")


def _signal(pid: int | None, sig: int) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class PauseSchedule:
    """Slows workers during their episodes (one thread per episode)."""

    def __init__(self, episodes: Iterable[Episode], pid_of: Callable[[int], int | None],
                 period_s: float = 0.1):
        self.episodes = list(episodes)
        self.pid_of, self.period_s = pid_of, float(period_s)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.t0: float | None = None
        self.log: list[tuple[float, str, int]] = []  # (seconds since start, "begin"|"end", worker)

    def start(self) -> "PauseSchedule":
        if self.t0 is None:
            self.t0 = time.monotonic()
            for i, e in enumerate(self.episodes):
                t = threading.Thread(target=self._run, args=(e,), daemon=True, name=f"tfsync-pause-{i}")
                t.start()
                self._threads.append(t)
        return self

    def _run(self, e: Episode) -> None:
        if self._stop.wait(max(0.0, self.t0 + e.start_s - time.monotonic())):
            return
        self.log.append((time.monotonic() - self.t0, "begin", e.worker))
        logger.info("straggler: worker %d slowed %.1fx for %.0f s", e.worker, e.slowdown, e.duration_s)
        end = self.t0 + e.start_s + e.duration_s
        paused = self.period_s * (1.0 - 1.0 / e.slowdown)
        pid = None
        try:
            while not self._stop.is_set() and time.monotonic() < end:
                pid = self.pid_of(e.worker)
                if paused > 0:
                    _signal(pid, signal.SIGSTOP)
                    self._stop.wait(paused)
                    _signal(pid, signal.SIGCONT)
                self._stop.wait(self.period_s - paused)
        finally:
            _signal(pid, signal.SIGCONT)
            self.log.append((time.monotonic() - self.t0, "end", e.worker))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)

    def __enter__(self) -> "PauseSchedule":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
