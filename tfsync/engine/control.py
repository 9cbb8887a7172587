"""PS-side control state: per-worker token gates and the weighted BSP accumulator.

A token is ``[batch_size, mode, round, seq]`` (int64). A worker's standing closure blocks
on its own FIFO queue on PS task 0 until the coordinator enqueues a token (the pattern of
TF1's SyncReplicasOptimizer, which TF2 dropped: tensorflow/tensorflow issue 27725). ``batch_size == 0`` is a no-op token that ends a
standing closure. Each finished step leaves its row on one more queue, which the
coordinator drains (``drain``): one remote call returns every row waiting.

AGGREGATE pushes go to one ConditionalAccumulator holding ``[|B| * g (flattened), |B|]``:
the accumulator averages its inputs, so ``sum(|B_i| g_i) / sum(|B_i|)`` (LB-BSP eq. 8)
is the ratio of the two parts whatever number of pushes it holds, and a push whose round
(``local_step``) is older than the accumulator's is dropped atomically on the PS.

Steady BSP rounds run on the PS alone (``rounds``, driven by ``tfsync.engine.pilot``): a
ROUND push leaves its row on a queue of its own, where a loop on the PS takes each
round's rows, applies the weighted mean, releases the next round's tokens at once, and
only then passes the rows, and a marker row saying what it did, on to the coordinator.
The batch sizes of the rounds it opens are the latest the coordinator set (``set_sizes``,
LB-BSP's), or, until it sets any, the first round's.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import tensorflow as tf

from . import tfcompat

logger = logging.getLogger(__name__)

TOKEN_LEN = 4
BATCH, MODE, ROUND, SEQ = range(TOKEN_LEN)
ROW_LEN = 1 + TOKEN_LEN + 6   # a finished step: [worker, *token, start, end, loss, version, rate, landed]
ROW_START, ROW_END, ROW_LANDED = 1 + TOKEN_LEN, 1 + TOKEN_LEN + 1, 1 + TOKEN_LEN + 5   # worker clock; PS clock
MARKER_SIZES = 1 + TOKEN_LEN + 2   # where a push's row has its loss, a marker row has its sizes' version
MODE_APPLY, MODE_AGGREGATE, MODE_ROUND = 0, 1, 2   # ROUND: aggregate; the PS closes the round (rounds)


def weighted_flat(grads, batch_size):
    """``[|B| * g (flattened), |B|]``: what one AGGREGATE push adds to the accumulator."""
    b = tf.cast(batch_size, tf.float32)
    return tf.concat([tf.reshape(g, [-1]) * b for g in grads] + [tf.reshape(b, [1])], 0)


def weighted_mean(flat, variables, sizes):
    """Per-variable gradients from the accumulator's average of ``weighted_flat`` pushes:
    sum(|B_i| g_i) / sum(|B_i|), whatever number of pushes it averaged (LB-BSP eq. 8)."""
    parts = tf.split(flat[:-1] / flat[-1], sizes)
    return [tf.reshape(p, v.shape) for p, v in zip(parts, variables)]


def check_optimizer(optimizer) -> None:
    """Refuse (TypeError/ValueError, one line) an optimizer whose updates the engine cannot
    make as ``apply_gradients`` would (it calls ``update_step`` itself)."""
    if not (hasattr(optimizer, "update_step") and hasattr(optimizer, "build")):
        raise TypeError(f"{type(optimizer).__name__} is not a tf_keras.optimizers.Optimizer with update_step; "
                        "legacy optimizers are not supported")
    if getattr(optimizer, "use_ema", False):
        raise ValueError("optimizer use_ema=True is not supported (the moving average is kept by "
                         "apply_gradients, which tfsync cannot call); remove it")


def _call(fn, *args):
    return fn(*args)


_CONVERTER: list = []   # _call converted by autograph, made at the first trace that needs it


def converted(fn, *args):
    """``fn(*args)``, converted by autograph while a function is traced: a user's function
    (a layer's call and a loss, as under model.fit; a rate schedule and an optimizer's
    update_step, which model.fit leaves as they are) may branch and loop in Python on
    tensors; TensorFlow's and tf_keras's own code runs as it is. The engine's own traced
    functions write their tf.while_loop and tf.cond out and are not converted (converting
    them cost a generation about 1.5 s of tracing). Eagerly, a plain call. An error in
    the user's code names its file and line (autograph's own message). Where autograph
    cannot convert (no source, no temporary file), ``fn`` runs as it is, as autograph
    itself does then."""
    if tf.executing_eagerly():
        return fn(*args)
    if not _CONVERTER:
        try:
            _CONVERTER.append(tf.autograph.to_graph(_call))
        except Exception as e:  # noqa: BLE001 - autograph's own fallback: unconverted, said once
            logger.warning("autograph cannot convert the user's code (%s): it runs as it is", e)
            _CONVERTER.append(_call)
    try:
        return _CONVERTER[0](fn, *args)
    except Exception as e:
        metadata = getattr(e, "ag_error_metadata", None)   # as tf.function with autograph says it
        better = metadata.create_exception(e) if metadata is not None else None
        if better is None:
            raise
        raise better from None


def apply_update(optimizer, grads, variables, rate):
    """One optimizer update without ``apply_gradients`` (its merge_call cannot run inside
    ``tf.cond`` under ParameterServerStrategy); the math runs beside each variable. It
    does what ``apply_gradients`` does, in its order: set the update's rate (``rate()``:
    the schedule at this update's ``iterations``, times the configuration factor), clip
    the gradients (clipnorm, global_clipnorm, clipvalue), decay the weights
    (weight_decay, AdamW's too), ``update_step`` each variable. Returns the rate."""
    used = rate()
    tfcompat.rate_variable(optimizer).assign(tf.cast(used, tfcompat.rate_variable(optimizer).dtype))
    grads = tfcompat.clip_gradients(optimizer, grads)
    tfcompat.apply_weight_decay(optimizer, variables)
    tfcompat.nadam_product(optimizer)
    for g, v in zip(grads, variables):
        with tf.device(v.device):
            converted(optimizer.update_step, g, v)
    optimizer.iterations.assign_add(1)
    return used


class LearningRate:
    """The rate of the next update: ``base x scale``. ``base`` is the optimizer's schedule
    at its ``iterations`` or its number (kept in ``base``, a variable); ``scale`` is the
    configuration policy's factor (Sync-Switch §IV-C). Make it under the strategy's scope
    (the variables go to the PS); calling it is traced into the step and barrier."""

    def __init__(self, optimizer, scale: float = 1.0):
        self.optimizer = optimizer
        self.schedule = tfcompat.lr_schedule(optimizer)
        self.base = None if self.schedule is not None else tf.Variable(
            float(tfcompat.rate_variable(optimizer).numpy()), trainable=False, name="lr_base")
        self.scale = tf.Variable(float(scale), trainable=False, name="lr_scale")

    def __call__(self):
        base = converted(self.schedule, self.optimizer.iterations) if self.schedule is not None else self.base
        return tf.cast(base, tf.float32) * self.scale


def read_back(optimizer, variables):
    """Reads ordered after every update of these variables and the optimizer's state: a
    control dependency on them makes a release wait until the whole update has landed
    (a dependency on one variable would not cover the others)."""
    return [v.read_value() for v in list(variables) + list(optimizer.variables)]


class PSControl:
    """``rate()``: the learning rate of the next update, a float32 tensor (see
    ``apply_update``)."""

    def __init__(self, num_workers: int, model, optimizer, rate, device: str = "/job:ps/task:0",
                 capacity: int = 1024):
        self.num_workers = num_workers
        self.variables = list(model.trainable_variables)
        self.optimizer, self.rate = optimizer, rate
        self.sizes = [int(np.prod(v.shape)) for v in self.variables]
        with tf.device(device):
            self.queues = [tf.queue.FIFOQueue(capacity, [tf.int64], shapes=[[TOKEN_LEN]], name=f"gate{i}")
                           for i in range(num_workers)]
            self.done = tf.queue.FIFOQueue(capacity * max(num_workers, 1), [tf.float64], shapes=[[ROW_LEN]],
                                           name="finished_steps")
            self.accumulator = tf.compat.v1.ConditionalAccumulator(
                tf.float32, shape=[sum(self.sizes) + 1], name="bsp_accumulator")
            # the number of the next drain's rows; held by the drain taking rows (drain)
            self.drain_turn = tf.queue.FIFOQueue(1, [tf.int64], shapes=[[]], name="drain_turn")
            self.drain_turn.enqueue(tf.constant(0, tf.int64))
            self.round_rows = tf.queue.FIFOQueue(capacity * max(num_workers, 1), [tf.float64], shapes=[[ROW_LEN]],
                                                 name="round_steps")
            self.halted = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="rounds_halted")
            # [version, batch size of each worker]: the sizes ``rounds`` grants (set_sizes)
            self.round_sizes = tf.Variable(tf.zeros([num_workers + 1], tf.int64), trainable=False,
                                           name="round_sizes")
        self.device = device
        spec = tf.TensorSpec([None, TOKEN_LEN + 1], tf.int64)
        on_ps = functools.partial(_OnPS, device)   # (user code inside: ``converted``)
        self.release = on_ps(self._release, input_signature=[spec])
        self.set_sizes = on_ps(self._set_sizes, input_signature=[tf.TensorSpec([num_workers + 1], tf.int64)])
        function = functools.partial(tf.function, autograph=False)
        # (run by the coordinator's standing loops, tfsync.engine.links)
        self.drain = function(self._drain, input_signature=[tf.TensorSpec([], tf.bool)])
        self.send = function(self._send, input_signature=[tf.TensorSpec([], tf.int32), spec])
        self.close_finished = function(self._close_finished, input_signature=[])
        # (blocks on the PS: called through a RemoteCall of its own, tfsync.engine.links,
        # so that it holds up no other call sent while it waits)
        self.rounds = function(self._rounds, input_signature=[
            tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int64), spec, tf.TensorSpec([], tf.int64)])

    # -- the step's side (run on the PS by the step's remote calls: tfsync.engine.step) -----
    def dequeue(self, worker_index):
        return tf.switch_case(worker_index, [lambda q=q: q.dequeue() for q in self.queues])

    def apply(self, grads):
        """ASP-like: apply one worker's gradient now; returns the rate it used."""
        return apply_update(self.optimizer, grads, self.variables, self.rate)

    def aggregate(self, grads, batch_size, round_):
        """Add to the round's aggregate; returns the rate its update will use (the round's
        update is the next: ``iterations`` does not move within a round)."""
        with tf.control_dependencies([self.accumulator.apply_grad(weighted_flat(grads, batch_size),
                                                                  local_step=round_)]):
            return tf.identity(self.rate())

    def finished(self, row, mode):
        """Put a finished step's row on the PS's queue (after its push: the row depends on
        it); a ROUND step's on the round queue, which ``rounds`` passes on."""
        with tf.device(self.device):
            return tf.cond(mode == MODE_ROUND, lambda: enqueued(self.round_rows, row),
                           lambda: enqueued(self.done, row))

    # -- coordinator side -----------------------------------------------------------------
    def _release(self, tokens):
        """Enqueue tokens; ``tokens`` rows are ``[worker, *token]``, kept in order per worker.
        Every op runs on the PS: one remote call, no cross-device partition."""
        with tf.device(self.device):
            for i, q in enumerate(self.queues):
                rows = tf.boolean_mask(tokens[:, 1:], tf.equal(tokens[:, 0], i))
                q.enqueue_many(rows)
            return tf.constant(True)

    def _send(self, num_required, tokens):
        """Apply the weighted mean of a round of ``num_required`` pushes (none: 0), then
        release ``tokens``: one call (``tfsync.engine.links``)."""
        def round_end():
            flat = self.accumulator.take_grad(num_required)
            with tf.control_dependencies([flat]):   # the update's reads and iterations after the take
                apply_update(self.optimizer, weighted_mean(flat, self.variables, self.sizes), self.variables,
                             self.rate)
            with tf.control_dependencies(read_back(self.optimizer, self.variables)):
                return tf.constant(True)

        with tf.device(self.device):
            applied = tf.cond(num_required > 0, round_end, lambda: tf.constant(False))
            with tf.control_dependencies([applied]):
                return self._release(tokens)

    def _drain(self, wait):
        """``(number, rows)``: every finished step's row on the queue, at least one (blocks
        until there is one). Several drains may wait at once: they take turns (the turn
        queue holds the next number), so each takes a whole batch, and ``number`` orders
        the batches (0, 1, ...). Without ``wait``: ``(-1, no rows)`` at once, taking
        nothing (a call that only readies the caller's ``RemoteCall``: tfsync.engine.links)."""
        with tf.device(self.device):
            return tf.cond(wait, self._take_batch,
                           lambda: (tf.constant(-1, tf.int64), tf.zeros([0, ROW_LEN], tf.float64)))

    def _take_batch(self):
        with tf.device(self.device):
            number = self.drain_turn.dequeue()
            with tf.control_dependencies([number]):
                first = self.done.dequeue()
            with tf.control_dependencies([first]):   # the rest: there now, taken at once
                rest = self.done.dequeue_many(self.done.size())
            with tf.control_dependencies([rest]):
                passed = self.drain_turn.enqueue(number + 1)
            with tf.control_dependencies([passed]):
                return tf.identity(number), tf.concat([first[None], rest], 0)

    def _close_finished(self):
        """End a ``drain`` and ``rounds`` that wait (they fail with OutOfRangeError)."""
        with tf.device(self.device):
            self.done.close(cancel_pending_enqueues=True)
            self.round_rows.close(cancel_pending_enqueues=True)
            self.drain_turn.close(cancel_pending_enqueues=True)
            return tf.constant(True)

    def _set_sizes(self, sizes):
        """``[version, batch size of each worker]``: the rounds ``rounds`` opens from now on
        grant these sizes, if ``version`` is above the one the call began with."""
        with tf.device(self.device):
            self.round_sizes.assign(sizes)
            return tf.constant(True)

    def _rounds(self, k, epoch, tokens, version):
        """Close up to ``k`` BSP rounds on the PS, one after another, without the
        coordinator: take the round's rows (one per member, each put there after its
        push), apply the weighted mean, release ``tokens`` (the next round's, one row per
        member as for ``release``; round and step numbers advance by one per round, batch
        sizes are ``set_sizes``'s once it set a version above ``version``) unless this is
        the k-th round or ``halt(epoch)`` came (k = 0: none), then pass the rows on to the coordinator's
        queue followed by a marker row ``[-1, members, ROUND, round, released, start, end,
        sizes' version, updates, rate, 0]`` (``start``: the round's rows taken; ``end``: the
        update read back, just before the next round's release; on the PS clock). Returns
        the rounds closed."""
        n = tf.shape(tokens)[0]
        step = tf.constant([0, 0, 0, 1, 1], tf.int64)
        with tf.device(self.device):
            def next_round(i):
                following = tokens + tf.cast(i, tf.int64) * step
                latest = self.round_sizes.read_value()
                newer = latest[0] > version
                sizes = tf.where(newer, tf.gather(latest[1:], following[:, 0]), following[:, 1 + BATCH])
                following = tf.concat([following[:, :1 + BATCH], sizes[:, None], following[:, 2 + BATCH:]], 1)
                return following, tf.where(newer, latest[0], version)

            def body(i, _):
                rows = self.round_rows.dequeue_many(n)
                with tf.control_dependencies([rows]):   # each push reads its rate after its apply_grad
                    start = tf.timestamp()
                    flat = self.accumulator.take_grad(n)
                # every op of the update after the take: the loop's next iteration starts at once,
                # and its reads and iterations.assign_add would otherwise run while the round computes
                with tf.control_dependencies([flat]):
                    used = apply_update(self.optimizer, weighted_mean(flat, self.variables, self.sizes),
                                        self.variables, self.rate)
                with tf.control_dependencies(read_back(self.optimizer, self.variables)):
                    more = tf.logical_and(i + 1 < k, self.halted.read_value() < epoch)
                    following, sized = next_round(i)
                    end = tf.timestamp()   # before the release: no worker holds the round's token yet
                with tf.control_dependencies([end]):
                    released = tf.cond(more, lambda: self._release(following), lambda: tf.constant(False))
                closed = tf.cast(tokens[0, 1 + ROUND] - 1 + tf.cast(i, tf.int64), tf.float64)
                marker = tf.stack([tf.constant(-1.0, tf.float64), tf.cast(n, tf.float64),
                                   tf.constant(float(MODE_ROUND), tf.float64), closed,
                                   tf.cast(released, tf.float64), start, end,
                                   tf.cast(sized, tf.float64), tf.cast(self.optimizer.iterations, tf.float64),
                                   tf.cast(used, tf.float64), tf.constant(0.0, tf.float64)])
                with tf.control_dependencies([released]):
                    passed = self.done.enqueue_many(tf.concat([rows, marker[None]], 0))
                with tf.control_dependencies([passed]):
                    return i + 1, tf.identity(more)

            closed, _ = tf.while_loop(lambda i, more: more, body, (tf.constant(0), k > 0))
            return closed

    def halt(self, epoch: int) -> None:
        """Stop ``rounds`` call ``epoch`` after the round in flight (it releases no more)."""
        with tf.device(self.device):
            self.halted.assign(epoch)

    def set_round(self, round_: int) -> None:
        with tf.device(self.device):
            self.accumulator.set_global_step(round_)


