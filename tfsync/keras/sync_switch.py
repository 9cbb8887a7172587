"""Sync-Switch inside ``model.fit``: BSP for the first part of the steps, then ASP (or either alone).

    with strategy.scope():
        sync = SyncSwitch(strategy, num_workers=2, plan=[{"name": "bsp", "until": 0.5}, "asp"])
        model = sync.wrap(build_model())          # trains build_model()'s own weights
        model.compile(optimizer=tf_keras.optimizers.SGD(eta, momentum=0.9), loss=...)
    model.fit(DatasetCreator(fn), epochs=E, steps_per_epoch=S, callbacks=[sync.callback()])

Under ParameterServerStrategy, ``fit`` schedules one closure per step on whichever worker
is idle (closures cannot be pinned), and ``schedule`` does not wait, so batch hooks fire
well ahead of the steps they announce. So BSP is built into the train step, in the manner
of TF1's SyncReplicasOptimizer, with everything that decides on the PS:

- a token queue on PS task 0 holds ``[round, index]`` tokens, ``num_workers`` per round,
  leader (index 0) last. A BSP step dequeues one (blocks until its round is open), reads
  the weights after it, and pushes ``[|B| g (flattened), |B|]`` with ``local_step=round``
  into a ConditionalAccumulator; the accumulator averages, so the ratio of the two parts
  is the batch-weighted mean gradient whatever count it holds.
- the step holding the leader token takes the round's ``num_workers`` pushes
  (``take_grad`` blocks until all are in), applies the mean with ``update_step``, reads
  every updated variable back, and only then enqueues the next round's tokens. Every
  gradient of a round is computed on the same weights, so this is real aggregated BSP:
  one update per ``num_workers`` steps. A fast worker may take two tokens of one round;
  that is still BSP (same weights), only the work is not spread evenly.
- the switch happens on the PS, not on the coordinator: the leader of round
  ``switch_round - 1`` (or any leader once ``request_switch()`` set the flag) sets the
  learning rate back to eta, sets the mode to ASP and enqueues ``release_slack`` tokens
  with round -1, which let steps already waiting in ``dequeue`` run as ASP. Later steps
  read mode == ASP and apply their own gradient at once. A coordinator-side flag set in
  ``on_train_batch_begin`` would fire up to an epoch early, because scheduling runs ahead.

The plan (``tfsync.keras.plan``) may also be BSP throughout (``["bsp"]``: the switch round
is never reached) or ASP throughout (``["asp"]``: the mode is ASP from the start, no token
is ever taken); ``switch_at=f`` is ``[{"name": "bsp", "until": f}, "asp"]``. SSP, ASP
before BSP and the engine's other protocols are refused there, with the reason.

Configuration policy (Sync-Switch section IV-C): the learning rate is ``bsp_lr_scale * eta``
(default ``num_workers * eta``) during BSP and eta after the switch; momentum is kept.
``eta`` is the optimizer's number or its LearningRateSchedule at the update's
``iterations`` (``rate()``: the rate of the next update), as ``apply_gradients`` would use.

``apply_gradients`` does a merge_call that fails inside ``tf.cond`` under this strategy,
so updates call ``optimizer.update_step`` per variable, after the rate, clipping and
weight decay that ``apply_gradients`` would apply (``engine.control.apply_update``); an
optimizer with ``use_ema`` is refused. Leader-last
tokens mean an epoch whose step count is not a multiple of ``num_workers`` does not
deadlock: the partial round's pushes wait in the accumulator for the next epoch (or fit;
a partial round left at the very end is never applied). A step lost to a worker failure
during BSP loses its token and stalls its round (not handled). Save ``model.inner``.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math

import numpy as np
import tensorflow as tf
import tf_keras as keras

from ..engine import tfcompat
from ..engine.control import LearningRate, apply_update, check_optimizer, read_back, weighted_flat, weighted_mean
from .plan import parse

logger = logging.getLogger(__name__)

BSP, ASP = 0, 1
_NEVER = 2**62
_uid = itertools.count()


class SyncSwitch:
    """PS-side state of one job's plan (BSP, ASP, or BSP then ASP); see the module docstring.

    ``plan``: a job file's [[protocol]] list as Python, e.g. ``["asp"]`` or
    ``[{"name": "bsp", "until": 0.3}, "asp"]`` (``tfsync.keras.plan``); ``switch_at=f``
    is short for ``[{"name": "bsp", "until": f}, "asp"]``; neither: BSP, ASP at 0.5.
    """

    def __init__(self, strategy, num_workers: int, switch_at: float | None = None,
                 bsp_lr_scale: float | None = None, release_slack: int | None = None,
                 device: str = "/job:ps/task:0", *, plan=None):
        self.plan = parse(plan, switch_at)  # first: a plan it cannot honour is refused here
        # ParameterServerStrategyV2 leaves the public ``cluster_resolver`` None (TF 2.21).
        resolver = tfcompat.cluster_resolver(strategy)
        have = resolver.cluster_spec().num_tasks("worker") if resolver is not None else None
        if have is not None and have != num_workers:
            raise ValueError(f"num_workers={num_workers} but the strategy's cluster has {have} "
                             "workers; a BSP round aggregates num_workers gradients: pass the real count")
        self.strategy, self.num_workers, self.switch_at = strategy, int(num_workers), self.plan.switch_at
        self.bsp_lr_scale = float(num_workers if bsp_lr_scale is None else bsp_lr_scale)
        self.release_slack = int(2 * num_workers if release_slack is None else release_slack)
        if self.release_slack < num_workers - 1:
            raise ValueError(f"release_slack={release_slack} < num_workers - 1: a step waiting "
                             "for a token at the switch could block forever")
        self.device = device
        self.history: list[dict] = []
        self.switched_at_step: int | None = None
        self.model = self.optimizer = self.accumulator = None
        with strategy.scope():
            i64 = dict(dtype=tf.int64, trainable=False)
            first = BSP if self.plan.first == "bsp" else ASP
            self.mode = tf.Variable(first, name="sync_mode", **i64)          # 0 BSP, 1 ASP
            self.switch_flag = tf.Variable(0, name="sync_switch_flag", **i64)  # switch now
            self.switch_round = tf.Variable(_NEVER, name="sync_switch_round", **i64)
            self.rounds = tf.Variable(0, name="sync_rounds", **i64)          # BSP updates done
            self.switch_step = tf.Variable(-1, name="sync_switch_step", **i64)  # BSP steps run
        with tf.device(device):
            self.tokens = tf.queue.FIFOQueue(1 << 16, [tf.int64], shapes=[[2]], name="sync_tokens")

    # -- user API --------------------------------------------------------------------------
    def wrap(self, model: keras.Model) -> keras.Model:
        """A Model training ``model``'s own layers with this protocol; compile and fit it."""
        return _SyncSwitchModel(model, self)

    def callback(self) -> keras.callbacks.Callback:
        return _SyncSwitchCallback(self)

    def request_switch(self) -> None:
        """Switch at the end of the BSP round in progress (online timing policies)."""
        if self.switch_at is None:
            raise ValueError(f"request_switch(): the plan is {self.plan.first} throughout, with no switch "
                             "to ASP; give plan=[{'name': 'bsp', 'until': f}, 'asp'] to have one")
        self.switch_flag.assign(1)

    # -- set-up (from the wrapped model's compile) ------------------------------------------
    def _attach(self, model, optimizer) -> None:
        check_optimizer(optimizer)
        variables = list(model.trainable_variables)
        if not variables:
            raise ValueError("the wrapped model has no trainable weights yet: build it before compile "
                             "(start it with keras.Input(shape), or call it on a batch)")
        if self.model is not None and [v.ref() for v in variables] != self._var_refs:
            raise ValueError("this SyncSwitch already serves another model; create one per model")
        with self.strategy.scope():
            optimizer.build(variables)
            if optimizer is not self.optimizer:  # the optimizer's number or schedule, scaled in BSP
                bsp = int(self.mode.numpy()) == BSP
                self.rate = LearningRate(optimizer, scale=self.bsp_lr_scale if bsp else 1.0)
        self.optimizer = optimizer
        if self.model is None:
            self.model, self._var_refs = model, [v.ref() for v in variables]
            self.sizes = [int(np.prod(v.shape)) for v in variables]
            with tf.device(self.device):
                self.accumulator = tf.compat.v1.ConditionalAccumulator(
                    tf.float32, shape=[sum(self.sizes) + 1],
                    shared_name=f"tfsync_sync_switch_{next(_uid)}", name="sync_accumulator")
                if self.plan.first == "bsp":
                    self.tokens.enqueue_many(self._round_tokens(0))

    def _round_tokens(self, round_):
        """``num_workers`` tokens of one round, the leader (index 0) last."""
        index = tf.constant(list(range(1, self.num_workers)) + [0], tf.int64)
        return tf.stack([tf.fill([self.num_workers], tf.cast(round_, tf.int64)), index], 1)

    def _start(self, total_steps: int) -> int | None:
        """From the callback: fix the switch round; returns the BSP step count planned."""
        if int(self.mode.numpy()) == ASP or self.switch_at is None:
            return None  # ASP already, or BSP throughout (switch_round stays _NEVER)
        bsp_rounds = int(math.floor(self.switch_at * total_steps / self.num_workers + 0.5))
        if bsp_rounds == 0:  # no BSP at all: nothing runs yet, switch from here
            self.rate.scale.assign(1.0)
            self.mode.assign(ASP)
            self.switch_step.assign(0)
        else:
            self.switch_round.assign(int(self.rounds.numpy()) + bsp_rounds)
        return bsp_rounds * self.num_workers

    # -- worker side (inside the train step) ------------------------------------------------
    def _gate(self):
        """A BSP token (blocks until its round opens) or ``[-1, -1]`` in ASP mode."""
        def dequeue():
            with tf.device(self.device):
                return self.tokens.dequeue()
        return tf.cond(tf.equal(self.mode, BSP), dequeue, lambda: tf.constant([-1, -1], tf.int64))

    def _push(self, grads, batch_size, token):
        opt, variables = self.optimizer, self.model.trainable_variables

        def apply(gs):
            apply_update(opt, gs, variables, self.rate)
            return read_back(opt, variables)

        def leader():
            with tf.device(self.device):
                flat = self.accumulator.take_grad(self.num_workers)
                mean = weighted_mean(flat, variables, self.sizes)
            done = apply(mean)
            with tf.control_dependencies(done):  # release only after every update landed
                nxt = token[0] + 1
                self.rounds.assign(nxt)
                switch = (self.switch_flag > 0) | (nxt >= self.switch_round)
                return tf.cond(switch, lambda: self._switch(nxt), lambda: self._open(nxt))

        def bsp():
            flat = weighted_flat(grads, batch_size)
            with tf.device(self.device):
                pushed = self.accumulator.apply_grad(flat, local_step=token[0])
            with tf.control_dependencies([pushed]):
                return tf.cond(tf.equal(token[1], 0), leader, lambda: tf.constant(False))

        def asp():
            with tf.control_dependencies(apply(grads)):
                return tf.constant(False)

        return tf.cond(token[0] < 0, asp, bsp)

    def _open(self, round_):
        with tf.device(self.device):
            with tf.control_dependencies([self.tokens.enqueue_many(self._round_tokens(round_))]):
                return tf.constant(False)

    def _switch(self, round_):
        with tf.control_dependencies([self.rate.scale.assign(1.0)]):
            ops = [self.mode.assign(ASP), self.switch_step.assign(round_ * self.num_workers)]
        with tf.control_dependencies(ops), tf.device(self.device):
            release = tf.fill([self.release_slack, 2], tf.constant(-1, tf.int64))
            with tf.control_dependencies([self.tokens.enqueue_many(release)]):
                return tf.constant(True)


