"""An engine's cluster lifecycle: the generations it opens and closes, each one a set of
task processes (a LocalCluster, or tasks on node hooks) and the ParameterServerStrategy
connected to them (``generation.Generation``). A restart (switch or recovery) closes one
and opens the next; only one trains at a time.

Every worker always has ``STANDING_PER_WORKER`` closures standing, blocked on its gate on
the PS; each runs up to ``step.STEPS_PER_CLOSURE`` granted steps and is replaced when it
ends. A daemon thread drains the finished steps' rows from the PS and puts them, tagged
with their generation, on one queue the engine's loop reads; daemon threads wait on the
closures and report a failed one there (a fetch of a killed generation may never return:
daemons never block the interpreter's exit).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import queue
import threading
import time
from typing import Callable

import tensorflow as tf

from .channel import PSChannel
from .cluster import ClusterError, LocalCluster, NoNodes
from .control import noop_rows
from .cut import bound_redials, cut
from .generation import Generation, TrainSetup, checkpoint_io, write_records
from .phase import EngineError
from .resources import ResourceMonitor

logger = logging.getLogger(__name__)
STANDING_PER_WORKER = 2
NODE_PROBE_S = 1.0  # between two asks whether a node answers again, while no node does (each waits for it too)
CONNECT_TRIES = 3   # tries to start and connect to a generation whose task died (each time anew)


class Lifecycle:
    def __init__(self, setup: TrainSetup, ledger, workers: int, ps: int, host: str, run_dir: str,
                 start_timeout: float, cluster_factory: Callable | None = None, base_lr: float | None = None):
        """``ledger``: the run's counts, whose round and rate factor each generation opens
        at; ``base_lr``: the rate the rate factor multiplies (None: the optimizer's)."""
        self.setup, self.ledger, self.workers, self.ps, self.host = setup, ledger, workers, ps, host
        self.base_lr = base_lr
        self.monitor = ResourceMonitor()  # CPU/memory per worker task for the policies (view.resources)
        self.on_close: list[Callable[[], None]] = []   # called first at each close (the loop's pilot)
        self.run_dir, self.start_timeout = run_dir, start_timeout
        # LocalCluster (task processes of this one), or tfsync.engine.hook_cluster.HookNodes
        self.cluster_factory = cluster_factory or LocalCluster
        bound_redials()   # before TF's first channel: a lost task's redial fails in seconds (tfsync.engine.cut)
        self.clusters: list = []
        self.current: Generation | None = None
        self.channel: PSChannel | None = None
        self.results: queue.Queue = queue.Queue()   # (generation, rows as the links drained them, error)
        self.drained_batches = 0   # the links' batches of finished steps handed on
        self.drained_rows = 0      # ... and the rows in them
        self.records: dict | None = None
        self._fetch_q: queue.Queue | None = None
        self._lock = threading.Lock()   # the current generation, and closure counts
        self.next_cluster = None   # the tasks of the next generation, started ahead (a planned restart switch)
        self.max_recoveries = 3    # restarts after a lost task, per task
        self.recovering: set | None = None   # the lost workers while recovering from their loss
        self.node_wait_s = 0.0     # how long a restart waits for a node when none answers (node hooks)
        self.on_pause = lambda kind, **fields: None   # the engine's events: "paused", then "unpaused"
        self.keep_weights = False   # a policy of the run may keep the weights: each generation makes the copy

    def launch(self, workers: int | None = None, wait: bool = False):
        """A new generation's tasks, starting (``open`` waits for them); ``workers``: how
        many (default: as now; tfsync.engine.scaling starts another count ahead). ``wait``
        (a restart after a loss, the old tasks gone): when none of the nodes answers, the
        job pauses up to ``node_wait_s`` for one (events "paused", then "unpaused")."""
        if self.records is None:   # before the tasks start: hooks on other nodes are sent the files
            self.records = write_records(self.setup, self.run_dir)
        paused, cluster = None, None
        try:
            while True:
                try:
                    cluster = self.cluster_factory(workers or self.workers, self.ps, self.host,
                                                   log_dir=os.path.join(self.run_dir, "logs"),
                                                   start_timeout=self.start_timeout, work_dir=self.run_dir,
                                                   files=self.records.get("files", ()))
                    break
                except NoNodes as e:   # every node lost: the job waits for one to come back (a pause)
                    now = time.monotonic()
                    if paused is None and wait and self.node_wait_s > 0:
                        paused = now
                        logger.warning("%s: the job pauses until a node answers (up to %g s, "
                                       "cluster.node_wait_s)", e, self.node_wait_s)
                        self.on_pause("paused", reason=str(e), wait_s=self.node_wait_s)
                    if paused is None:
                        raise
                    if now - paused >= self.node_wait_s:
                        raise ClusterError(f"{e} within {self.node_wait_s:g} s (cluster.node_wait_s)") from None
                    time.sleep(NODE_PROBE_S)
        finally:
            if paused is not None:   # a node answers, or the wait gave up (the status is not left "paused")
                waited = round(time.monotonic() - paused, 3)
                logger.warning("paused %.0f s: %s", waited, "the job ends" if cluster is None
                               else "a node answers again, the job goes on")
                self.on_pause("unpaused", seconds=waited, gave_up=cluster is None)
        self.clusters.append(cluster)
        return cluster.launch()

    def open(self, cluster, restore: str | None = None) -> dict:
        """Connect to ``cluster``, build (and restore) the model there at the ledger's
        round and rate factor, start its standing closures; returns the timings of its parts."""
        gen, timings = self._connect(cluster, restore, self.ledger.round)
        self.monitor.set_pids(gen.cluster.worker_pids())   # (another cluster where a connect failed)
        self.monitor.set_remote(getattr(gen.cluster, "resource_readings", None))  # workers on other nodes
        self.monitor.start()
        if self.base_lr is None:
            self.base_lr = gen.learning_rate  # None under a schedule
        elif gen.learning_rate is None:
            raise EngineError(f"base_lr = {self.base_lr} given, but the optimizer's learning rate is a schedule; "
                              "leave base_lr unset (the schedule is the base rate)")
        gen.set_hyper(base_lr=self.base_lr, lr_scale=self.ledger.lr_scale, momentum=self.ledger.momentum,
                      restored=True)   # (a checkpoint's slots are at the factor it was taken at)
        self._stand()
        return timings

    def start_next(self) -> None:
        """Start the next generation's tasks ahead, while this one trains (a planned restart
        switch: ``take_next``)."""
        self.next_cluster = self.launch()

    def take_next(self):
        """The next generation's tasks: those started ahead, else new ones, starting."""
        cluster, self.next_cluster = self.next_cluster or self.launch(), None
        return cluster

    def drop_next(self) -> None:
        """Stop the tasks started ahead for a restart switch, if any (a scale starts another
        count instead)."""
        if self.next_cluster is not None:
            self.next_cluster.stop()
            self.next_cluster = None

    @contextlib.contextmanager
    def recovering_from(self, workers):
        """While ``workers``' loss is recovered from: their closures' errors and deaths are
        expected (``recovering``)."""
        self.recovering = set(workers)
        try:
            yield
        finally:
            self.recovering = None

    def reopen(self, workers: int, cluster=None, restore: str | None = None) -> dict:
        """After this generation closed: go on with ``workers`` workers on ``cluster`` (new
        tasks by default, waiting for a node where none answers), restored from
        ``restore``; returns the timings of its parts (``open``)."""
        self.workers = workers
        return self.open(cluster or self.launch(wait=True), restore=restore)

    def restart(self, restore: str) -> None:
        """Replace every task: stop this generation's, start new ones restored from the
        checkpoint ``restore`` (waiting for a node where none answers: ``launch``);
        nothing is granted in the new generation yet."""
        self.close(kill=True)
        self.open(self.launch(wait=True), restore=restore)
        self.ledger.forget_grants()

    def sync(self) -> None:
        """Wait until every release and barrier sent to the PS has landed."""
        self.channel.sync()

    def _connect(self, cluster, restore: str | None, round: int) -> tuple[Generation, dict]:
        t0 = time.time()
        for attempt in range(1, CONNECT_TRIES + 1):
            try:
                cluster.wait_ready()
                t1 = time.time()
                cut(getattr(cluster, "cut_off", ()))   # tasks of old generations behind a partition (tfsync.engine.cut)
                gen = Generation(cluster, self.setup, self.records)
                break
            except ClusterError as e:   # a task died (after it listened: ConnectError): the generation again
                if attempt == CONNECT_TRIES:
                    raise
                restartable = getattr(cluster, "restartable", True)
                logger.warning("%s; %s (try %d of %d)", e, "starting the generation's tasks again" if restartable
                               else "connecting again once the platform has restarted it", attempt + 1, CONNECT_TRIES)
                if restartable:
                    cluster.stop()
                    cluster = self.launch()
        t2 = time.time()
        if restore:
            gen.checkpoint.restore(restore, options=checkpoint_io()).assert_existing_objects_matched()
        gen.control.set_round(round)
        t3 = time.time()
        gen.warm_up(keep=self.keep_weights)
        self.current, self.channel = gen, PSChannel(gen.links)
        timings = {"wait_tasks_s": t1 - t0, "connect_build_s": t2 - t1, "restore_s": t3 - t2,
                   "trace_s": time.time() - t3}
        logger.info("generation open in %.2f s: %s", time.time() - t0,
                    ", ".join(f"{k[:-2]} {v:.2f} s" for k, v in timings.items()))
        return gen, timings

    def _stand(self) -> None:
        """Every worker's standing closures, the threads that wait on them, and the links
        that hand finished steps on."""
        gen, self._fetch_q = self.current, queue.Queue()
        for i in range(STANDING_PER_WORKER * self.workers + 1):  # one per standing closure
            threading.Thread(target=self._fetcher, args=(gen, self._fetch_q), daemon=True,
                             name=f"tfsync-fetch-{i}").start()
        gen.links.start(lambda rows: self._arrived(gen, rows), lambda e: self._links_ended(gen, e))
        for _ in range(STANDING_PER_WORKER * self.workers):
            self._schedule(gen, self._fetch_q)

    def _schedule(self, gen, remote_values: queue.Queue) -> None:
        """One more closure on ``gen``, watched by ``gen``'s fetchers."""
        with self._lock:
            gen.standing += 1
        remote_values.put(gen.schedule())

    def _fetcher(self, gen, remote_values: queue.Queue) -> None:
        while True:
            rv = remote_values.get()
            if rv is None:
                return
            try:
                rv.fetch()
                failed = None
            except Exception as e:  # reported by the engine loop
                failed = e
                self.results.put((gen, None, e))
            with self._lock:
                gen.standing -= 1
                again = failed is None and gen is self.current   # (not once it is closing)
            if again:  # a closure ran its steps: the next one takes its place
                try:
                    self._schedule(gen, remote_values)
                except Exception as e:  # (the coordinator holds a failure of another closure)
                    self.results.put((gen, None, e))

    def _arrived(self, gen, rows) -> None:
        self.drained_batches += 1
        self.drained_rows += len(rows)
        self.results.put((gen, rows, None))   # (one wake of the loop a batch, not a row)

    def _links_ended(self, gen, error: BaseException) -> None:
        if gen is self.current:
            self.results.put((gen, None, error))  # e.g. the PS died: reported by the engine loop

    def close(self, kill: bool = True) -> None:
        """Stop the current generation: at once (``kill``), or after ending every standing
        closure with no-op tokens."""
        for before in self.on_close:
            before()
        with self._lock:
            gen, self.current = self.current, None
        if gen is None:
            return
        self.channel.close()
        if not kill:  # end every standing closure with a no-op token, and the drain
            gen.control.release(tf.constant(noop_rows(self.workers, 2 * STANDING_PER_WORKER + 1)))
            deadline = time.monotonic() + 30
            while gen.standing > 0 and time.monotonic() < deadline:
                time.sleep(0.02)
            gen.control.close_finished()
        for _ in range(STANDING_PER_WORKER * self.workers + 1):
            self._fetch_q.put(None)  # fetchers still waiting on a closure stay blocked (daemons)
        gen.links.close()
        gen.close()
        cluster = gen.cluster
        del gen
        gc.collect()  # free remote resources while their tasks still run (no deleter errors)
        cluster.stop()

    def task_pid(self, job: str, index: int) -> int | None:
        """The process id of a task of the cluster training now, or of the last one
        started (None if there is none)."""
        cluster = self.current.cluster if self.current is not None else (self.clusters[-1] if self.clusters else None)
        return cluster.task_pid(job, index) if cluster is not None else None

    def returned(self) -> list[str]:
        """Nodes the current generation left out (they did not answer) that are back; a
        restart would use them (node hooks only: a local cluster has no nodes to lose)."""
        returned = getattr(self.cluster_factory, "returned", None)
        return returned() if returned is not None else []

    def left_out(self) -> list[str]:
        """The nodes (hooks) the current generation left out: they did not answer."""
        left_out = getattr(self.cluster_factory, "left_out_hooks", None)
        return left_out() if left_out is not None else []

    def stop_all(self) -> None:
        for c in self.clusters:
            c.stop()
        close = getattr(self.cluster_factory, "close", None)
        if close is not None:
            close()
