"""Every private TensorFlow API tfsync relies on, in one place (TF 2.21 pinned in setup.py).

``tests/test_tfcompat.py`` fails loudly when a TF upgrade changes any of these.

- ``ClusterCoordinator._cluster.workers[i].create_resource``: a per-worker value that a
  scheduled closure receives for the worker that runs it. ``InputContext`` cannot tell a
  worker its index under ParameterServerStrategy (``input_pipeline_id`` is always 0, and a
  per-worker dataset function is traced once, on the coordinator), and closures cannot be
  pinned to a worker, so this is how a closure learns which worker it is on.
- ``coordinator_values.PerWorkerValues``: wraps those values for ``schedule``.
- ``ClusterCoordinator._cluster.stop()``: ends the coordinator's worker threads when a
  generation of the cluster is replaced (restart switch) or training ends; its
  ``failure_handler._cluster_due_for_update_or_finish``: set while TF waits for a failed
  worker to come back (``stop`` then blocks until it does).
- ``cluster_coordinator._select_worker_slice``, ``_maybe_as_type_spec`` and the strategy's
  ``extended._being_scheduled``: how ``schedule`` traces a function, which the warm-up
  repeats so that the first closure does not trace it again.
- ``ParameterServerStrategy._cluster_resolver``: the public property returns None.
- tf_keras optimizers' ``_learning_rate`` (a variable, or the LearningRateSchedule given)
  and ``_current_learning_rate`` (the variable ``update_step`` reads under a schedule):
  the engine calls ``update_step`` itself (``apply_gradients`` cannot run in its step),
  so it sets the rate of each update as ``apply_gradients`` would; and the base class's
  ``_clip_gradients`` and ``_apply_weight_decay`` (the subclass's weight decay goes
  through a strategy merge_call that cannot run inside the engine's step).
- A resource variable's ``_cached_value`` (what TF's caching device sets: ``value()``
  returns it instead of reading) and the wrapped variable of the strategy's
  (``AggregatingVariable._v``) and mixed precision's (``AutoCastVariable._variable``)
  wrappers: ``reading`` answers a model's reads with the weights the step brought.
- ``cancellation.CancellationManagerContext`` and ``cancellation.context``, replaced so
  that a cancellable call's manager is its thread's, not the process's
  (``cancellation_per_thread``).
"""

from __future__ import annotations

import contextlib
import sys
import threading

import tensorflow as tf
from tensorflow.python.distribute.coordinator import values as coordinator_values


def worker_index_values(coordinator, num_workers: int):
    """PerWorkerValues whose element on worker i is the int32 scalar i."""
    workers = coordinator._cluster.workers
    if len(workers) != num_workers:
        raise RuntimeError(f"coordinator has {len(workers)} workers, expected {num_workers}")
    remote = []
    for i, worker in enumerate(workers):
        fn = tf.function(lambda i=i: tf.constant(i, tf.int32))
        remote.append(worker.create_resource(fn))
    return coordinator_values.PerWorkerValues(tuple(remote))


def trace_as_scheduled(coordinator, function, *args) -> None:
    """Trace ``function`` as ``coordinator.schedule(function, args)`` traces it (in the
    strategy's scope, marked as being scheduled, on worker 0's slice of per-worker values
    with remote values as their type specs), so that the first closure runs this trace,
    not a second one (0.4 s a generation)."""
    from tensorflow.python.distribute.coordinator import cluster_coordinator
    as_spec = getattr(cluster_coordinator, "_maybe_as_type_spec", None)
    worker_slice = getattr(cluster_coordinator, "_select_worker_slice", None)
    extended = coordinator.strategy.extended
    if as_spec is None or worker_slice is None or not hasattr(extended, "_being_scheduled"):
        return   # another TF: the first schedule traces
    with coordinator.strategy.scope():
        extended._being_scheduled = True
        try:
            function.get_concrete_function(*tf.nest.map_structure(as_spec, worker_slice(0, args)))
        finally:
            extended._being_scheduled = False


def stop_coordinator(coordinator, timeout: float = 5.0, worker_lost=lambda: False) -> bool:
    """Stop the coordinator's closure-processing threads (daemons). After a worker died,
    ``Cluster.stop`` blocks on a lock its preemption handler holds while it waits for the
    worker to come back (which a new generation's cluster never does), so stop from a
    daemon thread and wait at most ``timeout``; not at all where the handler waits for a
    worker that ``worker_lost()`` says is dead (that wait would only ever end at the
    timeout: 5 s of every worker loss). A handler recovering from a passing error of a
    live worker is waited for."""
    cluster = getattr(coordinator, "_cluster", None)
    if cluster is None:
        return True
    due = getattr(getattr(cluster, "failure_handler", None), "_cluster_due_for_update_or_finish", None)
    hopeless = due is not None and due.is_set() and worker_lost()   # read before stop, which sets it too
    t = threading.Thread(target=cluster.stop, name="tfsync-stop-coordinator", daemon=True)
    t.start()
    t.join(0.1 if hopeless else timeout)
    return not t.is_alive()


def cluster_resolver(strategy):
    """The cluster resolver of a ParameterServerStrategy (its public property is None in
    TF 2.21 because ``extended`` has no ``_cluster_resolver``)."""
    return strategy.cluster_resolver or strategy._cluster_resolver


