"""Trace-driven straggler injection: a CPU-utilisation trace of another machine drives a
burner's duty cycle over time (the emulated production cluster of paper 002 §5.3 replays
the Google trace's tasks on each worker; we replay a machine's CPU utilisation).

``TraceDriver(burner, trace, time_scale=60)`` runs a thread that sets the burner's duty
to util(t) / 100 every ``interval`` seconds, t = elapsed * time_scale trace seconds
(wrapping around the trace). Traces come from ``tfsync.sim.speeds.load_cpu_traces``
(the formats in shared/data/traces) or from a two-column CSV ``time,util`` (seconds,
percent) read by ``load_trace_csv``.
"""

from __future__ import annotations

import csv
import logging
import threading
import time

import numpy as np

from ..sim.speeds import CpuTrace, load_cpu_traces
from .burner import CpuBurner

logger = logging.getLogger(__name__)


def load_trace_csv(path: str, index: int = 0) -> CpuTrace:
    """A CSV with header ``time,util`` (s, percent busy), or any format
    ``load_cpu_traces`` reads (then its ``index``-th trace)."""
    with open(path, newline="") as f:
        head = f.readline().strip().lower().replace(" ", "")
    if head == "time,util":
        with open(path, newline="") as f:
            rows = [(float(r["time"]), float(r["util"])) for r in csv.DictReader(
                f, fieldnames=["time", "util"]) if r["time"].strip().lower() != "time"]
        if len(rows) < 2:
            raise ValueError(f"{path}: a trace needs at least two rows of time,util; got {len(rows)}")
        a = np.array(sorted(rows))
        return CpuTrace(path, a[:, 0] - a[0, 0], a[:, 1])
    traces = load_cpu_traces(path)
    if not 0 <= index < len(traces):
        raise ValueError(f"{path} holds {len(traces)} traces; index {index} is out of range")
    return traces[index]


class TraceDriver:
    """Updates ``burner``'s duty from ``trace`` in a background thread."""

    def __init__(self, burner: CpuBurner, trace: CpuTrace, time_scale: float = 1.0,
                 interval: float = 0.1, offset: float = 0.0):
        if not float(time_scale) > 0 or not float(interval) > 0:
            raise ValueError(f"time_scale and interval must be > 0, got {time_scale!r}, {interval!r}")
        self.burner, self.trace = burner, trace
        self.time_scale, self.interval, self.offset = float(time_scale), float(interval), float(offset)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.history: list[tuple[float, float]] = []  # (elapsed s, duty set)

    def duty_at(self, elapsed: float) -> float:
        return min(max(self.trace.at(self.offset + elapsed * self.time_scale) / 100.0, 0.0), 1.0)

    def start(self) -> "TraceDriver":
        if self._thread is not None:
            raise RuntimeError("TraceDriver already started")
        self.burner.set_duty(self.duty_at(0.0))
        if not self.burner.pids:
            self.burner.start()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="tfsync-trace-driver", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            elapsed = time.monotonic() - self._t0
            d = self.duty_at(elapsed)
            self.burner.set_duty(d)
            self.history.append((elapsed, d))

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread and the burner."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("trace driver thread did not stop within %s s (a daemon: it ends "
                               "with the process)", timeout)
        self.burner.stop()

    def __enter__(self) -> "TraceDriver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