def remote_call(device: str, function, args):
    """``function`` (a concrete function traced under ``tf.device(device)``) run on
    ``device`` as one ``RemoteCall``, inside a function of another task: the call's
    inputs go with the request and the outputs come back in the answer, one round trip
    (its captured variables and queues are passed as the call's last arguments, as
    RemoteCall takes them)."""
    target = tf.DeviceSpec(replica=0, device_type="CPU", device_index=0).make_merged_spec(
        tf.DeviceSpec.from_string(device)).to_string()
    return tf.raw_ops.RemoteCall(target=target, args=list(args) + function.captured_inputs,
                                 Tout=[o.dtype for o in function.outputs], f=function)


class _OnPS:
    """A coordinator-side control function that the PS runs as a whole: called (and
    traced) with the PS as the default device. Called from the coordinator's default
    device instead, it is a function of two parts, the coordinator's and the PS's, and
    a call costs the coordinator 4 round trips to the PS, not 2 (a release: 96 against
    56 ms at 10 ms a node)."""

    def __init__(self, device: str, fn, input_signature):
        self.device = device
        self._function = tf.function(fn, input_signature=input_signature, autograph=False)

    def __call__(self, *args):
        with tf.device(self.device):
            return self._function(*args)


def enqueued(queue, row):
    with tf.control_dependencies([queue.enqueue(row)]):
        return tf.constant(True)


def token_rows(grants, round_: int, seqs, mode: int | None = None) -> np.ndarray:
    """Rows ``[worker, batch, mode, round, seq]`` for ``release``/``barrier`` (``mode``:
    every row's, else each grant's own)."""
    rows = np.zeros((len(grants), TOKEN_LEN + 1), np.int64)
    for r, (g, seq) in enumerate(zip(grants, seqs)):
        own = MODE_AGGREGATE if g.mode.value == "aggregate" else MODE_APPLY
        rows[r] = (g.worker, g.batch_size, own if mode is None else mode, round_, seq)
    return rows


def noop_rows(num_workers: int, per_worker: int) -> np.ndarray:
    rows = np.zeros((num_workers * per_worker, TOKEN_LEN + 1), np.int64)
    rows[:, 0] = np.repeat(np.arange(num_workers), per_worker)
    rows[:, 4] = -1
    return rows
