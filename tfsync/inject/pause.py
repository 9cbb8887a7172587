"""Transient stragglers by pausing a task process: the "simpler delay injector".

Within every ``period_s`` the process is stopped (SIGSTOP) for ``1 - 1/slowdown`` of the
period and continued (SIGCONT) for the rest, so whatever it computes takes ``slowdown``
times as long, however many cores the machine has and whoever shares them. On a loaded
machine this process's own wake-ups come late; each stop is therefore sized to bring
the time stopped since the episode began to ``1 - 1/slowdown`` of it, so lateness in one
period is made up in the next. Sync-Switch
§VI-B3 slows a node by emulated network latency (10 ms mild, 30 ms moderate) for
transient episodes of at most 100 s; a paused worker is the same kind of slowdown to
the training: its steps arrive late. Unlike the CPU burner (tfsync.inject.burner) it
needs no core of its own to pin.

The stop/continue loop runs in a child process (``python -m tfsync.inject.pause``), not
in a thread of the coordinator: a coordinator thread that makes a TensorFlow call which
waits on the stopped worker can hold the GIL, and a thread that needs the GIL to send
SIGCONT then never does (seen: the run hung with the worker stopped for good). The child
imports no TensorFlow. It reads a JSON spec on its first stdin line and pid updates on
the next ones (``{"pids": {worker: pid}}``: the parent follows restarted tasks through
``pid_of``); it continues every process it paused and exits when stdin closes (the
parent is gone), on ``{"stop": true}`` or on SIGTERM. Each episode's begin and end are
written to stdout as JSON lines and collected in ``PauseSchedule.log``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
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


class PauseSchedule:
    """Slows workers during their episodes, from a child process."""

    def __init__(self, episodes: Iterable[Episode], pid_of: Callable[[int], int | None],
                 period_s: float = 0.1, poll_s: float = 0.5):
        self.episodes = list(episodes)
        self.pid_of, self.period_s, self.poll_s = pid_of, float(period_s), float(poll_s)
        self.log: list[tuple[float, str, int]] = []  # (seconds since start, "begin"|"end", worker)
        self._proc: subprocess.Popen | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _pids(self) -> dict[int, int | None]:
        return {e.worker: self.pid_of(e.worker) for e in self.episodes}

    def start(self) -> "PauseSchedule":
        if self._proc is not None:
            return self
        spec = {"episodes": [asdict(e) for e in self.episodes], "period_s": self.period_s, "pids": self._pids()}
        self._proc = subprocess.Popen([sys.executable, "-m", "tfsync.inject.pause"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, bufsize=1)
        self._send(spec)
        for target, name in ((self._follow, "tfsync-pause-pids"), (self._read, "tfsync-pause-log")):
            t = threading.Thread(target=target, daemon=True, name=name)
            t.start()
            self._threads.append(t)
        return self

    def _send(self, message: dict) -> None:
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the child is gone

    def _follow(self) -> None:
        last = None
        while not self._stop.wait(self.poll_s):
            pids = self._pids()
            if pids != last:
                self._send({"pids": pids})
                last = pids

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                t, what, worker = json.loads(line)
            except ValueError:
                continue
            self.log.append((t, what, worker))

    def entries(self) -> list[dict]:
        """The log as records, each begin and end with its episode's ``slowdown`` (a
        worker's episodes begin in the order of their start times)."""
        queue: dict[int, list[Episode]] = {}
        for e in sorted(self.episodes, key=lambda e: e.start_s):
            queue.setdefault(e.worker, []).append(e)
        current: dict[int, Episode | None] = {}
        out = []
        for t, what, w in sorted(self.log):
            if what == "begin":
                current[w] = queue[w].pop(0) if queue.get(w) else None
            e = current.get(w)
            out.append({"time": t, "what": what, "worker": w, "slowdown": e.slowdown if e else None})
        return out

    def stop(self, timeout: float = 5.0) -> None:
        if self._proc is None:
            return
        self._stop.set()
        self._send({"stop": True})
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for t in self._threads:
            t.join(timeout=1.0)

    def __enter__(self) -> "PauseSchedule":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- the child process ------------------------------------------------------------------

def _signal(pid: int | None, sig: int) -> None:
    if pid:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _child() -> int:
    spec = json.loads(sys.stdin.readline() or "null")
    if not spec:
        return 0
    t0, stop = time.monotonic(), threading.Event()
    pids = {int(w): p for w, p in spec["pids"].items()}
    period = float(spec["period_s"])
    out_lock = threading.Lock()

    def terminate(*_):
        stop.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)

    def say(what: str, worker: int) -> None:
        with out_lock:
            print(json.dumps([round(time.monotonic() - t0, 3), what, worker]), flush=True)

    def episode(e: Episode) -> None:
        if stop.wait(max(0.0, t0 + e.start_s - time.monotonic())):
            return
        say("begin", e.worker)
        end, share, pid = t0 + e.start_s + e.duration_s, 1.0 - 1.0 / e.slowdown, None
        begin, stopped = time.monotonic(), 0.0
        try:
            while not stop.is_set() and time.monotonic() < end:
                pid = pids.get(e.worker)
                cycle = time.monotonic()
                want = share * (cycle + period - begin) - stopped  # catch up on late wake-ups
                if want > 0:
                    t = time.monotonic()
                    _signal(pid, signal.SIGSTOP)
                    stop.wait(min(want, 2 * period))
                    _signal(pid, signal.SIGCONT)
                    stopped += time.monotonic() - t
                stop.wait(max(0.0, cycle + period - time.monotonic()))
        finally:
            _signal(pid, signal.SIGCONT)
            say("end", e.worker)

    threads = [threading.Thread(target=episode, args=(Episode(**e),), daemon=True) for e in spec["episodes"]]
    for t in threads:
        t.start()
    try:
        for line in sys.stdin:  # pid updates until "stop" or EOF (the parent is gone)
            message = json.loads(line)
            if message.get("stop"):
                break
            pids.update({int(w): p for w, p in (message.get("pids") or {}).items()})
    except KeyboardInterrupt:
        pass
    stop.set()
    for t in threads:
        t.join(timeout=2.0)
    return 0


if __name__ == "__main__":
    sys.exit(_child())
