"""What a job may ask of the machine, checked before anything starts: the input
pipeline's batches must fit in memory, and the cluster's tasks in memory and in the
process's file-descriptor limit. A job that cannot fit is refused in one line naming
the field (``ConfigError``), instead of growing until the OS kills it or a task fails
with "Too many open files" half-way through starting."""

from __future__ import annotations

import resource

import numpy as np
import psutil

from ..base import arrays
from .errors import ConfigError

TASK_BYTES = 300 * 2**20  # a TF task process at rest (measured: 250-320 MB RSS with TF 2.21 on CPU)
BATCHES_HELD = 4  # per worker: the batch a step uses, two prefetched, one being decoded
FDS_PER_TASK = 8  # the coordinator's channels to a task, its log files and pipes
FDS_SPARE = 64  # the coordinator's own files, servers and data
USABLE = 0.8  # of the memory available now


def example_bytes(x, y) -> int:
    """Bytes one training example takes in a decoded batch (inputs as float32, as the
    pipeline feeds them, and the label); ``x`` and ``y`` arrays or nests of them."""
    def size(a, least=1):
        return int(np.prod(a.shape[1:], dtype=np.int64)) * max(least, a.dtype.itemsize)
    return sum(size(a, 4) for a in arrays.leaves(x)) + sum(size(a) for a in arrays.leaves(y))


def check_job(workers: int, ps: int, max_batch: int, per_example: int, local_tasks: bool,
              available: int | None = None, fd_limit: int | None = None) -> None:
    """Refuse a job whose batches or tasks cannot fit (ConfigError naming the field).
    ``local_tasks``: the tasks run on this machine, so their memory counts here too."""
    available = psutil.virtual_memory().available if available is None else available
    fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0] if fd_limit is None else fd_limit
    budget = int(available * USABLE)
    batches = BATCHES_HELD * max_batch * per_example
    tasks = workers + ps
    if batches > budget:
        raise ConfigError(f"train.batch_size: a worker's batches of up to {max_batch} examples take about "
                          f"{_gib(batches)} ({per_example} bytes an example, {BATCHES_HELD} batches held); "
                          f"{_gib(budget)} of memory can be used here; choose a smaller batch size",
                          "train.batch_size")
    if local_tasks and tasks * TASK_BYTES + workers * batches > budget:
        raise ConfigError(f"cluster.workers: {workers} workers + {ps} PS on this machine need about "
                          f"{_gib(tasks * TASK_BYTES + workers * batches)} of memory; {_gib(budget)} can be used "
                          "here; use fewer workers, or run them on other nodes (cluster.hooks)", "cluster.workers")
    if fd_limit != resource.RLIM_INFINITY and tasks * FDS_PER_TASK + FDS_SPARE > fd_limit:
        raise ConfigError(f"cluster.workers: {tasks} tasks need about {tasks * FDS_PER_TASK + FDS_SPARE} open "
                          f"files in the coordinator; this process may open {fd_limit} (ulimit -n); raise the "
                          "limit or use fewer workers", "cluster.workers")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
