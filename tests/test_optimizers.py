"""Every tf_keras optimizer trains on real tasks as it trains in one process: BSP rounds
(aggregated on the PS) then, through a hot switch, ASP (each push applied on arrival),
give the weights of the optimizer stepping on the same batches in one process, on a
two-input regression model of the user's kind (a dict of inputs, a loss of its own). One
worker, so that the order of ASP's pushes is known; uneven batches across workers are
the SGD and Adam tests' (tests/test_engine.py)."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tfsync.base import arrays
from tfsync.engine.generation import TrainSetup
from tfsync.engine.engine import Engine
from tfsync.engine.phase import Phase
from tfsync.policy import ASP, BSP, FixedSizer

pytestmark = pytest.mark.cluster

M = 16


class ClippedSGD(keras.optimizers.SGD):
    """A user's subclass: SGD whose update is computed on gradients clipped to +-0.05."""

    def update_step(self, gradient, variable):
        return super().update_step(tf.clip_by_value(gradient, -0.05, 0.05), variable)


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "sgd momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "sgd nesterov": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.05),
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1),
    "adamax": lambda: keras.optimizers.Adamax(0.05),
    "nadam": lambda: keras.optimizers.Nadam(0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "rmsprop momentum centered": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "ftrl": lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01),
    "lion": lambda: keras.optimizers.Lion(0.01),
    "adafactor": lambda: keras.optimizers.Adafactor(0.1),
    "user subclass": lambda: ClippedSGD(0.1, momentum=0.9),
}


def two_input_regression(n=64):
    """A model the suite uses nowhere else: two named inputs (a dict), one float output,
    and a loss of the user's own (squared error, per example)."""
    rng = np.random.default_rng(3)
    x = {"a": rng.normal(size=(n, 3)).astype(np.float32), "b": rng.normal(size=(n, 2)).astype(np.float32)}
    y = (x["a"] @ np.float32([0.5, -1.0, 2.0]) + x["b"] @ np.float32([1.5, 0.3]) + 0.1).astype(np.float32)

    def model_fn():
        a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
        h = keras.layers.Dense(4, activation="tanh", kernel_initializer=keras.initializers.GlorotUniform(seed=1))(
            keras.layers.Concatenate()([a, b]))
        return keras.Model({"a": a, "b": b},
                           keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=2))(h))

    def loss_fn(target, out):
        return tf.square(tf.reshape(out, [-1]) - tf.cast(target, out.dtype))

    return x, y, model_fn, loss_fn


