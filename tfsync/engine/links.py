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
coordinator: the rows it drained before are still read, then ``rows`` or ``send`` raises
the loop's error.

One drain waits on the PS at a time. A row queued while the last drain's answer travels
waits for the next drain to arrive: up to a round trip more (a BSP round's pushes land
within a few milliseconds, so the coordinator sees the first alone and the others a round
trip later). Two drains waiting at once, ordered by a number the PS gives each, would
close that gap; tried on 2026-11-28, the second drain's rows never came (not found why).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import cancellation   # (as ClusterCoordinator cancels its closures)

from ..base.exits import TfsyncError
from .control import ROW_LEN, TOKEN_LEN, PSControl, remote_call

logger = logging.getLogger(__name__)


class LinkClosed(TfsyncError, RuntimeError):
    """A link's queue was closed with no failure of its loop recorded."""


class Links:
    def __init__(self, control: PSControl, capacity: int = 1 << 20):
        self.error: BaseException | None = None   # the first loop's failure
        # on the coordinator (no device scope: its own CPU)
        self.inbox = tf.queue.FIFOQueue(capacity, [tf.float64], shapes=[[ROW_LEN]], name="drained_rows")
        self.outbox = tf.queue.FIFOQueue(16, [tf.int32, tf.int64], name="control_packets")   # (k, tokens)
        self.answers = tf.queue.FIFOQueue(16, [tf.bool], shapes=[[]], name="control_answers")
        with tf.device(control.device):
            drain = control.drain.get_concrete_function()
            send = control.send.get_concrete_function()

        def forever(body):
            return tf.while_loop(lambda i: True, body, [tf.constant(0)])

        def receive(i):
            rows = remote_call(control.device, drain, [])[0]
            with tf.control_dependencies([self.inbox.enqueue_many(rows)]):
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
        self._loops = ((self._cancel.get_cancelable_function(function(lambda: forever(receive))), self.inbox, False),
                       (self._cancel.get_cancelable_function(function(lambda: forever(transmit))), self.answers, True))
        self._take = function(lambda: self.inbox.dequeue_many(tf.maximum(self.inbox.size(), 1)))

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
        out.close(cancel_pending_enqueues=cancel)

    def rows(self) -> np.ndarray:
        """Every row drained and not yet read, at least one (waits for one)."""
        try:
            return self._take().numpy()
        except tf.errors.OutOfRangeError as e:
            raise self.error or LinkClosed("the generation's links are closed") from e

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
