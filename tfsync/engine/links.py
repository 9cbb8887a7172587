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
  for a row) and hands the rows to the engine from the loop itself (``on_rows``, called
  through ``tf.numpy_function``: no queue on the coordinator for a Python thread to call
  a function on, which cost a fifth of the coordinator's CPU on a fast model);
- out: ``send(k, tokens)`` puts a packet on a queue on the coordinator, and a loop takes
  it and calls ``PSControl.send`` on the PS (apply the round of ``k`` pushes if k > 0,
  then release the tokens); ``send`` returns once the PS has answered (the loop says so
  through ``tf.numpy_function``), so packets stay in order with the engine's other PS
  calls (tfsync.engine.channel).

The loops start one at a time (``start``): a ``RemoteCall``'s first run instantiates the
PS's function, which TensorFlow 2.21 does unsafely beside another ``RemoteCall`` of the
same process. Code that adds a ``RemoteCall`` on the coordinator must make its first
call while no loop runs, too: ``rounds`` (the PS-run BSP rounds, tfsync.engine.pilot)
makes its first, of no round, before the loops start.

When a receive loop fails (the PS died, the generation closed), the rows handed on
before stand, the batches held for an earlier one are handed on, and ``on_end`` is told
the loop's error, once; ``send`` then raises it.

Several receive loops wait on the PS at once (``RECEIVERS``). With one, a row queued
while the last drain's answer travels waited for the next drain to arrive, up to a round
trip more: a BSP round's pushes land within a few milliseconds, so the coordinator saw
the first alone and the others a round trip later. The drains take turns on the PS, each
taking every row there (``PSControl.drain``), and number their batches; ``on_rows`` gets
the batches in that order (a batch can overtake another on the way back).

A drain that hands on one row costs the coordinator about 1 ms of CPU (the remote call,
the loop's turn, the handing on): on a model of a few milliseconds a step on two shared
cores, that CPU is the workers'. Where the running policy can wait for its records
(``Policy.patience``: ASP, whose steps are granted ahead), the links *linger*: one drain
at a time, each started ``linger`` seconds after the last (a permit on a queue here that
a pacing thread puts there once the last drain is in), taking every row queued
meanwhile. Each receive loop takes a permit before its drain; while the links do not
linger, a loop puts its permit back after the drain, so every loop waits on the PS at
once.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from typing import Callable

import numpy as np
import tensorflow as tf

from ..base.exits import TfsyncError
from . import tfcompat
from .control import TOKEN_LEN, PSControl, enqueued, remote_call

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


# the loops' functions of every closed generation, never freed: freeing a function removes
# it from TensorFlow's context, which asks every task, an unreachable one too (a recovery
# from a partitioned node waited minutes on it); six small functions a generation
_CLOSED: list = []
_ENDED = object()   # on the answers' queue: the outgoing loop ended


class Links:
    def __init__(self, control: PSControl):
        self.error: BaseException | None = None   # the first loop's failure
        # on the coordinator (no device scope: its own CPU)
        self.outbox = tf.queue.FIFOQueue(16, [tf.int32, tf.int64], name="control_packets")   # (k, tokens)
        self._answers: queue.Queue = queue.Queue()   # True per packet the PS answered; _ENDED
        self._lock = threading.Lock()
        self._order = InOrder()
        self._on_rows: Callable[[np.ndarray], None] | None = None
        self._on_end: Callable[[BaseException], None] | None = None
        self._ended = False
        self.linger = 0.0   # seconds between drains (0: every loop drains at once)
        # a permit per drain (see above): the receive loops put theirs back while not lingering
        self._permits = tf.queue.FIFOQueue(64, [tf.int32], shapes=[[]], name="drain_permits")
        self._stopped = threading.Event()
        self._drained = threading.Event()   # a drain handed its rows on (the pacer waits for it)
        self._ready = threading.Event()   # the loop started last has made its first call
        self._priming = False   # the outgoing loop's next answer is to its first packet (start)
        self._threads: list[threading.Thread] = []
        with tf.device(control.device):
            drain = control.drain.get_concrete_function()
            send = control.send.get_concrete_function()
            rounds = control.rounds.get_concrete_function()
        # the PS's own rounds (tfsync.engine.pilot), one call; a function of two parts instead
        # would run its loop on the coordinator too, hearing the PS's condition at each round:
        # that cost the coordinator about 0.35 ms of CPU a push (BSP, 4 workers on loopback)
        self._rounds = tf.function(lambda k, epoch, tokens, version: remote_call(
            control.device, rounds, [k, epoch, tokens, version])[0], autograph=False).get_concrete_function(
            tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int64), tf.TensorSpec([None, TOKEN_LEN + 1], tf.int64),
            tf.TensorSpec([], tf.int64))

        def forever(body):
            return tf.while_loop(lambda i: True, body, [tf.constant(0)])

        def receive(i):
            with tf.control_dependencies([self._permits.dequeue()]):   # (the first turn waits for no row)
                number, rows = remote_call(control.device, drain, [i > 0])
            again = tf.numpy_function(self._arrived, [number, rows], tf.bool)   # (not lingering)
            again.set_shape([])
            back = tf.cond(again, lambda: enqueued(self._permits, 0), lambda: tf.constant(False))
            with tf.control_dependencies([back]):
                return i + 1

        def transmit(i):
            k, tokens = self.outbox.dequeue()
            k.set_shape([])
            tokens.set_shape([None, TOKEN_LEN + 1])
            done = remote_call(control.device, send, [k, tokens])[0]
            with tf.control_dependencies([tf.numpy_function(self._answered, [done], tf.bool)]):
                return i + 1

        function = lambda fn: tf.function(fn, autograph=False).get_concrete_function()  # noqa: E731
        self._cancel = tfcompat.cancellation_manager()
        loop = lambda body: self._cancel.get_cancelable_function(function(lambda: forever(body)))  # noqa: E731
        # (a function of each loop's own, and a cancellation manager its thread's alone:
        # tfcompat.cancellation_per_thread)
        self._loops = [(loop(receive), False) for _ in range(RECEIVERS)] + [(loop(transmit), True)]

    def start(self, on_rows: Callable[[np.ndarray], None], on_end: Callable[[BaseException], None],
              ready_s: float = 30.0) -> None:
        """Run the loops: ``on_rows(rows)`` gets the finished steps' rows the PS queued, at
        least one at a time, in the PS's order (called from a loop's thread: keep it short);
        ``on_end(error)`` is called once, after the last rows, when the receive loops end.

        The loops start one at a time, each once the last has made its first call (a
        packet with nothing to apply or release; a drain that waits for no row), up to
        ``ready_s`` each. A loop's first ``RemoteCall`` instantiates the PS's function, and
        TensorFlow 2.21's ``EagerClusterFunctionLibraryRuntime`` adds it to a vector that a
        concurrent call reads without its lock: a call made while the vector grew sent the
        PS a corrupt request or crashed the coordinator (seen in whole test runs)."""
        self._on_rows, self._on_end = on_rows, on_end
        self.rounds(0, 0, np.zeros([0, TOKEN_LEN + 1], np.int64), 0)   # its first call, while no loop runs
        self._priming = True
        self.outbox.enqueue((tf.constant(0, tf.int32), tf.zeros([0, TOKEN_LEN + 1], tf.int64)))
        for loop, outgoing in reversed(self._loops):   # (the outgoing loop is the last)
            self._ready.clear()
            if not outgoing:
                self._permits.enqueue(0)   # (put back after each drain: one per receive loop in all)
            t = threading.Thread(target=self._run, args=(loop, outgoing), daemon=True, name="tfsync-link")
            self._threads.append(t)
            t.start()
            self._ready.wait(ready_s)
        self._threads.append(threading.Thread(target=self._pace, daemon=True, name="tfsync-link-pacer"))
        self._threads[-1].start()

    def rounds(self, k: int, epoch: int, tokens: np.ndarray, version: int) -> int:
        """Have the PS close up to ``k`` rounds itself (``PSControl.rounds``); returns how
        many it closed, once it has (blocks: call it from a thread of its own)."""
        return int(self._rounds(tf.constant(k, tf.int32), tf.constant(epoch, tf.int64), tf.constant(tokens, tf.int64),
                                tf.constant(version, tf.int64)))

    def set_linger(self, seconds: float) -> None:
        """Drain every ``seconds`` (> 0), one drain at a time, or (0) with every receive
        loop at once, as soon as a row is queued."""
        was, self.linger = self.linger, max(float(seconds), 0.0)
        if was > 0 and self.linger == 0:   # every loop waits on the PS again
            self._permits.enqueue_many(tf.zeros([max(RECEIVERS - int(self._permits.size()), 0)], tf.int32))

    def _pace(self) -> None:
        """While the links linger: a permit, then, once its drain has handed its rows on,
        ``linger`` seconds before the next (no look at the permits' queue, an eager call
        that cost as much CPU as a drain)."""
        try:
            while not self._stopped.is_set():
                if self.linger <= 0:
                    self._stopped.wait(0.05)
                    continue
                self._drained.clear()
                self._permits.enqueue(0)
                while not (self._drained.wait(0.5) or self._stopped.is_set()):
                    pass
                self._stopped.wait(self.linger)
        except Exception as e:  # noqa: BLE001 - the links are closing
            logger.debug("the links' pacer ended: %s", e)

    def _arrived(self, number, rows) -> np.ndarray:
        if number < 0:   # a loop's first turn (start)
            self._ready.set()
            return np.array(True)
        with self._lock:
            if not self._ended and self._on_rows is not None:   # (else the generation is closing)
                self._order.add(int(number), np.array(rows))   # (its own copy: it is kept)
                for batch in self._order.ready():
                    self._on_rows(batch)
        self._drained.set()
        return np.array(self.linger == 0)

    def _answered(self, done) -> np.ndarray:
        if self._priming:   # (start's packet)
            self._priming = False
            self._ready.set()
        else:
            self._answers.put(True)
        return np.array(True)

    def _run(self, loop, outgoing: bool) -> None:
        try:
            loop()
        except Exception as e:  # noqa: BLE001 - reported by on_end() and send()
            logger.debug("a link to the PS ended: %s", e)
            if self.error is None:   # (without its traceback, whose frames would hold these links)
                self.error = e.with_traceback(None)
        self._ready.set()   # (start goes on)
        if outgoing:
            self._answers.put(_ENDED)
            return
        with self._lock:
            if self._ended or self._on_end is None:
                return
            self._ended = True
            on_rows, on_end = self._on_rows, self._on_end
            for batch in self._order.rest():   # what came before the loops ended
                on_rows(batch)
        on_end(self._failure())

    def send(self, num_required: int, tokens: np.ndarray) -> None:
        """Apply the round of ``num_required`` pushes (0: none), then release ``tokens``
        (rows ``[worker, *token]``) on the PS; returns once it has."""
        try:
            self.outbox.enqueue((tf.constant(num_required, tf.int32), tf.constant(tokens, tf.int64)))
        except (tf.errors.OutOfRangeError, tf.errors.CancelledError) as e:
            raise self._failure() from e
        if self._answers.get() is _ENDED:
            self._answers.put(_ENDED)   # (for the next send)
            raise self._failure()

    def _failure(self) -> BaseException:
        """The first loop's failure, a copy each time (raised, it takes on the raiser's
        frames, which must not stay with these links), or LinkClosed."""
        return copy.copy(self.error) if self.error is not None else LinkClosed("the generation's links are closed")

    def close(self, wait_s: float = 2.0) -> None:
        """End the loops (cancelled: no eager op, which can wait on a coordinator whose
        cluster has a task it cannot reach); what waits on them then fails. Then, once
        their threads have ended (up to ``wait_s``), let go of the engine's callbacks, so
        that the generation is freed when it closes, by the thread that closes it: a
        numpy_function's graph holds these links, and the callbacks the generation, so a
        garbage collection in whichever thread ran one later would remove the generation's
        functions from TensorFlow's context while the next generation's functions run. The
        loops' functions are kept (``_CLOSED``), and with them their cancellation
        manager."""
        self._stopped.set()
        self._cancel.start_cancel()
        deadline = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(deadline - time.monotonic(), 0.0))
        with self._lock:
            self._on_rows = self._on_end = None
        _CLOSED.append((self._loops, self._rounds))
        self._loops = []
