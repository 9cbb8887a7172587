"""One generation of the training cluster as the coordinator sees it.

A restart switch replaces the generation: new task processes (started while the old
ones still train), a new strategy and coordinator connected to them, the model and
optimizer rebuilt and restored from the checkpoint (paper 003 Fig. 9). A hot switch
keeps the generation.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tensorflow as tf

from .. import safefile
from ..metrics import resolve as resolve_metrics
from ..pipeline import DatasetFactory, worker_index
from . import tfcompat
from .cluster import LocalCluster, connect_strategy
from .control import LearningRate, PSControl, check_optimizer
from .step import make_step_fn

logger = logging.getLogger(__name__)


@dataclass
class TrainSetup:
    """What to train: everything the engine needs from a user or a job file.

    ``model_fn`` and ``optimizer_fn`` are called under the strategy's scope (variables go
    to the PS). ``loss_fn(y, logits)`` returns per-example losses. Every input batch
    holds ``max_batch_size`` rows; a step uses the first ``batch_size`` of them.
    ``x_train`` is an array (with its labels ``y_train``), or a
    ``tfsync.pipeline.DatasetFactory`` that each worker reads itself (``y_train`` None).
    ``metrics``: what the evaluator reports beside the loss (tf_keras Metric objects or
    classes, functions ``fn(y_true, y_pred)``, or the job file's names; ``tfsync.metrics``);
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
        return self.factory.examples if self.factory else len(self.y_train)


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
    ``work_dir/data/``; the dataset names them relative to the task's working directory
    (``files``), which is ``work_dir`` for tasks on this machine and the job's stage
    directory on other nodes, where the hooks were sent them (no shared filesystem). A
    dataset factory's workers read their own data: nothing is written."""
    if setup.factory:
        return {}
    x, scale = _transport(np.ascontiguousarray(setup.x_train))
    y = np.ascontiguousarray(setup.y_train)  # labels keep their dtype and shape (float targets too)
    for name, a in (("x_train", x), ("y_train", y)):
        if a.dtype.name not in RECORD_DTYPES:
            raise ValueError(f"{name} has dtype {a.dtype.name}; the engine takes "
                             f"{', '.join(RECORD_DTYPES)} (convert it, e.g. with .astype(np.float32))")
        if a.dtype.byteorder == ">":
            raise ValueError(f"{name} is big-endian ({a.dtype.str}); convert it with .astype('{a.dtype.name}')")
    if len(x) != len(y):
        raise ValueError(f"x_train has {len(x)} examples but y_train {len(y)}; expected one label per example")
    safefile.make_dir(os.path.join(work_dir, "data"))
    paths = {"x": os.path.join("data", "train_x.bin"), "y": os.path.join("data", "train_y.bin")}
    for key, array in (("x", x), ("y", y)):
        with safefile.replacing(os.path.join(work_dir, paths[key]), binary=True) as f:
            array.tofile(f)
    return {**paths, "files": (paths["x"], paths["y"]), "x_dtype": x.dtype.name, "x_shape": x.shape[1:], "scale": scale, "n": len(y),
            "y_dtype": y.dtype.name, "y_shape": y.shape[1:]}


def make_dataset_fn(setup: TrainSetup, records: dict, workers: int):
    if setup.factory:
        factory = setup.factory
        return lambda: factory.dataset(workers).repeat().batch(setup.max_batch_size, drop_remainder=True).prefetch(2)
    shape, n = tuple(records["x_shape"]), records["n"]
    dtype, y_dtype = tf.as_dtype(records["x_dtype"]), tf.as_dtype(records["y_dtype"])
    y_shape = tuple(records["y_shape"])
    scale = records["scale"]

    def decode(xr, yr):  # a whole batch of records at once
        xv = tf.reshape(tf.io.decode_raw(xr, dtype), (-1, *shape))
        xv = tf.cast(xv, tf.float32) * scale if scale is not None else xv
        return xv, tf.reshape(tf.io.decode_raw(yr, y_dtype), (-1, *y_shape))

    def dataset_fn():
        ds = tf.data.Dataset.zip((
            tf.data.FixedLengthRecordDataset(records["x"], int(np.prod(shape)) * dtype.size),
            tf.data.FixedLengthRecordDataset(records["y"], int(np.prod(y_shape)) * y_dtype.size)))
        if setup.shuffle:
            ds = ds.shuffle(n, reshuffle_each_iteration=True)
        ds = ds.repeat()
        if setup.shuffle:
            # The shuffle's seed is fixed where the graph is traced, on the coordinator (from
            # tf.random.set_seed there), so every worker draws the same order: each starts
            # at its own offset in it, or BSP would average the same gradient n times.
            ds = ds.skip(tf.cast(worker_index(), tf.int64) * (n // workers))
        ds = ds.batch(setup.max_batch_size, drop_remainder=True)
        return ds.map(lambda xr, yr: decode(xr, yr)).prefetch(2)

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
            if hasattr(self.optimizer, "momentum"):
                self.optimizer.momentum = self.momentum  # read per update: changeable at a switch
            self.rate = LearningRate(self.optimizer)  # the engine sets its scale
        self.control = PSControl(self.num_workers, self.model, self.optimizer, self.rate)
        self.worker_ids = tfcompat.worker_index_values(self.coordinator, self.num_workers)
        self.iterator = iter(self.coordinator.create_per_worker_dataset(
            make_dataset_fn(setup, records, self.num_workers)))
        self.step_fn = make_step_fn(self.model, self.control, setup.loss_fn)
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                              momentum=self.momentum)
        _ = self.checkpoint.save_counter   # made now, so every checkpoint holds it (a restore expects it)
        self._save_fn = tf.function(lambda prefix: self.checkpoint.write(prefix, options=checkpoint_io()))
        self.closed = False

    def warm_up(self) -> None:
        """Trace the step, control and checkpoint functions now, not on the first step."""
        self.step_fn.get_concrete_function(self.worker_ids, self.iterator)
        self._save_fn.get_concrete_function(tf.TensorSpec([], tf.string))

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
                  momentum: float | None = None) -> None:
        """``base_lr`` replaces a constant base rate (refused under a schedule)."""
        if base_lr is not None:
            if self.rate.base is None:
                raise ValueError("the optimizer's learning rate is a schedule: it cannot be replaced by a number "
                                 "(leave base_lr unset)")
            self.rate.base.assign(float(base_lr))
        if lr_scale is not None:
            self.rate.scale.assign(float(lr_scale))
        if momentum is not None:
            self.momentum.assign(float(momentum))

    def weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.model.weights]

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            tfcompat.stop_coordinator(self.coordinator)
