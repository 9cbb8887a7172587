"""SyncSwitch: a user's own ``model.fit`` under ParameterServerStrategy trains BSP, then ASP.

One cluster (2 worker processes + 1 PS process) serves the whole module; each test builds
its own model and SyncSwitch on it. A watchdog turns a BSP deadlock into a loud failure.
"""

import faulthandler
import gc
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tfsync.engine import tfcompat
from tfsync.engine.cluster import LocalCluster, connect_strategy
from tfsync.keras import SyncSwitch
from tfsync.keras.sync_switch import ASP

pytestmark = pytest.mark.cluster

N = 2  # workers
SAMPLE = "tfsync/datasets/mnist_sample.npz"
WATCHDOG_S = 150  # a deadlocked round would block fit forever; raise this on a slow machine


@pytest.fixture(scope="module")
def strategy():
    cluster = LocalCluster(workers=N, ps=1).start()
    coordinator = None
    try:
        strategy = connect_strategy(cluster)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        yield strategy
    finally:
        gc.collect()  # free PS resources while the PS still answers
        if coordinator is not None:
            tfcompat.stop_coordinator(coordinator)
        cluster.stop()


@pytest.fixture(autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True, file=sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def mnist():
    with np.load(Path(__file__).resolve().parents[1] / SAMPLE) as d:
        x, y = d["x_train"][:2000].reshape(2000, -1), d["y_train"][:2000].astype(np.int64)
        xt, yt = d["x_test"].reshape(len(d["x_test"]), -1), d["y_test"].astype(np.int64)
    return x, y, xt.astype(np.float32) / 255, yt


def _creator(x, y, batch):
    """uint8 images travel in the dataset graph; workers scale them (4x smaller graphs)."""
    def dataset_fn(_):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y))
        ds = ds.repeat().batch(batch, drop_remainder=True)
        return ds.map(lambda a, b: (tf.cast(a, tf.float32) / 255, b)).prefetch(2)
    return keras.utils.experimental.DatasetCreator(dataset_fn)


def _linear(seed=0):
    init = keras.initializers.GlorotUniform(seed=seed)
    return keras.Sequential([keras.layers.Input((784,)), keras.layers.Dense(10, kernel_initializer=init)])


