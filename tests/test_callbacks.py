"""The engine's observers (tfsync.engine.callbacks): each is called, timed, and one that
is slow compared to a step is named in one warning, as tf_keras's CallbackList does."""

import logging
import time

import pytest

from tfsync.engine.callbacks import Callback, CallbackList

pytestmark = pytest.mark.unit


class Counting(Callback):
    def __init__(self, pause=0.0):
        self.pushes, self.pause = 0, pause

    def on_push(self, engine, push, record):
        self.pushes += 1
        time.sleep(self.pause)


def test_every_observer_sees_every_push_and_only_the_slow_one_is_named_once(caplog):
    fast, slow = Counting(), Counting(pause=0.004)
    callbacks = CallbackList([fast, slow], min_calls=10)
    with caplog.at_level(logging.WARNING, logger="tfsync.engine.callbacks"):
        for _ in range(40):
            callbacks.call("on_push", None, None, {})
            callbacks.step_done(0.005)   # the step, observers included: the slow one takes 80 % of it
    assert fast.pushes == slow.pushes == 40
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "Counting.on_push is slow" in warnings[0]
    assert callbacks.seconds(slow) >= 40 * 0.004 > callbacks.seconds(fast)


def test_observers_within_half_a_step_are_not_named(caplog):
    callbacks = CallbackList([Counting(pause=0.001)], min_calls=10)
    with caplog.at_level(logging.WARNING, logger="tfsync.engine.callbacks"):
        for _ in range(40):
            callbacks.call("on_push", None, None, {})
            callbacks.step_done(0.05)
    assert not caplog.records
