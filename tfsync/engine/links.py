"""The coordinator's two standing links to the PS: finished steps' rows in, round ends and
tokens out, each a loop on the coordinator that runs as long as the generation.

A control call made from Python on the coordinator is an eager call of a function whose
inputs include the PS's queues and variables: TensorFlow runs it as a function of two
parts, one on each task, and it cost 2-6 round trips (at 10 ms a node, a round trip of
21 ms: a drain of rows already waiting 46-91 ms, a release 69-137 ms;
experiments/bench_coord_call.py). A loop on the coordinator whose every turn is one
``RemoteCall`` to the PS (which runs the PS's function with the call's inputs and
answers with its outputs, as a worker's step does: tfsync.engine.step) pays that once,
when it starts; a turn then costs one round trip: a row reaches the coordinator half a
round trip after the PS queued it (12 ms), a release is answered in one (23 ms).

- in: a loop drains the PS's queue of finished steps (``PSControl.drain``, which waits
  for a row) into a queue on the coordinator, which ``rows`` reads;
- out: ``send(k, tokens)`` puts a packet on a queue on the coordinator, and a loop takes
  it and calls ``PSControl.send`` on the PS (apply the round of ``k`` pushes if k > 0,
  then release the tokens); ``send`` returns once the PS has answered, so packets stay in
  order with the engine's other PS calls (tfsync.engine.channel).

A loop that fails (the PS died, the generation closed) closes its queue on the
coordinator: the rows drained before are still read, then ``rows`` or ``send`` raises
the loop's error.

Several receive loops wait on the PS at once (``RECEIVERS``). With one, a row queued
while the last drain's answer travels waited for the next drain to arrive, up to a round
trip more: a BSP round's pushes land within a few milliseconds, so the coordinator saw
the first alone and the others a round trip later. The drains take turns on the PS, each
taking every row there (``PSControl.drain``), and number their batches; ``rows`` hands
the batches on in that order (a batch can overtake another on the way back).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import cancellation   # (as ClusterCoordinator cancels its closures)

from ..base.exits import TfsyncError
from .control import TOKEN_LEN, PSControl, remote_call

logger = logging.getLogger(__name__)

RECEIVERS = 4   # drains waiting on the PS at once


class LinkClosed(TfsyncError, RuntimeError):
    """A link's queue was closed with no failure of its loop recorded."""


class InOrder:
    """Numbered batches of rows handed on in their numbers' order, 0, 1, ..., whatever
    order they come in."""

    def __init__(self):
        self._batches: dict[int, np.ndarray] = {}   # come, not yet handed on
        self._next = 0   # the number of the batch handed on next

    def add(self, number: int, rows: np.ndarray) -> None:
        self._batches[number] = rows

    def ready(self) -> list[np.ndarray]:
        """The batches that can be handed on now, in order (none while the next is missing)."""
        out = []
        while self._next in self._batches:
            out.append(self._batches.pop(self._next))
            self._next += 1
        return out

    def rest(self) -> list[np.ndarray]:
        """Every batch held, in order, gaps and all (the batches missing will not come)."""
        return [self._batches.pop(number) for number in sorted(self._batches)]


class Links:
    def __init__(self, control: PSControl, capacity: int = 1 << 20):
        self.error: BaseException | None = None   # the first loop's failure
        # on the coordinator (no device scope: its own CPU): (number, rows) of each drain
        self.inbox = tf.queue.FIFOQueue(capacity, [tf.int64, tf.float64], name="drained_rows")
        self.outbox = tf.queue.FIFOQueue(16, [tf.int32, tf.int64], name="control_packets")   # (k, tokens)
        self.answers = tf.queue.FIFOQueue(16, [tf.bool], shapes=[[]], name="control_answers")
        with tf.device(control.device):
            drain = control.drain.get_concrete_function()
            send = control.send.get_concrete_function()

        def forever(body):
            return tf.while_loop(lambda i: True, body, [tf.constant(0)])

        def receive(i):
            with tf.control_dependencies([self.inbox.enqueue(remote_call(control.device, drain, []))]):
                return i + 1

        def transmit(i):
            k, tokens = self.outbox.dequeue()
            k.set_shape([])
            tokens.set_shape([None, TOKEN_LEN + 1])
            done = remote_call(control.device, send, [k, tokens])[0]
            with tf.control_dependencies([self.answers.enqueue(done)]):
                return i + 1

        function = lambda fn: tf.function(fn, autograph=False).get_concrete_function()  # noqa: E731
        self._cancel = cancellation.CancellationManager()
        loop = lambda body: self._cancel.get_cancelable_function(function(lambda: forever(body)))  # noqa: E731
        # (a function of its own for each receive loop: while the four ran one function, one
        # test run crashed in it when the PS died; the cause was not found)
        self._loops = [(loop(receive), self.inbox, False) for _ in range(RECEIVERS)] + [
            (loop(transmit), self.answers, True)]
        self._order = InOrder()
        self._take = function(self.inbox.dequeue)

    def start(self) -> None:
        for loop, out, cancel in self._loops:
            threading.Thread(target=self._run, args=(loop, out, cancel), daemon=True, name="tfsync-link").start()

    def _run(self, loop, out, cancel: bool) -> None:
        try:
            loop()
        except Exception as e:  # noqa: BLE001 - reported by rows() and send()
            logger.debug("a link to the PS ended: %s", e)
            if self.error is None:
                self.error = e
        try:
            out.close(cancel_pending_enqueues=cancel)
        except tf.errors.CancelledError:   # closed by another receive loop
            pass

    def rows(self) -> np.ndarray:
        """The rows drained and not yet read that the PS queued before any still on their
        way, at least one, in the PS's order (waits for one)."""
        while not (ready := self._order.ready()):
            try:
                number, rows = self._take()
            except tf.errors.OutOfRangeError as e:
                if held := self._order.rest():   # what came before the loops ended
                    return np.concatenate(held)
                raise self.error or LinkClosed("the generation's links are closed") from e
            self._order.add(int(number), rows.numpy())
        return np.concatenate(ready)

    def send(self, num_required: int, tokens: np.ndarray) -> None:
        """Apply the round of ``num_required`` pushes (0: none), then release ``tokens``
        (rows ``[worker, *token]``) on the PS; returns once it has."""
        try:
            self.outbox.enqueue((tf.constant(num_required, tf.int32), tf.constant(tokens, tf.int64)))
            self.answers.dequeue()
        except (tf.errors.OutOfRangeError, tf.errors.CancelledError) as e:
            raise self.error or LinkClosed("the generation's links are closed") from e

    def close(self) -> None:
        """End both loops (cancelled: no eager op, which can wait on a coordinator whose
        cluster has a task it cannot reach); what waits on them then fails."""
        self._cancel.start_cancel()
