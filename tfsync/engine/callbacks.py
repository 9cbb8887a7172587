"""Observers of a run, called on the engine's loop: the progress display, the manager's
link (a Controller's records and events), the background evaluator, and any the user
passes (``Engine(callbacks=[...])``).

As tf_keras's ``CallbackList``, the list times each observer: the loop waits while one
runs, so one that takes more than half the time between two pushes, on average over at
least ``min_calls`` calls, is named in one warning (once per observer and method). They
see a push after the policy's grants for it went out.
"""

from __future__ import annotations

import collections
import logging
import time

logger = logging.getLogger(__name__)


class Callback:
    """Override what you need; every method runs on the engine's loop, so keep it cheap."""

    def on_train_begin(self, engine) -> None:
        """Before the first generation's tasks start."""

    def on_push(self, engine, push, record: dict) -> None:
        """After each counted push: ``record`` is its metrics.jsonl line."""

    def on_event(self, engine, kind: str, fields: dict) -> None:
        """Something happened to the run (a switch, a checkpoint, a lost worker, ...)."""


class CallbackList:
    def __init__(self, callbacks=(), slow_share: float = 0.5, min_calls: int = 20):
        self.callbacks = list(callbacks)
        self.slow_share, self.min_calls = slow_share, min_calls
        self.spent: dict = collections.defaultdict(float)   # (callback, method): seconds
        self.calls: dict = collections.defaultdict(int)
        self._warned: set = set()
        self._steps, self._step_s = 0, 0.0

    def append(self, callback: Callback) -> None:
        self.callbacks.append(callback)

    def call(self, method: str, *args) -> None:
        for cb in self.callbacks:
            t = time.perf_counter()
            getattr(cb, method)(*args)
            key = (cb, method)
            self.spent[key] += time.perf_counter() - t
            self.calls[key] += 1

    def step_done(self, seconds: float) -> None:
        """``seconds`` passed since the previous push (observers included): warn of slow ones."""
        self._steps += 1
        self._step_s += seconds
        if self._steps % self.min_calls:
            return
        step = self._step_s / self._steps
        for (cb, method), spent in self.spent.items():
            calls = self.calls[(cb, method)]
            if (cb, method) in self._warned or calls < self.min_calls or spent / calls <= self.slow_share * step:
                continue
            self._warned.add((cb, method))
            logger.warning("callback %s.%s is slow compared to a step (%.4f s per call vs %.4f s per step): "
                           "the engine's loop waits for it", type(cb).__name__, method, spent / calls, step)

    def seconds(self, callback) -> float:
        """Time spent in ``callback``, all its methods."""
        return sum(s for (cb, _), s in self.spent.items() if cb is callback)


class ControllerLink(Callback):
    """A Controller (the manager's link) sees every push record and event."""

    def __init__(self, controller):
        self.controller = controller

    def on_push(self, engine, push, record):
        self.controller.record(record)

    def on_event(self, engine, kind, fields):
        self.controller.event(kind, fields)


class ProgressDisplay(Callback):
    """A ``progress(engine, policy, total)`` callable (tfsync.base.progress.Progress)."""

    def __init__(self, progress):
        self.progress = progress

    def on_train_begin(self, engine):
        if hasattr(self.progress, "starting"):
            self.progress.starting(engine)

    def on_push(self, engine, push, record):
        self.progress(engine, engine.policy, engine.total_samples)

    def on_event(self, engine, kind, fields):
        if hasattr(self.progress, "event"):
            self.progress.event(kind, fields)


class Evaluations(Callback):
    """Asks the background evaluator for a point of the curve when one is due, and
    records the ones done (from the loop's thread: records are written by one thread)."""

    def __init__(self, evaluator):
        self.evaluator = evaluator

    def on_push(self, engine, push, record):
        ev, s = self.evaluator, engine.ledger
        for e in ev.drain():
            engine.runlog.log_eval(e)
        if ev.due(s.pushes):
            ev.request(engine.generation, s.pushes, s.updates, s.samples, engine.runlog.since())
