"""One generation of the training cluster as the coordinator sees it.

A restart switch replaces the generation: new task processes (started while the old
ones still train), a new strategy and coordinator connected to them, the model and
optimizer rebuilt and restored from the checkpoint (Sync-Switch Fig. 9). A hot switch
keeps the generation.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tensorflow as tf

from ..base import arrays, nospace, safefile
from ..job.metrics import resolve as resolve_metrics
from ..base.pipeline import DatasetFactory, worker_index
from . import tfcompat
from .cluster import LocalCluster, connect_strategy
from .control import LearningRate, PSControl, check_optimizer
from .links import Links
from .step import make_step_fn

logger = logging.getLogger(__name__)


@dataclass
class TrainSetup:
    """What to train: everything the engine needs from a user or a job file.

    ``model_fn`` and ``optimizer_fn`` are called under the strategy's scope (variables go
    to the PS). ``loss_fn(y, logits)`` returns per-example losses. Every input batch
    holds ``max_batch_size`` rows; a step uses the first ``batch_size`` of them.
    ``x_train`` is an array (with its labels ``y_train``), or a
    ``tfsync.base.pipeline.DatasetFactory`` that each worker reads itself (``y_train`` None).
    Features and labels (and the test ones) may be tuples, lists or dicts of arrays, for
    several inputs or outputs, as with a factory (``tfsync.base.arrays``).
    ``metrics``: what the evaluator reports beside the loss (tf_keras Metric objects or
    classes, functions ``fn(y_true, y_pred)``, or the job file's names; ``tfsync.job.metrics``);
    None: accuracy where the labels are class ids.
    """

    model_fn: Callable
    optimizer_fn: Callable
    loss_fn: Callable
    x_train: np.ndarray
    y_train: np.ndarray
    max_batch_size: int
    shuffle: bool = True
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    meta: dict = field(default_factory=dict)
    metrics: list | None = None

    def __post_init__(self):
        self.metrics = resolve_metrics(self.metrics, "metrics")

    @property
    def factory(self) -> DatasetFactory | None:
        return self.x_train if isinstance(self.x_train, DatasetFactory) else None

    @property
    def train_examples(self) -> int:
        """The examples in one epoch."""
        return self.factory.examples if self.factory else arrays.length(self.y_train)


def _transport(x: np.ndarray):
    """Ship 8-bit images as uint8 (4x smaller), scale back on the worker."""
    if x.dtype == np.float32 and x.size and np.array_equal(np.round(x * 255) / 255, x):
        return np.round(x * 255).astype(np.uint8), 1.0 / 255
    return x, None


# What tf.io.decode_raw reads back (little-endian, as NumPy writes on this machine).
RECORD_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "bool")


def write_records(setup: TrainSetup, work_dir: str) -> dict:
    """Write the training arrays as fixed-length binary records that workers read with
    ``FixedLengthRecordDataset``: a graph constant of the data set would be shipped to
    every worker at every (re)connect, seconds for MNIST. The files go to
    ``work_dir/data/``, one per array (``train_x.bin``, ``train_y.bin``; ``train_x_0.bin``,
    ... for the arrays of a tuple, list or dict, in tf.nest's order); the dataset names them
    relative to the task's working directory (``files``), which is ``work_dir`` for tasks
    on this machine and the job's stage directory on other nodes, where the hooks were sent
    them (no shared filesystem). A dataset factory's workers read their own data: nothing
    is written."""
    if setup.factory:
        return {}
    n = arrays.length(setup.y_train)
    leaves = []  # one dict per array: its file and how to decode it
    for part in ("x", "y"):
        flat = tf.nest.flatten(getattr(setup, f"{part}_train"))
        for i, a in enumerate(flat):
            name = f"{part}_train" + (f"[{i}]" if len(flat) > 1 else "")
            a, scale = _transport(np.ascontiguousarray(a)) if part == "x" else (np.ascontiguousarray(a), None)
            if a.dtype.name not in RECORD_DTYPES:
                raise ValueError(f"{name} has dtype {a.dtype.name}; the engine takes "
                                 f"{', '.join(RECORD_DTYPES)} (convert it, e.g. with .astype(np.float32))")
            if a.dtype.byteorder == ">":
                raise ValueError(f"{name} is big-endian ({a.dtype.str}); convert it with .astype('{a.dtype.name}')")
            if len(a) != n:
                raise ValueError(f"{name} has {len(a)} examples but y_train {n}; expected one label per example")
            path = os.path.join("data", f"train_{part}" + (f"_{i}" if len(flat) > 1 else "") + ".bin")
            leaves.append({"part": part, "path": path, "array": a, "dtype": a.dtype.name, "shape": a.shape[1:],
                           "scale": scale})
    safefile.make_dir(os.path.join(work_dir, "data"))
    for leaf in leaves:
        write_record_file(os.path.join(work_dir, leaf["path"]), leaf.pop("array"))
    return {"files": tuple(leaf["path"] for leaf in leaves), "leaves": leaves, "n": n}


def write_record_file(path: str, a: np.ndarray) -> None:
    """``a``'s bytes at ``path``, unless the file there holds them already (a resumed run
    needs no space for its data again); a file that differs is removed first, so that the
    new one needs its own size free, not twice it."""
    if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) == a.nbytes:
        digest = hashlib.sha256(memoryview(a).cast("B")).hexdigest()
        if safefile.sha256(path) == digest:
            return
    if os.path.lexists(path):
        os.unlink(path)
    with nospace.writing("the training records", path, a.nbytes):
        with safefile.replacing(path, binary=True) as f:
            f.write(memoryview(a).cast("B"))  # (numpy's tofile loses the errno of a full disk)


def make_dataset_fn(setup: TrainSetup, records: dict, workers: int):
    """Each worker's input pipeline: the factory's dataset, or the records read back and
    decoded to the arrays' structure (``(features, labels)`` batches, as a factory gives)."""
    if setup.factory:
        factory = setup.factory
        return lambda: factory.dataset(workers).repeat().batch(setup.max_batch_size, drop_remainder=True).prefetch(2)
    leaves, n = records["leaves"], records["n"]

    def decode(*raw):  # a whole batch of records at once, one tensor per array
        values = []
        for r, leaf in zip(raw, leaves):
            v = tf.reshape(tf.io.decode_raw(r, tf.as_dtype(leaf["dtype"])), (-1, *leaf["shape"]))
            values.append(tf.cast(v, tf.float32) * leaf["scale"] if leaf["scale"] is not None else v)
        nx = sum(leaf["part"] == "x" for leaf in leaves)
        return (tf.nest.pack_sequence_as(setup.x_train, values[:nx]),
                tf.nest.pack_sequence_as(setup.y_train, values[nx:]))

    def dataset_fn():
        ds = tf.data.Dataset.zip(tuple(tf.data.FixedLengthRecordDataset(
            leaf["path"], int(np.prod(leaf["shape"])) * tf.as_dtype(leaf["dtype"]).size) for leaf in leaves))
        if setup.shuffle:
            ds = ds.shuffle(n, reshuffle_each_iteration=True)
        ds = ds.repeat()
        if setup.shuffle:
            # The shuffle's seed is fixed where the graph is traced, on the coordinator (from
            # tf.random.set_seed there), so every worker draws the same order: each starts
            # at its own offset in it, or BSP would average the same gradient n times.
            ds = ds.skip(tf.cast(worker_index(), tf.int64) * (n // workers))
        ds = ds.batch(setup.max_batch_size, drop_remainder=True)
        return ds.map(tf.autograph.experimental.do_not_convert(decode)).prefetch(2)   # (plain ops: 0.15 s less)

    return dataset_fn


_CHECKPOINT_IO = []


def checkpoint_io() -> "tf.train.CheckpointOptions":
    """Checkpoints are read and written by the coordinator, in its run directory: TF would
    place each variable's save and restore op on its PS, which writes to the PS node's own
    filesystem (another machine has no such run directory, and a PS started on another
    node would not find it). One object for the process: the saver's traced function is
    cached per options object, and a new trace is sent to every task (a stalled one, on a
    partitioned node, would hold the save)."""
    if not _CHECKPOINT_IO:
        _CHECKPOINT_IO.append(tf.train.CheckpointOptions(
            experimental_io_device="/job:chief/replica:0/task:0/device:CPU:0"))
    return _CHECKPOINT_IO[0]


def tunable_momentum(optimizer) -> bool:
    """Whether the engine sets ``optimizer``'s momentum during training (the momentum rule
    of a switch, Sync-Switch §IV-C): SGD's, which its update reads as a number each step.
    RMSprop's is fixed at build (its update branches on it in Python and keeps a momentum
    slot only when it is > 0), and the other optimizers have none (Adam's betas are not
    a momentum the rules speak of): theirs stay as the optimizer was made."""
    import tf_keras as keras
    return isinstance(optimizer, keras.optimizers.SGD)


def rate_bearing_slots(optimizer) -> list:
    """The optimizer's slots that carry the learning rate inside them: tf_keras's SGD keeps
    its velocity as ``m = momentum * m - lr * g`` (``w += m``), RMSprop its momentum
    likewise, so that a velocity built at one rate is applied at the next as if the rate
    had not changed. TF1's MomentumOptimizer, which the Sync-Switch paper ran, keeps the
    rate outside (``w -= lr * m``). When tfsync changes its rate factor (a switch, a
    scale), these are rescaled with it: Goyal et al. 2017, "Accurate, Large Minibatch SGD",
    §2.2, momentum correction: without it, BSP's velocity at n times ASP's rate goes into
    ASP's first updates n times too large. (The spike of the training loss a second into
    auto's ASP trials on the testbed's MLP, 0.4 to 3-5, is not this: it stayed with the
    correction, and went with ASP at momentum 0.5.) Adam's moments and the other
    optimizers' slots hold gradients only; FTRL's are left as they are."""
    import tf_keras as keras
    if isinstance(optimizer, keras.optimizers.SGD):
        return list(optimizer.momentums)
    if isinstance(optimizer, keras.optimizers.RMSprop):
        return list(optimizer._momentums)
    return []


def _rescaled(slots):
    """A function that multiplies ``slots`` by a factor, each where it lives."""
    def rescale(factor):
        for s in slots:
            with tf.device(s.device):
                s.assign(s * tf.cast(factor, s.dtype))
    return tf.function(rescale, input_signature=[tf.TensorSpec([], tf.float32)], autograph=False)


class Generation:
    def __init__(self, cluster: LocalCluster, setup: TrainSetup, records: dict):
        self.cluster = cluster
        self.num_workers = len(cluster.spec["worker"])
        self.strategy = connect_strategy(cluster)
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.strategy)
        with self.strategy.scope():
            self.model = setup.model_fn()
            self.optimizer = setup.optimizer_fn()
            check_optimizer(self.optimizer)
            self.optimizer.build(self.model.trainable_variables)
            momentum = float(getattr(self.optimizer, "momentum", 0.0) or 0.0)
            self.momentum = tf.Variable(momentum, trainable=False, name="momentum")
            self.momentum_tunable = tunable_momentum(self.optimizer)
            if self.momentum_tunable:
                self.optimizer.momentum = self.momentum  # read per update: changeable at a switch
            self.rate = LearningRate(self.optimizer)  # the engine sets its scale
        slots = rate_bearing_slots(self.optimizer)
        self._rescale_fn = _rescaled(slots) if slots else None
        self._scale = 1.0   # the rate factor the rate-bearing slots were built at
        self._kept_scale = 1.0   # ... those of the kept copy (keep_weights)
        self.control = PSControl(self.num_workers, self.model, self.optimizer, self.rate)
        self.worker_ids = tfcompat.worker_index_values(self.coordinator, self.num_workers)
        self.iterator = iter(self.coordinator.create_per_worker_dataset(
            make_dataset_fn(setup, records, self.num_workers)))
        self.step_fn = make_step_fn(self.model, self.control, setup.loss_fn)
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                              momentum=self.momentum)
        _ = self.checkpoint.save_counter   # made now, so every checkpoint holds it (a restore expects it)
        self._save_fn = tf.function(lambda prefix: self.checkpoint.write(prefix, options=checkpoint_io()))
        self._finite_fn = tf.function(self._finite, autograph=False)
        self._kept: list | None = None     # (variable, its copy) pairs: keep_weights
        self.links: Links | None = None   # made by warm_up
        self.closed = False
        self.standing = 0   # its closures not yet ended (kept by engine.lifecycle)

    def warm_up(self, keep: bool = False) -> None:
        """Trace the step, control and checkpoint functions now, not on the first step;
        with ``keep`` (a policy that may ask for ``keep_weights``), make the copy of the
        weights and run its functions once: made at auto's first ASP trial, it delayed
        ASP's first step (a switch on the testbed took 3.3 s to bring it)."""
        tfcompat.trace_as_scheduled(self.coordinator, self.step_fn, self.worker_ids, self.iterator)
        self.links = Links(self.control)   # (traces the coordinator's loops to the PS)
        self.control.rounds.get_concrete_function()
        self._save_fn.get_concrete_function(tf.TensorSpec([], tf.string))
        self._finite_fn.get_concrete_function()
        if keep:
            self._make_kept()
            self._keep_fn()
            self._undo_fn()   # (puts back what was just copied: the weights stay as they are)

    def save(self, prefix: str) -> str:
        """Write a checkpoint at ``prefix`` (``prefix.index``, ``prefix.data-*``) with the
        function traced at ``warm_up``: TF's own ``Checkpoint.save`` traces a new function
        at every save when variables live on several tasks, and sends it to every task
        first, which waits on a task that cannot answer (a partitioned node) and costs
        tens of milliseconds each time."""
        self._save_fn(tf.constant(prefix))
        return prefix

    def schedule(self):
        return self.coordinator.schedule(self.step_fn, args=(self.worker_ids, self.iterator))

    @property
    def learning_rate(self) -> float | None:
        """The base rate (None: the optimizer's rate is a schedule)."""
        return None if self.rate.base is None else float(self.rate.base.numpy())

    def set_hyper(self, base_lr: float | None = None, lr_scale: float | None = None,
                  momentum: float | None = None, restored: bool = False) -> None:
        """``base_lr`` replaces a constant base rate (refused under a schedule). A new
        ``lr_scale`` rescales the rate-bearing slots with it (``rate_bearing_slots``),
        unless they were ``restored`` from a checkpoint taken at that factor."""
        if base_lr is not None:
            if self.rate.base is None:
                raise ValueError("the optimizer's learning rate is a schedule: it cannot be replaced by a number "
                                 "(leave base_lr unset)")
            self.rate.base.assign(float(base_lr))
        if lr_scale is not None:
            lr_scale = float(lr_scale)
            if restored:
                self._scale = lr_scale
            self._rescale_slots(lr_scale)
            self.rate.scale.assign(lr_scale)
        if momentum is not None and self.momentum_tunable:   # (another optimizer's momentum is its own: see
            self.momentum.assign(float(momentum))           # tunable_momentum)

    def _rescale_slots(self, lr_scale: float) -> None:
        """The rate-bearing slots, built at ``_scale``, rescaled to ``lr_scale``."""
        if self._rescale_fn is not None and lr_scale != self._scale and self._scale > 0:
            self._rescale_fn(tf.constant(lr_scale / self._scale, tf.float32))
        self._scale = lr_scale

    def keep_weights(self) -> None:
        """Copy the model's weights and the optimizer's state (its slots and step count)
        beside them on the PS, replacing the copy kept before (``Decision.keep_weights``).
        The copies are made at the first call, unless ``warm_up`` made them."""
        if self._kept is None:
            self._make_kept()
        self._keep_fn()
        self._kept_scale = self._scale

    def _make_kept(self) -> None:
        """The copy's variables, each where its original lives, and the functions that
        copy to and from them."""
        originals = [*self.model.weights, *self.optimizer.variables]
        with self.strategy.scope():
            pairs = []
            for v in originals:
                with self.strategy.extended.colocate_vars_with(v):
                    pairs.append((v, tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                                 name="kept_" + v.name.split(":")[0].replace("/", "_"))))
        self._kept = pairs
        self._keep_fn = tf.function(lambda: [c.assign(v) for v, c in self._kept], autograph=False)
        self._undo_fn = tf.function(lambda: [v.assign(c) for v, c in self._kept], autograph=False)

    def restore_kept(self) -> None:
        """Put the kept copy back (``Decision.undo``), its rate-bearing slots rescaled from
        the factor they were kept at to the one in force. The ledger asks for it only after
        ``keep_weights`` in this generation (a new one forgets its mark)."""
        self._undo_fn()
        current, self._scale = self._scale, self._kept_scale
        self._rescale_slots(current)

    def weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.model.weights]

    def non_finite(self) -> list[str]:
        """The model's weights that hold a NaN or an infinity (each checked where it lives:
        one boolean comes back per variable, not the weights; one call for all of them,
        where one eager check per variable cost a checkpoint a round trip each)."""
        flags = self._finite_fn().numpy()
        return [v.name for v, ok in zip(self.model.weights, flags) if not ok]

    def _finite(self):
        flags = []
        for v in self.model.weights:
            with tf.device(v.device):
                flags.append(tf.reduce_all(tf.math.is_finite(v)))
        return tf.stack(flags)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            tfcompat.stop_coordinator(self.coordinator, worker_lost=lambda: any(
                job == "worker" for job, _, _ in self.cluster.dead_tasks()))