def reference(optimizer_fn, updates: int):
    """The optimizer stepping in one process on batch k's first M rows, k = 0, 1, ..."""
    x, y, model_fn, loss_fn = two_input_regression()
    model, opt = model_fn(), optimizer_fn()
    for k in range(updates):
        k %= arrays.length(y) // M
        bx, by = arrays.take((x, y), slice(k * M, (k + 1) * M))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(by, model(bx)))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return model.get_weights()


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_optimizer_under_bsp_then_asp_equals_the_optimizer_in_one_process(tmp_path, name):
    x, y, model_fn, loss_fn = two_input_regression()
    setup = TrainSetup(model_fn, OPTIMIZERS[name], loss_fn, x, y, max_batch_size=M, shuffle=False)
    engine = Engine(setup, workers=1, run_dir=str(tmp_path), tensorboard=False, timeout_s=120)
    try:
        summary = engine.run([Phase(BSP(FixedSizer([M])), until=0.5), Phase(ASP(FixedSizer([M]), depth=1))],
                             total_samples=6 * M)
        weights = engine.final_weights()
    finally:
        engine.close()
    assert summary["updates"] == 6 and summary["optimizer_iterations"] == 6
    assert [p["protocol"] for p in summary["timeline"]] == ["bsp", "asp"]
    for got, want in zip(weights, reference(OPTIMIZERS[name], 6)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, switch", [("sgd momentum", "hot"), ("rmsprop momentum centered", "restart")])
def test_a_switchs_new_rate_factor_rescales_the_velocity_built_at_the_old(tmp_path, name, switch):
    """tf_keras's SGD and RMSprop keep the rate inside their velocity (m = momentum * m -
    lr * g): BSP at 4x the rate, then ASP at 1x, must go on as the optimizer in one
    process whose velocity is rescaled with the rate (Goyal et al.'s momentum correction),
    not with BSP's velocity applied at ASP's rate as if built there."""
    x, y, model_fn, loss_fn = two_input_regression()
    setup = TrainSetup(model_fn, OPTIMIZERS[name], loss_fn, x, y, max_batch_size=M, shuffle=False)
    engine = Engine(setup, workers=1, run_dir=str(tmp_path), tensorboard=False, timeout_s=120)
    try:
        engine.run([Phase(BSP(FixedSizer([M])), until=0.5, lr_scale=4.0),
                    Phase(ASP(FixedSizer([M]), depth=1), switch=switch)], total_samples=6 * M)
        weights = engine.final_weights()
    finally:
        engine.close()
    model, opt = model_fn(), OPTIMIZERS[name]()
    base = float(opt.learning_rate)
    for k in range(6):
        j = k % (arrays.length(y) // M) if switch == "hot" else k % 3   # (a restart's new tasks read afresh)
        bx, by = arrays.take((x, y), slice(j * M, (j + 1) * M))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(by, model(bx)))
        grads = tape.gradient(loss, model.trainable_variables)
        if k == 3:   # the switch
            for s in opt.momentums if hasattr(opt, "momentums") else opt._momentums:
                s.assign(s / 4.0)
        opt.learning_rate.assign(base * (4.0 if k < 3 else 1.0))
        opt.apply_gradients(zip(grads, model.trainable_variables))
    for got, want in zip(weights, model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("back", [4.0, None])
def test_an_undo_puts_the_velocity_back_at_the_rate_factor_it_was_kept_at(tmp_path, back):
    """BSP at 4x; the weights kept (at 4x) and an ASP step run, then two more at 1x (the
    velocity rescaled to it), then an undo back to BSP at 4x (``back``) or at the 1x in
    force (None): the kept velocity was built at 4x and comes back at the factor then in
    force, not rescaled from ASP's 1x once more, nor left at 4x under a rate of 1x. The 8
    counted updates equal SGD in one process on input blocks 0-3 at 4x, then 3, 0-2 at
    ``back`` (the undone steps read blocks 0-2; the input goes on). With ``back`` None the
    policy says it keeps weights (``keeps_weights``): the copy is made, and its functions
    run once, when the generation opens, and the weights stay as they were."""
    from tfsync.policy import NOTHING, Decision, Grant, PushMode

    class KeepsRescalesUndoes(BSP):
        stage = "bsp"
        keeps_weights = back is None

        def start(self, view):
            made.append(engine.generation._kept is not None)   # the copy, before any keep_weights
            return super().start(view)

        def on_push(self, push, view):
            if view.in_flight and self.stage != "bsp":
                return NOTHING
            if self.stage == "bsp" and not view.in_flight and view.updates == 3:
                self.stage = "kept"
                return Decision((Grant(0, M, PushMode.APPLY),), barrier=True, keep_weights=True)
            if self.stage == "kept":
                self.stage = "asp"
                return Decision((Grant(0, M, PushMode.APPLY),) * 2, lr_scale=1.0)
            if self.stage == "asp":
                self.stage = "after"
                return Decision(self.grants_for([0], view), undo=True, lr_scale=back)
            return super().on_push(push, view)

    x, y, model_fn, loss_fn = two_input_regression()
    sgd = OPTIMIZERS["sgd momentum"]
    setup = TrainSetup(model_fn, sgd, loss_fn, x, y, max_batch_size=M, shuffle=False)
    made = []
    engine = Engine(setup, workers=1, run_dir=str(tmp_path), tensorboard=False, timeout_s=120)
    try:
        summary = engine.run([Phase(KeepsRescalesUndoes(FixedSizer([M])), lr_scale=4.0)], total_samples=8 * M)
        weights = engine.final_weights()
    finally:
        engine.close()
    assert made[0] is (back is None)
    assert (summary["updates"], summary["optimizer_iterations"]) == (8, 8)
    model, opt = model_fn(), sgd()
    base = float(opt.learning_rate)
    for k, j in enumerate((0, 1, 2, 3, 3, 0, 1, 2)):
        if k == 4 and back is None:   # the undo: at 1x from here, the velocity with it
            for m in opt.momentums:
                m.assign(m / 4.0)
        opt.learning_rate.assign(base * (4.0 if k < 4 or back else 1.0))
        bx, by = arrays.take((x, y), slice(j * M, (j + 1) * M))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(by, model(bx)))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    for got, want in zip(weights, model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)   # (8 steps at 4x: round-off)