def lr_schedule(optimizer):
    """The optimizer's LearningRateSchedule, or None when its rate is a number."""
    import tf_keras as keras
    lr = getattr(optimizer, "_learning_rate", None)
    return lr if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule) else None


def rate_variable(optimizer) -> tf.Variable:
    """The variable ``update_step`` reads the learning rate from."""
    return optimizer._current_learning_rate if lr_schedule(optimizer) is not None else optimizer._learning_rate


def clip_gradients(optimizer, grads):
    """``grads`` clipped by the optimizer's clipnorm / global_clipnorm / clipvalue."""
    return optimizer._clip_gradients(list(grads))


def apply_weight_decay(optimizer, variables) -> None:
    """The optimizer's weight decay on ``variables`` (none when weight_decay is None)."""
    from tf_keras.src.optimizers.optimizer import _BaseOptimizer
    _BaseOptimizer._apply_weight_decay(optimizer, variables)


class _NadamProductDone:
    """Stands for Nadam's ``_u_product_counter`` (see :func:`nadam_product`): equal to any
    step, so every ``update_step`` reads the product the engine updated for the step."""

    def __eq__(self, other):
        return tf.constant(True)

    def __iadd__(self, other):
        return self

    __hash__ = object.__hash__


def nadam_product(optimizer) -> None:
    """Nadam's running product of its momentum schedule, advanced once for this update.
    tf_keras's Nadam advances it in the first ``update_step`` of a step and counts the
    calls in a Python int, which a traced update (the engine's, and ``model.fit``'s own)
    freezes at its trace: from the second step on every variable advanced it again, so
    a model of k variables took the product k times a step. Here it advances once per
    update, before the variables' updates, which read it as the eager optimizer does."""
    import tf_keras as keras
    if not isinstance(optimizer, keras.optimizers.Nadam):
        return
    if not isinstance(optimizer._u_product_counter, _NadamProductDone):
        optimizer._u_product_counter = _NadamProductDone()
    product = optimizer._u_product
    step = tf.cast(optimizer.iterations + 1, product.dtype)
    u_t = tf.cast(optimizer.beta_1, product.dtype) * (1.0 - 0.5 * tf.pow(tf.cast(0.96, product.dtype), step))
    product.assign(product * u_t)


def quiet_resource_deleters() -> None:
    """TF frees remote resources in ``__del__``; once their tasks are gone that fails
    harmlessly but prints a traceback per resource. Drop exactly those (idempotent)."""
    default = sys.unraisablehook
    if getattr(default, "_tfsync_quiet", False):
        return

    def hook(info):
        where = getattr(info.object, "__qualname__", "") or repr(info.object)
        if "Deleter" in where or "Executor.__del__" in where:
            return
        default(info)

    hook._tfsync_quiet = True
    sys.unraisablehook = hook


def _innermost(variable):
    """The resource variable under the strategy's and mixed precision's wrappers (each
    reads through the one it wraps)."""
    while True:
        inner = getattr(variable, "_v", None)
        if inner is None:
            inner = getattr(variable, "_variable", None)
        if inner is None:
            return variable
        variable = inner


@contextlib.contextmanager
def reading(variables, values):
    """While tracing: a dense read of each variable (``value()`` and a conversion to a
    tensor, as layers and regularizers read) gives its value from ``values`` instead of
    reading the variable. A read that goes round it (an embedding's ``sparse_read``,
    ``read_value``) still reads the variable: the gradients of both must be summed
    (``summed``)."""
    inner = [_innermost(v) for v in variables]
    saved = [v._cached_value for v in inner]
    try:
        for v, value in zip(inner, values):
            v._cached_value = value
        yield
    finally:
        for v, value in zip(inner, saved):
            v._cached_value = value


def summed(through, round_it):
    """A variable's gradient from ``reading``'s values and from its reads round them."""
    if through is None or round_it is None:
        return round_it if through is None else through
    return tf.convert_to_tensor(through) + tf.convert_to_tensor(round_it)


_cancel_local = threading.local()   # the cancellation manager of this thread's cancellable call


class _ThreadCancellationContext:
    """``cancellation.CancellationManagerContext``, with the manager kept per thread."""

    def __init__(self, manager):
        self._manager = manager
        self._outer = None

    def __enter__(self):
        self._outer = getattr(_cancel_local, "manager", None)
        _cancel_local.manager = self._manager

    def __exit__(self, *exc):
        _cancel_local.manager = self._outer


def _thread_cancellation_context():
    return getattr(_cancel_local, "manager", None)


def cancellation_per_thread() -> None:
    """Make a cancellable call's cancellation manager its own thread's (idempotent). TF
    keeps it in a module global (``cancellation._active_context``) that every function
    call in any thread reads: a call in another thread meanwhile runs under it, and is
    cancelled with it, or is left with a freed one. ClusterCoordinator's threads share one
    manager, so TF alone does not show it; the links' loops (tfsync.engine.links) and a
    replaced generation's coordinator bring others, so that a step could be cancelled when
    another generation's links closed."""
    from tensorflow.python.eager import cancellation
    cancellation.CancellationManagerContext = _ThreadCancellationContext
    cancellation.context = _thread_cancellation_context


def cancellation_manager():
    """A new ``CancellationManager`` (as ClusterCoordinator cancels its closures), with the
    managers made per thread first."""
    from tensorflow.python.eager import cancellation
    cancellation_per_thread()
    return cancellation.CancellationManager()
