"""Online training of the learned predictors in background threads (LB-BSP §4.2).

The paper trains each worker's NARX model in separate low-priority threads, taking the
workers in turn, with at most half the CPU cores training at once. ``os.nice`` inside a
thread would lower the whole process (the coordinator included), so priority here comes
from the pool size instead: at most ``max(1, cores // 2)`` training threads, each taking
the next waiting predictor first-in first-out (a predictor is queued at most once, and
one that asks again while training goes to the back: round-robin), with TF's own
thread pools kept at ``tf_threads`` where TF is not initialised yet.

``threads=0`` trains inline in the caller's thread (deterministic; tests and offline
evaluation). Every wait has a timeout. ``default_trainer()`` is the process-wide one,
unless a ``training_with(trainer)`` block (the simulator's, tfsync.sim) names another
for its own thread.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import os
import threading
import time

logger = logging.getLogger(__name__)


class NarxTrainer:
    """Trains learned predictors (NARX, SimpleRNN, LSTM) when they ask (``request``)."""

    def __init__(self, threads: int | None = None, *, tf_threads: int | None = 1, epochs: int = 200,
                 batch_size: int = 32, min_delta: float = 1e-4, patience: int = 4,
                 min_epochs: int = 30, learning_rate: float = 0.01):
        cores = os.cpu_count() or 1
        self.threads = max(1, cores // 2) if threads is None else int(threads)
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0 trains inline), got {threads!r}")
        if int(epochs) < 1 or int(batch_size) < 1 or int(patience) < 1:
            raise ValueError(f"epochs, batch_size and patience must be >= 1, got "
                             f"{epochs!r}, {batch_size!r}, {patience!r}")
        self.tf_threads = tf_threads
        self.fit_options = dict(epochs=int(epochs), batch_size=int(batch_size),
                                min_delta=float(min_delta), patience=int(patience),
                                min_epochs=int(min_epochs))
        self.learning_rate = float(learning_rate)
        self.fits = self.failures = 0
        self.seconds = 0.0
        self._queue: collections.deque = collections.deque()
        self._queued: set[int] = set()
        self._again: dict[int, object] = {}  # asked again while training
        self._running: set[int] = set()
        self._cond = threading.Condition()
        self._workers: list[threading.Thread] = []
        self._closed = False

    # -- requests -----------------------------------------------------------------------
    def request(self, predictor) -> None:
        """Train ``predictor`` (its ``_train(trainer)``) soon; inline when threads == 0."""
        if self.threads == 0:
            self._run(predictor)
            return
        key = id(predictor)
        with self._cond:
            if self._closed:
                raise RuntimeError("NarxTrainer is closed; create a new one to train again")
            if key in self._running:
                self._again[key] = predictor
            elif key not in self._queued:
                self._queued.add(key)
                self._queue.append(predictor)
            self._start_threads()
            self._cond.notify()

    def _start_threads(self) -> None:
        while len(self._workers) < self.threads:
            t = threading.Thread(target=self._loop, name=f"tfsync-predict-train-{len(self._workers)}",
                                 daemon=True)
            self._workers.append(t)
            t.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                predictor = self._queue.popleft()
                key = id(predictor)
                self._queued.discard(key)
                self._running.add(key)
            try:
                self._run(predictor)
            finally:
                with self._cond:
                    self._running.discard(key)
                    if key in self._again:  # asked again while training: back of the line
                        self._queued.add(key)
                        self._queue.append(self._again.pop(key))
                    self._cond.notify_all()

    def _run(self, predictor) -> None:
        t0 = time.perf_counter()
        try:
            predictor._train(self)
            self.fits += 1
        except Exception as exc:  # noqa: BLE001 - a failed fit keeps the old weights
            self.failures += 1
            logger.warning("training the %s predictor failed (%s: %s); it keeps its previous "
                           "weights", getattr(predictor, "name", "?"), type(exc).__name__, exc)
        finally:
            self.seconds += time.perf_counter() - t0

    # -- waiting and closing --------------------------------------------------------------
    def wait(self, timeout: float = 60.0) -> None:
        """Block until nothing is queued or training; TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"predictor training still busy after {timeout} s "
                                       f"({len(self._queue)} queued, {len(self._running)} running); "
                                       "raise the timeout or lower epochs")
                self._cond.wait(left)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the threads after their current fit (queued requests are dropped)."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._queued.clear()
            self._cond.notify_all()
        for t in self._workers:
            t.join(timeout)
            if t.is_alive():
                logger.warning("training thread %s did not stop within %s s; it is a daemon and "
                               "ends with the process", t.name, timeout)

    def stats(self) -> dict:
        return {"fits": self.fits, "failures": self.failures, "seconds": self.seconds,
                "threads": self.threads}


_default: NarxTrainer | None = None
_default_lock = threading.Lock()
_scoped: contextvars.ContextVar = contextvars.ContextVar("tfsync_predict_trainer", default=None)


@contextlib.contextmanager
def training_with(trainer: NarxTrainer):
    """Inside this block, in this thread, predictors without a trainer of their own use
    ``trainer`` instead of the process-wide one (the simulator trains inline this way)."""
    token = _scoped.set(trainer)
    try:
        yield trainer
    finally:
        _scoped.reset(token)


def default_trainer() -> NarxTrainer:
    """The trainer learned predictors use unless given their own: the one of the
    enclosing ``training_with`` block, else the process-wide one."""
    scoped = _scoped.get()
    if scoped is not None:
        return scoped
    global _default
    with _default_lock:
        if _default is None:
            _default = NarxTrainer()
        return _default
