"""Test loss, accuracy and metrics measured on the coordinator while the workers train.

Every ``every`` steps (pushes, so the cadence in samples is the same under every
protocol) the engine's loop asks for an evaluation and goes on at once: a
background thread copies the weights from the PS (a few remote reads), loads them into
a local copy of the model and runs the test set through it: the mean loss, argmax accuracy
where the labels are class ids (or the "accuracy" metric where one is named) and every
metric (``tfsync.job.metrics``). The loop never waits, so
grants and barriers are not delayed; the thread runs at a lower CPU priority so that on
a shared machine the workers come first. ``samples`` limits each evaluation to a fixed random
subset of the test set (the final accuracy of a run is still on all of it). A request
made while the previous one still runs is skipped and counted (``skipped``), never queued: a late point on the curve is
worth less than steady training.

The weights are read one variable at a time while updates may be applied, as any
side-car evaluator of a parameter server reads them; a snapshot may mix two adjacent
updates. The local model is rebuilt per cluster generation: a restart switch reconnects
the coordinator's eager context, which invalidates variables made before it.

Results are collected by the loop (``drain``), so the run's records are written from one
thread only. Sync-Switch's search needs these curves: converged accuracy is the first
accuracy that stays within 0.1 % for 5 evaluations (Sync-Switch §VI-A).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..base import arrays
from ..job.metrics import MetricSpec, as_in_evaluate, value

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    updates: int
    samples: int
    time: float  # seconds since the run began, when the weights were read
    accuracy: float | None
    seconds: float  # how long the evaluation took
    loss: float | None = None
    metrics: dict = field(default_factory=dict)  # name -> value
    pushes: int | None = None  # the TensorBoard step, as the push scalars'

    def to_dict(self) -> dict:
        out = {"updates": self.updates, "samples": self.samples, "time": round(self.time, 4),
               "accuracy": self.accuracy, "seconds": round(self.seconds, 4), "loss": self.loss}
        return {**out, "metrics": dict(self.metrics)} if self.metrics else out


def classifies(y: np.ndarray) -> bool:
    """Whether labels ``y`` are class ids, so that argmax accuracy means something (not
    for several outputs' labels)."""
    return isinstance(y, np.ndarray) and y.ndim == 1 and np.issubdtype(y.dtype, np.integer)


def accuracy(model, x: np.ndarray, y: np.ndarray, chunk: int = 1000) -> float | None:
    """Argmax accuracy; None where it does not apply (labels that are not class ids, or
    outputs that are not one score per class)."""
    if not classifies(y):
        return None
    correct = 0
    for i in range(0, len(y), chunk):
        logits = model(x[i:i + chunk], training=False)
        if len(logits.shape) != 2 or logits.shape[-1] < 2:
            return None
        correct += int(np.sum(np.argmax(logits, -1) == y[i:i + chunk]))
    return correct / len(y)


def mean_loss(model, loss_fn, x: np.ndarray, y: np.ndarray, chunk: int = 1000) -> float:
    """The training loss on ``(x, y)``: the mean of the per-example losses."""
    total = 0.0
    for i in range(0, len(y), chunk):
        total += float(np.sum(loss_fn(y[i:i + chunk], model(x[i:i + chunk], training=False))))
    return total / len(y)


def scores(model, x: np.ndarray, y: np.ndarray, loss_fn: Callable | None = None,
           metrics: list[MetricSpec] | None = None, chunk: int = 1000) -> dict:
    """One pass of ``(x, y)`` through ``model``: ``loss`` (the mean per-example loss; None
    without ``loss_fn``), ``accuracy`` (the "accuracy" metric if named, else argmax
    accuracy where it applies, else None) and ``metrics`` (name -> value). ``x`` and ``y``
    may be tuples, lists or dicts of arrays (several inputs or outputs)."""
    total, correct, argmax = 0.0, 0, classifies(y)
    made = None
    n = arrays.length(y)
    for i in range(0, n, chunk):
        xb, yb = arrays.take(x, slice(i, i + chunk)), arrays.take(y, slice(i, i + chunk))
        out = model(xb, training=False)
        if loss_fn is not None:
            total += float(np.sum(loss_fn(yb, out)))
        if argmax and (len(out.shape) != 2 or out.shape[-1] < 2):
            argmax = False
        if argmax:
            correct += int(np.sum(np.argmax(out, -1) == yb))
        if metrics:
            made = made or [s.build(yb, out) for s in metrics]
            yt, yp = as_in_evaluate(yb, out)
            for m in made:
                m.update_state(yt, yp)
    values = {s.name: value(m) for s, m in zip(metrics or [], made or [])}
    acc = values.get("accuracy", correct / n if argmax else None)
    return {"loss": total / n if loss_fn is not None else None, "accuracy": acc, "metrics": values}


class Evaluator:
    def __init__(self, model_fn: Callable, x_test: np.ndarray, y_test: np.ndarray, every: int,
                 samples: int | None = None, seed: int = 0, nice: int = 10, loss_fn: Callable | None = None,
                 metrics: list[MetricSpec] | None = None):
        if int(every) < 1:
            raise ValueError(f"evaluate every {every!r} steps: must be >= 1")
        n = arrays.length(y_test)
        if samples and samples < n:  # a fixed random subset (test sets may be sorted by class)
            keep = np.sort(np.random.default_rng(seed).choice(n, int(samples), replace=False))
            x_test, y_test = arrays.take(x_test, keep), arrays.take(y_test, keep)
        self.model_fn, self.x, self.y = model_fn, x_test, y_test
        self.loss_fn, self.metrics = loss_fn, metrics
        self.every, self.nice = int(every), int(nice)
        self.next_at = self.every
        self.skipped = 0
        self._lock = threading.Lock()
        self._results: list[Evaluation] = []
        self._busy = False
        self._model, self._model_gen = None, None

    def due(self, steps: int) -> bool:
        if steps < self.next_at - self.every:   # the counts went back (a rewind, an undo): the cadence from there
            self.next_at = (steps // self.every + 1) * self.every
        return steps >= self.next_at

    def request(self, gen, steps: int, updates: int, samples: int, t: float) -> bool:
        """Start an evaluation of ``gen``'s current weights; False if one is still running."""
        self.next_at = (steps // self.every + 1) * self.every
        with self._lock:
            if self._busy:
                self.skipped += 1
                return False
            self._busy = True
        threading.Thread(target=self._run, args=(gen, updates, samples, t, steps), daemon=True,
                         name="tfsync-evaluator").start()
        return True

    def _run(self, gen, updates: int, samples: int, t: float, pushes: int | None = None) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        except (OSError, AttributeError):
            pass
        try:
            t0 = time.perf_counter()
            r = self.evaluate(gen)
            result = Evaluation(updates, samples, t, r["accuracy"], time.perf_counter() - t0, r["loss"],
                                r["metrics"], pushes)
            with self._lock:
                self._results.append(result)
        except Exception as e:  # e.g. the generation was replaced by a restart switch meanwhile
            logger.debug("evaluation at %d updates skipped: %s", updates, e)
            with self._lock:
                self.skipped += 1
        finally:
            with self._lock:
                self._busy = False

    def evaluate(self, gen) -> dict:
        """``scores`` of ``gen``'s weights now (synchronously, in the caller's thread)."""
        if self._model is None or self._model_gen is not gen:
            self._model, self._model_gen = self.model_fn(), gen
        self._model.set_weights(gen.model.get_weights())
        return scores(self._model, self.x, self.y, self.loss_fn, self.metrics)

    def drain(self) -> list[Evaluation]:
        with self._lock:
            out, self._results = self._results, []
        return out

    def wait(self, timeout: float = 60.0) -> None:
        """Wait for a running evaluation (before the run's last one, or a restart)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._busy:
                    return
            time.sleep(0.02)
