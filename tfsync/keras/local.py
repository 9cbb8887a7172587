"""A ParameterServerStrategy on a local cluster, in one line, for trying ``model.fit`` with it.

    with tfsync.keras.local_cluster(workers=2) as strategy:
        with strategy.scope():
            model = ...
            model.compile(...)
        model.fit(DatasetCreator(dataset_fn), epochs=2, steps_per_epoch=50)

This is tfsync's own launcher (``tfsync.engine.cluster.LocalCluster``): one OS process
per PS and worker task, on free ports, in this process's private network namespace
where one can be made (root; else on loopback, with the ports open on every interface,
as the warning at start says). Leaving the block, normally or by an exception, stops
the coordinator's threads and kills every task process, so their ports close. The
coordinator's own TF server (the chief's, which the strategy starts in this process)
lives as long as the process: TensorFlow cannot stop it. At exit, TensorFlow's clean-up
logs a line for every function of every task it can no longer reach (some 80 for a short
fit, through absl, which no setting quiets); after a teardown, native code's stderr goes
to /dev/null from interpreter exit on, Python's own stderr staying (``TFSYNC_VERBOSE=1``
keeps it all), as the ``tfsync`` command does for its whole run.

Without ``with``: ``local = local_cluster(2); strategy = local.start(); ...; local.close()``.
"""

from __future__ import annotations

import atexit
import gc

import tensorflow as tf

from ..base import quiet
from ..engine import tfcompat
from ..engine.cluster import LocalCluster, connect_strategy


class LocalStrategy:
    """A started local cluster and the strategy coordinated by this process on it.

    ``cluster``: the :class:`LocalCluster` (``spec``, ``pids``); ``strategy`` and
    ``coordinator`` (the one ``model.fit`` uses: one per strategy) once started.
    """

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.strategy = self.coordinator = None

    def start(self) -> tf.distribute.experimental.ParameterServerStrategy:
        """Start the tasks, connect and return the strategy (on failure nothing is left running)."""
        try:
            self.cluster.start()
            self.strategy = connect_strategy(self.cluster)
            self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.strategy)
        except BaseException:
            self.close()
            raise
        return self.strategy

    def close(self) -> None:
        """Stop the coordinator's threads and every task process (idempotent)."""
        gc.collect()  # free what the PS holds for dropped objects while it still answers
        tfcompat.quiet_resource_deleters()  # later frees of the stopped tasks' resources fail harmlessly
        if self.coordinator is not None:
            tfcompat.stop_coordinator(self.coordinator)
            self.coordinator = None
        self.cluster.stop()
        _quiet_at_exit()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


_QUIET_AT_EXIT: list = []


def _quiet_at_exit() -> None:
    """From interpreter exit on, native stderr to /dev/null (once per process)."""
    if not _QUIET_AT_EXIT:
        _QUIET_AT_EXIT.append(True)
        atexit.register(quiet.native_logs_off)


def local_cluster(workers: int = 2, ps: int = 1, *, log_dir: str | None = None,
                  start_timeout: float = 60.0) -> LocalStrategy:
    """``workers`` worker and ``ps`` PS task processes on this machine; ``with`` gives the
    ParameterServerStrategy and tears everything down on leaving. ``log_dir``: each task's
    output in ``<job>-<index>.log`` there; ``start_timeout``: seconds for a task to open its
    port (raise it on a loaded machine)."""
    return LocalStrategy(LocalCluster(workers=workers, ps=ps, log_dir=log_dir, start_timeout=start_timeout))