class _SyncSwitchModel(keras.Model):
    """Delegates ``call`` to the user's model, so its layers and weights are trained."""

    def __init__(self, inner: keras.Model, sync: SyncSwitch, **kwargs):
        super().__init__(name=kwargs.pop("name", f"sync_switch_{inner.name}"), **kwargs)
        self.inner = inner
        self._sync = sync
        self._evaluation = None

    def call(self, inputs, training=None, mask=None):
        return self.inner(inputs, training=training, mask=mask)

    def compile(self, *args, **kwargs):
        super().compile(*args, **kwargs)
        self._sync._attach(self, self.optimizer)
        self._evaluation = None
        given = inspect.signature(keras.Model.compile).bind(self, *args, **kwargs).arguments
        self._compiled_with = {k: v for k, v in given.items()   # what the local copy is compiled with
                               if k in ("loss", "metrics", "loss_weights", "weighted_metrics")}

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None, steps=None,
                 callbacks=None, return_dict=False, **kwargs):
        """``model.evaluate`` on the trained weights, for arrays or a ``tf.data.Dataset``, as
        one process would: ParameterServerStrategy evaluates only a DatasetCreator with
        ``steps``, so the weights are copied from the PS into a model of the same
        architecture on the coordinator, compiled with this model's loss and metrics."""
        if isinstance(x, keras.utils.experimental.DatasetCreator):
            return super().evaluate(x, y, batch_size, verbose, sample_weight, steps, callbacks, return_dict=return_dict,
                                    **kwargs)
        local = self.local_copy()
        return local.evaluate(x, y, batch_size=batch_size, verbose=verbose, sample_weight=sample_weight, steps=steps,
                              callbacks=callbacks, return_dict=return_dict, **kwargs)

    def local_copy(self) -> keras.Model:
        """The wrapped model with its current weights, on this process, compiled as this one
        was (without the optimizer): to evaluate, predict or save without the cluster."""
        if tf.distribute.has_strategy():
            raise ValueError("evaluate (or local_copy) this model outside `strategy.scope()`: its copy must live "
                             "on this process, not on the parameter servers")
        if self._evaluation is None:
            self._evaluation = keras.models.clone_model(self.inner)
            self._evaluation.compile(**self._compiled_with)
        self._evaluation.set_weights(self.inner.get_weights())
        return self._evaluation

    def fit(self, *args, **kwargs):
        from .tensorboard import TensorBoard

        callbacks = kwargs.get("callbacks", args[5] if len(args) > 5 else None) or []
        for cb in callbacks:
            if isinstance(cb, keras.callbacks.TensorBoard) and not isinstance(cb, TensorBoard) \
                    and cb.update_freq != "epoch":
                logger.warning("tf_keras' TensorBoard writes no per-batch scalars under ParameterServerStrategy "
                               "(update_freq=%s is ignored there); tfsync.keras.TensorBoard(log_dir, "
                               "update_freq=%s, sync=sync) writes them, and the switch", cb.update_freq,
                               cb.update_freq)
        tf_logger = logging.getLogger("tensorflow")
        tf_logger.addFilter(_no_batch_timing)
        try:
            return super().fit(*args, **kwargs)
        finally:
            tf_logger.removeFilter(_no_batch_timing)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        token = self._sync._gate()
        with tf.control_dependencies([token]):  # weights are read after the round opens
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x, y, y_pred, sample_weight)
        self._validate_target_and_loss(y, loss)
        grads = tape.gradient(loss, self.trainable_variables)
        batch_size = tf.shape(tf.nest.flatten(x)[0])[0]
        pushed = self._sync._push(grads, batch_size, token)
        with tf.control_dependencies([pushed]):
            return self.compute_metrics(x, y, y_pred, sample_weight)