def _build(strategy, eta, momentum, **kw):
    with strategy.scope():
        sync = SyncSwitch(strategy, N, **kw)
        model = sync.wrap(_linear())
        model.compile(optimizer=keras.optimizers.SGD(eta, momentum=momentum),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return sync, model


def test_a_learning_rate_schedule_is_followed_and_scaled_in_bsp(strategy, mnist):
    """With a LearningRateSchedule, update k uses schedule(k) (times n in BSP), as
    apply_gradients would; before, the rate stayed at its first value."""
    x, y, _, _ = mnist
    sched = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=4, decay_rate=0.5)
    with strategy.scope():
        sync = SyncSwitch(strategy, N, switch_at=0.5)
        model = sync.wrap(_linear())
        model.compile(optimizer=keras.optimizers.SGD(sched),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert sync.rate().numpy() == pytest.approx(N * 0.05)
    model.fit(_creator(x, y, 32), epochs=1, steps_per_epoch=8, callbacks=[sync.callback()], verbose=0)
    k = int(model.optimizer.iterations.numpy())
    assert k == 8 // 2 // N + 4  # BSP rounds, then ASP updates
    assert model.optimizer.learning_rate.numpy() == pytest.approx(float(sched(k - 1)), rel=1e-6)  # the last update's
    assert sync.rate().numpy() == pytest.approx(float(sched(k)), rel=1e-6)


def test_fit_trains_bsp_then_asp_at_the_requested_fraction(strategy, mnist):
    """3 epochs x 20 steps, switch at 0.5: steps 1-30 run as 15 BSP rounds of N pushes
    (one update each, LR n*eta), steps 31-60 as 30 ASP updates (LR eta, momentum kept)."""
    x, y, xt, yt = mnist
    eta = 0.05
    sync, model = _build(strategy, eta, 0.9, switch_at=0.5)
    assert sync.rate().numpy() == pytest.approx(N * eta)  # BSP: n * eta
    cb = sync.callback()
    hist = model.fit(_creator(x, y, 32), epochs=3, steps_per_epoch=20, callbacks=[cb], verbose=0)

    bsp_steps, total = 30, 60
    assert cb.planned_step == bsp_steps
    assert sync.switched_at_step == bsp_steps
    assert int(sync.rounds.numpy()) == bsp_steps // N  # every BSP update took N gradients
    assert int(model.optimizer.iterations.numpy()) == bsp_steps // N + (total - bsp_steps)
    assert int(sync.mode.numpy()) == ASP
    assert model.optimizer.learning_rate.numpy() == pytest.approx(eta)
    assert float(model.optimizer.momentum) == pytest.approx(0.9)
    ends = [h for h in sync.history if h["event"] == "epoch_end"]
    assert [h["mode"] for h in ends] == ["bsp", "asp", "asp"]
    assert [h["rounds"] for h in ends] == [10, 15, 15]
    assert ends[0]["learning_rate"] == pytest.approx(N * eta)
    assert any(h["event"] == "switch_scheduled" for h in sync.history)

    loss, acc = hist.history["loss"], hist.history["accuracy"]
    assert loss[-1] < loss[0] and acc[-1] > 0.6
    local = _linear(seed=1)
    local.set_weights(model.inner.get_weights())  # the user's model holds the trained weights
    test_acc = np.mean(np.argmax(local(xt).numpy(), 1) == yt)
    assert test_acc > 0.6, f"held-out accuracy {test_acc:.3f} (chance 0.1)"


def test_bsp_rounds_equal_single_process_sgd_on_the_mean_gradient(strategy, mnist):
    """Every input batch is the same 16 examples, so each BSP round must equal one SGD
    (momentum) step at LR n*eta on that batch, computed on the weights the previous round
    left: a gradient read before the last update landed, an update applied per push, or a
    push lost would all break the equality. 3 steps per epoch (odd), so round 1 spans
    the epoch boundary and must not deadlock the epoch's join."""
    x, y, _, _ = mnist
    xb, yb = x[:16], y[:16]
    eta, momentum = 0.5, 0.9
    sync, model = _build(strategy, eta, momentum, switch_at=1.0)
    w0 = model.inner.get_weights()

    def dataset_fn(_):
        ds = tf.data.Dataset.from_tensors((xb, yb)).repeat()
        return ds.map(lambda a, b: (tf.cast(a, tf.float32) / 255, b))

    model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=2, steps_per_epoch=3,
              callbacks=[sync.callback()], verbose=0)
    rounds = 6 // N
    assert int(sync.rounds.numpy()) == rounds
    assert int(model.optimizer.iterations.numpy()) == rounds
    assert sync.switched_at_step == 6  # switch_at=1.0: after the last round

    ref = _linear()
    ref.set_weights(w0)
    opt = keras.optimizers.SGD(N * eta, momentum=momentum)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    bx = tf.constant(xb.astype(np.float32) / 255)
    for _ in range(rounds):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, ref(bx))
        opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
    for got, want in zip(model.inner.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_bsp_update_is_the_mean_of_the_rounds_gradients(strategy):
    """The check above cannot tell a mean from the leader's own gradient (all gradients are
    equal there). Here each example is a random one-hot row e_i and the loss is the model
    output w.e_i, so a step's gradient is e_i whatever the weights: with LR n*eta per round
    of mean gradients, -w/eta counts how often each e_i was consumed, summing to the step
    count. Pushes applied one by one, summed, dropped, or only the leader's would give a
    sum of 16 or an all-even count vector. The rows come from each worker's clock: no
    per-worker identity reaches a dataset under this strategy (DESIGN.md), and a global
    seed would make unseeded shuffles equal on both workers."""
    d, eta, steps = 1024, 0.25, 8
    with strategy.scope():
        sync = SyncSwitch(strategy, N, switch_at=1.0)
        model = sync.wrap(keras.Sequential([keras.layers.Input((d,)),
                                            keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]))
        model.compile(optimizer=keras.optimizers.SGD(eta), loss=lambda y, p: p[:, 0])

    def dataset_fn(_):
        def row(_):
            t = tf.cast(tf.timestamp() * 1e6, tf.int64)
            i = tf.random.stateless_uniform([], tf.stack([t, t % 7919]), maxval=d, dtype=tf.int64)
            return tf.one_hot([i], d), tf.zeros([1])
        return tf.data.Dataset.range(1).repeat().map(row)

    model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=steps,
              callbacks=[sync.callback()], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == steps // N
    counts = -model.inner.get_weights()[0][:, 0] / eta
    np.testing.assert_allclose(counts, np.round(counts), atol=1e-5)
    counts = np.round(counts).astype(int)
    assert counts.sum() == steps and counts.min() >= 0
    assert (counts % 2).any(), f"every row counted an even number of times: {counts[counts > 0]}"


@pytest.mark.parametrize("how", ["request_switch", "switch_at_zero"])
def test_switch_now(strategy, mnist, how):
    """request_switch() ends BSP after the round in progress (here the first); switch_at=0
    switches before any step, with no BSP round at all."""
    x, y, _, _ = mnist
    eta = 0.05
    sync, model = _build(strategy, eta, 0.0, switch_at=1.0 if how == "request_switch" else 0.0)
    if how == "request_switch":
        sync.request_switch()
    model.fit(_creator(x, y, 32), epochs=1, steps_per_epoch=8, callbacks=[sync.callback()], verbose=0)
    rounds = 1 if how == "request_switch" else 0
    assert int(sync.rounds.numpy()) == rounds
    assert sync.switched_at_step == rounds * N
    assert int(model.optimizer.iterations.numpy()) == rounds + 8 - rounds * N
    assert model.optimizer.learning_rate.numpy() == pytest.approx(eta)


def test_rejects_a_worker_count_other_than_the_clusters(strategy):
    """Any count would run (only leaders wait, for pushes already dequeued), but a round
    of 3 pushes on 2 workers is not the BSP of the paper's configuration policy."""
    with pytest.raises(ValueError, match="num_workers=3"):
        SyncSwitch(strategy, 3)
    with pytest.raises(ValueError, match="switch_at"):
        SyncSwitch(strategy, N, switch_at=1.5)


def test_keras_tensorboard_callback_runs_beside_sync_switch(strategy, mnist, tmp_path):
    """`tensorboard` is installed with tfsync (TF 2.21 no longer brings it: the callback raised
    TBNotInstalledError): Keras's own TensorBoard callback logs a SyncSwitch fit, per epoch."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    x, y, _, _ = mnist
    sync, model = _build(strategy, 0.05, 0.0, switch_at=0.5)
    board = keras.callbacks.TensorBoard(log_dir=str(tmp_path / "tb"), update_freq="epoch")
    model.fit(_creator(x, y, 32), epochs=2, steps_per_epoch=8, callbacks=[sync.callback(), board], verbose=0)
    acc = EventAccumulator(str(tmp_path / "tb" / "train"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"]) | set(acc.Tags()["tensors"])
    assert {"epoch_loss", "epoch_accuracy"} <= tags, tags
    values = acc.Scalars("epoch_loss") if "epoch_loss" in acc.Tags()["scalars"] else \
        [types.SimpleNamespace(step=e.step, value=float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors("epoch_loss")]
    assert [e.step for e in values] == [0, 1] and all(np.isfinite(e.value) for e in values)
