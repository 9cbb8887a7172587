"""An engine's cluster generations: each one a set of task processes (a LocalCluster, or
tasks on node hooks) and the ParameterServerStrategy connected to them. A restart
(switch or recovery) closes one and opens the next; only one trains at a time.

Every worker always has ``STANDING_PER_WORKER`` closures standing, blocked on its gate on
the PS; daemon threads wait on their results and put them, tagged with their generation,
on one queue the engine's loop reads (a fetch of a killed generation may never return:
daemons never block the interpreter's exit).
"""

from __future__ import annotations

import gc
import os
import queue
import threading
import time
from typing import Callable

import tensorflow as tf

from .channel import PSChannel
from .cluster import LocalCluster
from .control import noop_rows
from .generation import Generation, TrainSetup, checkpoint_io, write_records

STANDING_PER_WORKER = 2


class Generations:
    def __init__(self, setup: TrainSetup, workers: int, ps: int, host: str, run_dir: str,
                 start_timeout: float, cluster_factory: Callable | None = None):
        self.setup, self.workers, self.ps, self.host = setup, workers, ps, host
        self.run_dir, self.start_timeout = run_dir, start_timeout
        # LocalCluster (task processes of this one), or tfsync.engine.hook_cluster.HookNodes
        self.cluster_factory = cluster_factory or LocalCluster
        self.clusters: list = []
        self.current: Generation | None = None
        self.channel: PSChannel | None = None
        self.results: queue.Queue = queue.Queue()   # (generation, value, error)
        self.standing = 0
        self.records: dict | None = None
        self._fetch_q: queue.Queue | None = None

    def launch(self):
        """A new generation's tasks, starting (``open`` waits for them)."""
        if self.records is None:   # before the tasks start: hooks on other nodes are sent the files
            self.records = write_records(self.setup, self.run_dir)
        cluster = self.cluster_factory(self.workers, self.ps, self.host, log_dir=os.path.join(self.run_dir, "logs"),
                                       start_timeout=self.start_timeout, work_dir=self.run_dir,
                                       files=self.records.get("files", ()))
        self.clusters.append(cluster)
        return cluster.launch()

    def open(self, cluster, restore: str | None, round: int) -> tuple[Generation, dict]:
        """Connect to ``cluster``, build (and restore) the model there, trace the
        functions; returns the generation and its timings. ``stand`` starts its closures."""
        t0 = time.time()
        cluster.wait_ready()
        t1 = time.time()
        gen = Generation(cluster, self.setup, self.records)
        t2 = time.time()
        if restore:
            gen.checkpoint.restore(restore, options=checkpoint_io()).assert_existing_objects_matched()
        gen.control.set_round(round)
        t3 = time.time()
        gen.warm_up()
        self.current, self.channel = gen, PSChannel(gen.control)
        return gen, {"wait_tasks_s": t1 - t0, "connect_build_s": t2 - t1, "restore_s": t3 - t2,
                     "trace_s": time.time() - t3}

    def stand(self) -> None:
        """Every worker's standing closures, and the threads that wait on them."""
        gen, self._fetch_q = self.current, queue.Queue()
        for i in range(STANDING_PER_WORKER * self.workers + 1):  # one per standing closure
            threading.Thread(target=self._fetcher, args=(gen, self._fetch_q), daemon=True,
                             name=f"tfsync-fetch-{i}").start()
        self.standing = 0
        for _ in range(STANDING_PER_WORKER * self.workers):
            self.schedule()

    def schedule(self) -> None:
        """One more standing closure (after one finished)."""
        self.standing += 1
        self._fetch_q.put(self.current.schedule())

    def _fetcher(self, gen, remote_values: queue.Queue) -> None:
        while True:
            rv = remote_values.get()
            if rv is None:
                return
            try:
                self.results.put((gen, rv.fetch(), None))
            except Exception as e:  # reported by the engine loop
                self.results.put((gen, None, e))

    def close(self, kill: bool = True) -> None:
        """Stop the current generation: at once (``kill``), or after ending every standing
        closure with no-op tokens."""
        gen, self.current = self.current, None
        if gen is None:
            return
        self.channel.close()
        for _ in range(STANDING_PER_WORKER * self.workers + 1):
            self._fetch_q.put(None)  # fetchers still waiting on a closure stay blocked (daemons)
        if not kill:
            gen.control.release(tf.constant(noop_rows(self.workers, 2 * STANDING_PER_WORKER + 1)))
            deadline = time.monotonic() + 30
            while self.standing > 0 and time.monotonic() < deadline:
                try:
                    g, _, _ = self.results.get(timeout=0.5)
                except queue.Empty:
                    continue
                if g is gen:
                    self.standing -= 1
        gen.close()
        cluster = gen.cluster
        del gen
        gc.collect()  # free remote resources while their tasks still run (no deleter errors)
        cluster.stop()

    def stop_all(self) -> None:
        for c in self.clusters:
            c.stop()
