"""Training data that each worker reads itself: a ``tf.data`` factory, for data too large
for memory, TFRecord shards, or preprocessing on the workers.

    def train_data(input_context):          # called on the coordinator, run on every worker
        files = tf.data.Dataset.list_files("/data/shard-*.tfrecord", shuffle=False)
        files = files.shard(input_context.num_input_pipelines, tfsync.worker_index())  # a part each
        return files.interleave(tf.data.TFRecordDataset).map(parse).shuffle(10_000)

    DatasetFactory(train_data, examples=1_000_000)

The dataset is *unbatched*: one ``(features, label)`` element per example. tfsync
repeats it, batches it at the largest size any phase can grant and prefetches; a step
uses the first ``batch_size`` rows of its batch, so per-step sizes (LB-BSP, uneven
batches) change without retracing, as with arrays. ``input_context`` is a
``tf.distribute.InputContext`` with ``num_input_pipelines`` = the number of workers; the
worker's own index is ``worker_index()`` inside the function. The function runs on the
workers (the files it names must exist there) and once here, for the first examples that
check the model before any task starts (there, ``worker_index()`` is 0 and the input
context says 1 pipeline).
``examples`` is the size of one epoch, the unit of ``train.epochs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


def worker_index():
    """The index of the worker running a DatasetFactory's function (a scalar tensor there;
    0 where tfsync samples the dataset on the coordinator)."""
    import tensorflow as tf

    try:
        return tf.distribute.coordinator.experimental_get_current_worker_index()
    except RuntimeError:  # not on a worker: the coordinator's sample
        return 0


@dataclass(frozen=True)
class DatasetFactory:
    fn: Callable
    examples: int

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(f"DatasetFactory.fn must be callable, got {type(self.fn).__name__}")
        if type(self.examples) is not int or self.examples < 1:
            raise ValueError(f"DatasetFactory.examples must be an integer >= 1 (the examples in one epoch), "
                             f"got {self.examples!r}")

    def dataset(self, workers: int):
        """The user's dataset, checked to be one of unbatched (features, label) pairs."""
        import tensorflow as tf

        ds = self.fn(tf.distribute.InputContext(num_input_pipelines=workers))
        if not isinstance(ds, tf.data.Dataset):
            raise TypeError(f"returned a {type(ds).__name__}; expected a tf.data.Dataset of (features, label)")
        spec = ds.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2):
            raise TypeError(f"its elements are {spec}; expected (features, label) pairs, one per example, unbatched")
        return ds

    def sample(self, n: int = 2) -> tuple[np.ndarray, np.ndarray]:
        """The first ``n`` examples as arrays, read here (the checks before any task starts).
        A dataset that names files only the workers have cannot be sampled here; that is
        said in one line."""
        import tensorflow as tf

        try:
            x, y = next(iter(self.dataset(1).take(n).batch(n)))
        except StopIteration:
            raise ValueError("the dataset is empty") from None
        except tf.errors.OpError as e:
            raise ValueError(f"could not read the first examples here: {e.message.splitlines()[0]}") from None
        return tf.nest.map_structure(lambda t: t.numpy(), (x, y))