def _no_batch_timing(record: logging.LogRecord) -> bool:
    """Drops tf_keras' "Callback method `on_train_batch_end` is slow compared to the batch
    time": under ParameterServerStrategy a batch's time is that of scheduling it (a few
    microseconds, the step runs later on a worker), so every callback looks slow."""
    return "is slow compared to the batch time" not in record.getMessage()


class _SyncSwitchCallback(keras.callbacks.Callback):
    """Plans the switch at ``switch_at`` of ``epochs * steps`` and records what happened."""

    def __init__(self, sync: SyncSwitch):
        super().__init__()
        self._supports_tf_logs = True  # required for batch hooks under this strategy
        self.sync = sync
        self.planned_step: int | None = None
        self.scheduled = 0

    def on_train_begin(self, logs=None):
        steps, epochs = self.params.get("steps"), self.params.get("epochs")
        if not steps and self.sync.switch_at is not None:
            raise ValueError("SyncSwitch needs fit(..., steps_per_epoch=N) to place the switch")
        self.scheduled = 0
        self.planned_step = self.sync._start(int(steps or 0) * int(epochs))
        logger.debug("sync-switch planned after %s BSP steps", self.planned_step)

    def on_train_batch_begin(self, batch, logs=None):
        self.scheduled += 1  # batch hooks seen on the coordinator, which runs ahead of the steps
        if self.scheduled == self.planned_step:
            self.sync.history.append({"event": "switch_scheduled", "scheduled_step": self.scheduled})

    def on_epoch_end(self, epoch, logs=None):
        self._observe(epoch)

    def on_train_end(self, logs=None):
        self._observe(None)

    def _observe(self, epoch):
        sync = self.sync
        mode = "asp" if int(sync.mode.numpy()) == ASP else "bsp"
        sync.history.append({"event": "epoch_end" if epoch is not None else "train_end",
                             "epoch": epoch, "mode": mode, "rounds": int(sync.rounds.numpy()),
                             "learning_rate": float(sync.rate().numpy())})  # of the next update
        if mode == "asp" and sync.switched_at_step is None and int(sync.switch_step.numpy()) >= 0:
            sync.switched_at_step = int(sync.switch_step.numpy())
            logger.debug("sync-switch observed: ASP after %d BSP steps", sync.switched_at_step)
