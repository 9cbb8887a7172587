"""Trace-driven straggler injection: a CPU-utilisation trace of another machine drives a
burner's duty cycle over time (the emulated production cluster of LB-BSP §5.3 replays
the Google trace's tasks on each worker; we replay a machine's CPU utilisation).

``TraceDriver(burner, trace, time_scale=60)`` runs a thread that sets the burner's duty
to util(t) / 100 every ``interval`` seconds, t = offset + elapsed * time_scale trace
seconds. Past the end of a trace loaded with ``wrap=True`` it loops; past the end of
one without, it logs one warning and holds the last duty it set. Traces come from
``load_trace_csv``: every format of ``tfsync.base.traces`` (shared/data/traces, or a
two-column CSV ``time,util`` in seconds and percent), with its strict options.
"""

from __future__ import annotations

import logging
import threading
import time

from ..base.traces import CpuTrace, TraceError, TraceRangeError, load_cpu_traces
from .burner import CpuBurner

logger = logging.getLogger(__name__)


def load_trace_csv(path: str, index: int = 0, **options) -> CpuTrace:
    """The ``index``-th trace of ``path``; ``options`` as ``load_cpu_traces``'
    (``format``, ``step``, ``gaps``, ``max_gap``, ``wrap``)."""
    traces = load_cpu_traces(path, **options)
    if not 0 <= index < len(traces):
        raise TraceError(path, None, f"holds {len(traces)} trace(s); index {index} is out of range")
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
        """The duty at ``elapsed`` real seconds; TraceRangeError past a non-looping trace."""
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
            try:
                d = self.duty_at(elapsed)
            except TraceRangeError as e:
                logger.warning("%s; holding duty %.2f (load the trace with wrap=True to loop it)",
                               e, self.burner.duty)
                return
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
