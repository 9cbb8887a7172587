"""Fails loudly when a TensorFlow upgrade changes a private API tfsync relies on
(tfsync/engine/tfcompat.py lists them)."""

import inspect
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute.coordinator import cluster_coordinator
from tensorflow.python.distribute.coordinator import values as coordinator_values

from tfsync.engine import tfcompat

pytestmark = pytest.mark.unit


def test_tensorflow_is_the_pinned_version():
    assert tf.__version__.startswith("2.21."), "tfcompat.py was checked against TF 2.21 only"


def test_private_coordinator_apis_still_exist():
    assert "function" in inspect.signature(cluster_coordinator.Worker.create_resource).parameters
    assert callable(cluster_coordinator.Cluster.stop)
    src = inspect.getsource(cluster_coordinator.Cluster.__init__)
    assert "self.workers" in src, "ClusterCoordinator._cluster.workers is gone"
    assert "self._cluster = Cluster(" in inspect.getsource(cluster_coordinator.ClusterCoordinator.__init__)
    per_worker = coordinator_values.PerWorkerValues
    assert "values" in inspect.signature(per_worker.__init__).parameters
    # how schedule traces (tfcompat.trace_as_scheduled repeats it), and what a stop waits on
    closure = inspect.getsource(cluster_coordinator.Closure.__init__)
    assert "_select_worker_slice(0, self._args)" in closure and "map_structure(_maybe_as_type_spec" in closure
    assert "_being_scheduled = True" in inspect.getsource(cluster_coordinator.ClusterCoordinator.schedule)
    assert "_cluster_due_for_update_or_finish.set()" in inspect.getsource(
        cluster_coordinator.WorkerPreemptionHandler.wait_on_failure)


def test_optimizer_update_step_is_what_the_engine_calls():
    import tf_keras as keras
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    assert "update_step" in type(opt).__dict__, "tf_keras SGD no longer defines update_step"


def test_update_step_reads_the_rate_variable_the_engine_sets():
    """update_step takes its rate from tfcompat.rate_variable, constant or scheduled."""
    import tf_keras as keras
    for lr in (0.5, keras.optimizers.schedules.ExponentialDecay(0.5, 1, 0.5)):
        opt = keras.optimizers.SGD(lr)
        v = tf.Variable([1.0])
        opt.build([v])
        assert (tfcompat.lr_schedule(opt) is not None) == (not isinstance(lr, float))
        tfcompat.rate_variable(opt).assign(0.25)
        opt.update_step(tf.constant([1.0]), v)
        assert v.numpy()[0] == 0.75


def test_clipping_and_weight_decay_are_what_apply_gradients_does():
    """The engine's update (control.apply_update) equals apply_gradients for AdamW with
    clipnorm: same clipped gradient, same decayed weights, same rate."""
    import tf_keras as keras

    from tfsync.engine.control import LearningRate, apply_update
    grads = [tf.constant([3.0, 4.0])]
    ref, got = tf.Variable([1.0, -2.0]), tf.Variable([1.0, -2.0])
    for v, apply in ((ref, None), (got, apply_update)):
        opt = keras.optimizers.AdamW(0.1, weight_decay=0.5, clipnorm=1.0)
        opt.build([v])
        for _ in range(3):
            if apply is None:
                opt.apply_gradients(zip(grads, [v]))
            else:
                apply(opt, grads, [v], LearningRate(opt))
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-6)


def test_reading_answers_a_models_dense_reads_with_the_given_values_and_sums_the_gradients_of_both_paths():
    """The engine's step computes on the weights its call to the PS brought: a layer's
    kernel and a regularizer read the values given; an embedding's gather reads round
    them (the variable itself). Loss and gradients equal a plain step on a model whose
    dense weights are those values."""
    import tf_keras as keras

    model = keras.Sequential([keras.Input((2,), dtype="int32"), keras.layers.Embedding(10, 4), keras.layers.Flatten(),
                              keras.layers.Dense(3, kernel_regularizer=keras.regularizers.l2(0.1))])
    x = tf.constant([[1, 2], [3, 1]])
    model(x)
    variables = model.trainable_variables
    given = [tf.constant(v.numpy() + 0.5) for v in variables]

    @tf.function
    def step(values):
        with tfcompat.reading(variables, values), tf.GradientTape() as tape:
            tape.watch(values)
            loss = tf.reduce_sum(model(x) ** 2) + tf.add_n(model.losses)
        through, round_it = tape.gradient(loss, [values, variables])
        return loss, [tf.convert_to_tensor(tfcompat.summed(a, b)) for a, b in zip(through, round_it)]

    loss, grads = step(given)
    for v, value in zip(variables[1:], given[1:]):   # the reference: the dense weights set to the values
        v.assign(value)
    with tf.GradientTape() as tape:
        want = tf.reduce_sum(model(x) ** 2) + tf.add_n(model.losses)
    wanted = [tf.convert_to_tensor(g) for g in tape.gradient(want, variables)]
    assert abs(float(loss) - float(want)) < 1e-5
    for g, w in zip(grads, wanted):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
    assert all(getattr(tfcompat._innermost(v), "_cached_value") is None for v in variables)   # restored


def test_a_cancellation_cancels_only_the_functions_called_under_it_in_its_own_thread():
    """TF keeps the cancellation manager of a cancellable call in a module global: a
    function called in another thread meanwhile ran under it, so a step could be
    cancelled when another generation's links closed (tfcompat.cancellation_per_thread)."""
    from tensorflow.python.eager import cancellation

    tfcompat.cancellation_per_thread()
    q = tf.queue.FIFOQueue(4, [tf.int32], shapes=[[]])
    dequeue = tf.function(lambda: q.dequeue(), autograph=False).get_concrete_function()
    manager = cancellation.CancellationManager()
    entered, outcome = threading.Event(), {}

    def waits_under_the_manager():
        try:
            manager.get_cancelable_function(lambda: (entered.set(), dequeue())[1])()
        except tf.errors.CancelledError as e:
            outcome["cancelled"] = e

    other = threading.Thread(target=waits_under_the_manager, daemon=True)
    other.start()
    assert entered.wait(10)
    mine = {}
    mine_t = threading.Thread(target=lambda: mine.setdefault("value", int(dequeue())), daemon=True)
    mine_t.start()   # a plain call in a third thread, while the other waits under the manager
    time.sleep(0.5)
    manager.start_cancel()
    other.join(10)
    assert "cancelled" in outcome, "the cancelled call did not end"
    q.enqueue(7)
    mine_t.join(10)
    assert mine.get("value") == 7, "a call outside the cancelled manager was cancelled with it"
