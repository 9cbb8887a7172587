"""The background evaluator: a fixed random test subset, requests skipped (not queued)
while one runs, results collected by the caller, weights read from the given model."""

import threading
import types

import numpy as np
import pytest
import tf_keras as keras

from tfsync.engine.evaluator import Evaluator, accuracy

pytestmark = pytest.mark.unit


def model_fn():
    m = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(3)])
    return m


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4)).astype("float32")
    y = np.argmax(x[:, :3], axis=1)  # class = the largest of the first 3 features
    teacher = model_fn()
    w = np.zeros((4, 3), "float32")
    w[:3, :3] = np.eye(3)
    teacher.set_weights([w, np.zeros(3, "float32")])
    return x, y, types.SimpleNamespace(model=teacher)


def test_accuracy_and_subset(problem):
    x, y, gen = problem
    assert accuracy(gen.model, x, y, chunk=128) == 1.0
    ev = Evaluator(model_fn, x, y, every=10, samples=100, seed=3)
    assert len(ev.y) == 100 and len(set(ev.y.tolist())) == 3
    again = Evaluator(model_fn, x, y, every=10, samples=100, seed=3)
    assert np.array_equal(ev.x, again.x)  # the same subset every time
    assert ev.evaluate(gen)["accuracy"] == 1.0


def test_requests_run_in_background_and_skip_while_busy(problem):
    x, y, gen = problem
    ev = Evaluator(model_fn, x, y, every=10)
    gate = threading.Event()
    real = ev.evaluate
    ev.evaluate = lambda g: (gate.wait(5), real(g))[1]  # hold the first evaluation
    assert not ev.due(9) and ev.due(10)
    assert ev.request(gen, 10, 5, 320, 1.0)
    assert ev.next_at == 20 and not ev.due(19)
    assert not ev.request(gen, 21, 11, 700, 2.0)  # still busy: skipped, not queued
    assert ev.skipped == 1 and ev.drain() == []
    gate.set()
    ev.wait()
    (result,) = ev.drain()
    assert (result.updates, result.samples, result.time, result.accuracy) == (5, 320, 1.0, 1.0)
    assert ev.drain() == []


def test_a_failing_evaluation_is_counted_not_raised(problem):
    x, y, _ = problem
    ev = Evaluator(model_fn, x, y, every=1)
    ev.request(types.SimpleNamespace(model=None), 1, 1, 8, 0.5)  # no weights to read
    ev.wait()
    assert ev.drain() == [] and ev.skipped == 1
    with pytest.raises(ValueError, match="every"):
        Evaluator(model_fn, x, y, every=0)


def test_after_the_counts_go_back_the_cadence_counts_from_there(problem):
    """An undo or a rewind takes the pushes back (here from 40 to 23): the next evaluation
    is at 30, not at 50 (a CNN's curve had no point for the 10 s after an undo)."""
    x, y, _ = problem
    ev = Evaluator(model_fn, x, y, every=10)
    ev.next_at = 50
    assert not ev.due(23) and ev.next_at == 30 and ev.due(30)
    ev.next_at = 50
    assert not ev.due(45) and ev.next_at == 50   # within one period: as it was
