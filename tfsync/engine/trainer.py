"""The engine: runs synchronization policies on ParameterServerStrategy.

Every worker always has standing closures (2 per worker) that block on its gate on the
PS. The coordinator's loop takes each finished step, updates the cluster view, asks the
policy, and carries out its decision: a barrier (apply the round's weighted mean) and/or
tokens released to gates. Phases run one policy each; between phases the engine drains
the cluster and switches hot (same tasks) or by restart (checkpoint, new tasks, restore).
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tensorflow as tf

from .. import arrays, netns
from ..policy.base import ClusterView, Decision, Policy, PolicyError, Push, PushMode
from ..policy.ledger import Ledger
from ..curves import converged_accuracy
from ..pushlog import push_record
from ..quiet import quiet_tf_loggers
from .channel import ChannelError, PSChannel
from .commands import Command, CommandResult, Controller, StopRequested, carry_out
from .cluster import LocalCluster
from .control import BATCH, MODE, MODE_AGGREGATE, ROUND, SEQ, noop_rows, token_rows
from .evaluator import Evaluation, Evaluator, scores
from .checkpoints import CheckpointDir, load_state
from .generation import Generation, TrainSetup, checkpoint_io, write_records
from .records import RunRecorder
from .resources import ResourceMonitor
from .recovery import recover_lost_ps, recover_lost_workers
from .tfcompat import quiet_resource_deleters

logger = logging.getLogger(__name__)

STANDING_PER_WORKER = 2


class EngineError(RuntimeError):
    """Training cannot go on (a dead task, a step past its timeout, a stalled policy)."""


@dataclass
class Phase:
    """Run ``policy`` until ``until`` (a fraction of the workload, in samples).

    ``switch``: how this phase is entered from the previous one ("hot" or "restart").
    ``lr_scale`` multiplies the base learning rate; ``momentum`` replaces the base
    momentum (None: keep), or is a function of the epochs since the phase began (the
    ramps of paper 003 Fig. 8b); both from the configuration policy (§IV-C).
    """

    policy: Policy
    until: float = 1.0
    switch: str = "hot"
    lr_scale: float = 1.0
    momentum: float | Callable[[float], float] | None = None


class Engine:
    def __init__(self, setup: TrainSetup, workers: int = 2, ps: int = 1, host: str = "127.0.0.1",
                 run_dir: str = "runs/engine", base_lr: float | None = None,
                 checkpoint_every: int = 0, timeout_s: float = 600.0, tensorboard: bool = True,
                 progress=None, start_timeout: float = 120.0, epoch_samples: int | None = None,
                 controller: Controller | None = None, eval_every: int = 0, eval_samples: int = 0,
                 on_start: Callable | None = None, cluster_factory: Callable | None = None):
        quiet_resource_deleters()  # no tracebacks from TF freeing resources of stopped tasks
        quiet_tf_loggers()  # nor a log line per closure a teardown cancels (tfsync.quiet)
        self.setup = setup
        self.workers, self.ps, self.host = workers, ps, host
        # makes each generation's cluster: LocalCluster (task processes of this one), or
        # tfsync.manager.hook_cluster.HookNodes (tasks run by node hooks)
        self.cluster_factory = cluster_factory or LocalCluster
        self.run_dir = run_dir
        self.checkpoint_every = int(checkpoint_every)
        self.timeout_s = float(timeout_s)
        self.progress = progress
        self.controller = controller or Controller()  # commands from a manager, at step boundaries
        self._control_s = 0.0  # time the loop spent in the controller (the training hook's overhead)
        self.max_recoveries, self.recovery_log = 3, []  # per task; one entry per restart
        self.recovering: set | None = None  # the lost workers while recovering from their loss
        self._policy: Policy | None = None  # the policy running now
        self.draining = False
        self.start_timeout = start_timeout
        self.epoch_samples = epoch_samples or setup.train_examples
        self.recorder = RunRecorder(run_dir, tensorboard=tensorboard)
        self.state = Ledger(workers)  # counted as the simulator counts (tfsync.policy.ledger)
        self.timeline: list[dict] = []
        self.switches: list[dict] = []
        self.checkpoints: list[dict] = []
        self._results: queue.Queue = queue.Queue()
        self._gen: Generation | None = None
        self._next_cluster: LocalCluster | None = None
        self._clusters: list[LocalCluster] = []
        self._standing = 0
        self._wake_at: float | None = None
        self._t0 = time.time()
        self.train_started: float | None = None
        self.base_lr = base_lr
        self._ckpt_dir: CheckpointDir | None = None
        self._last_ckpt_updates = 0
        self._closing = False
        self._final_weights = None
        self._dead_checked = 0.0
        self._records: dict | None = None
        self.evaluator = None  # test loss, accuracy, metrics every ``eval_every`` steps, in the background
        if eval_every and setup.x_test is not None:
            self.evaluator = Evaluator(setup.model_fn, setup.x_test, setup.y_test, eval_every,
                                       samples=eval_samples or None, loss_fn=setup.loss_fn, metrics=setup.metrics)
        self.evals: list[Evaluation] = []
        self.monitor = ResourceMonitor()  # CPU/memory per worker task for the policies (view.resources)
        self.on_start = on_start  # called once training starts, after init (e.g. a straggler injector)

    # -- cluster generations ------------------------------------------------------------
    def _launch(self) -> LocalCluster:
        """A new generation's tasks, starting (``_open_generation`` waits for them)."""
        if self._records is None:   # before the tasks start: hooks on other nodes are sent the files
            self._records = write_records(self.setup, self.run_dir)
        cluster = self.cluster_factory(self.workers, self.ps, self.host, log_dir=os.path.join(self.run_dir, "logs"),
                                       start_timeout=self.start_timeout, work_dir=self.run_dir,
                                       files=self._records.get("files", ()))
        self._clusters.append(cluster)
        return cluster.launch()

    def _open_generation(self, cluster: LocalCluster, restore: str | None = None) -> dict:
        """Connect to ``cluster``, build (and restore) the model there; returns timings."""
        t0 = time.time()
        cluster.wait_ready()
        t1 = time.time()
        gen = Generation(cluster, self.setup, self._records)
        self.monitor.set_pids(cluster.worker_pids())
        self.monitor.set_remote(getattr(cluster, "resource_readings", None))  # workers on other nodes
        self.monitor.start()
        t2 = time.time()
        if restore:
            gen.checkpoint.restore(restore, options=checkpoint_io()).assert_existing_objects_matched()
        gen.control.set_round(self.state.round)
        t3 = time.time()
        gen.warm_up()
        timings = {"wait_tasks_s": t1 - t0, "connect_build_s": t2 - t1, "restore_s": t3 - t2,
                   "trace_s": time.time() - t3}
        if self.base_lr is None:
            self.base_lr = gen.learning_rate  # None under a schedule
        elif gen.learning_rate is None:
            raise EngineError(f"base_lr = {self.base_lr} given, but the optimizer's learning rate is a schedule; "
                              "leave base_lr unset (the schedule is the base rate)")
        gen.set_hyper(base_lr=self.base_lr, lr_scale=self.state.lr_scale)
        self._gen = gen
        if self._ckpt_dir is None:
            self._ckpt_dir = CheckpointDir(os.path.join(self.run_dir, "checkpoints"), keep=3)
        self._channel = PSChannel(gen.control)
        self._fetch_q = queue.Queue()
        for i in range(STANDING_PER_WORKER * self.workers + 1):  # one per standing closure
            threading.Thread(target=self._fetcher, args=(gen, self._fetch_q), daemon=True,
                             name=f"tfsync-fetch-{i}").start()
        self._standing = 0
        for _ in range(STANDING_PER_WORKER * self.workers):
            self._schedule()
        return timings

    def _schedule(self) -> None:
        gen = self._gen
        self._standing += 1
        self._fetch_q.put(gen.schedule())

    def _fetcher(self, gen, remote_values: queue.Queue) -> None:
        """Daemon threads of one generation waiting on its closures' results (a fetch of a
        killed generation may never return: daemons never block the interpreter's exit)."""
        while True:
            rv = remote_values.get()
            if rv is None:
                return
            try:
                self._results.put((gen, rv.fetch(), None))
            except Exception as e:  # reported by the engine loop
                self._results.put((gen, None, e))

    def _close_generation(self, kill: bool = True) -> None:
        gen, self._gen = self._gen, None
        if gen is None:
            return
        self._channel.close()
        for _ in range(STANDING_PER_WORKER * self.workers + 1):
            self._fetch_q.put(None)  # fetchers still waiting on a closure stay blocked (daemons)
        if not kill:  # end every standing closure with no-op tokens, then stop threads
            gen.control.release(tf.constant(noop_rows(self.workers, 2 * STANDING_PER_WORKER + 1)))
            deadline = time.monotonic() + 30
            while self._standing > 0 and time.monotonic() < deadline:
                try:
                    g, _, _ = self._results.get(timeout=0.5)
                except queue.Empty:
                    continue
                if g is gen:
                    self._standing -= 1
        gen.close()
        cluster = gen.cluster
        del gen
        gc.collect()  # free remote resources while their tasks still run (no deleter errors)
        cluster.stop()

    @property
    def generation(self) -> Generation | None:
        """The cluster generation training now (None before the first and after the end)."""
        return self._gen

    def restart_generation(self, restore: str) -> None:
        """Replace every task: stop this generation's, start new ones restored from the
        checkpoint ``restore``; nothing is granted in the new generation yet."""
        self._close_generation(kill=True)
        self._open_generation(self._launch(), restore=restore)
        self.state.forget_grants()

    def rewind(self, checkpoint: dict, why: str) -> None:
        """Go back to the counters of ``checkpoint`` (a checkpoint event: samples, updates,
        pushes): what came after it is trained again and its records are set aside."""
        self.state.rewind(*(checkpoint.get(k, 0) for k in ("samples", "updates", "pushes")))
        self._last_ckpt_updates = self.state.updates
        self.recorder.rewind(self.state.pushes, why)

    def sync(self) -> None:
        """Wait until every release and barrier sent to the PS has landed."""
        self._channel.sync()

    def task_pid(self, job: str, index: int) -> int | None:
        """The process id of a task of the cluster training now (None if there is none)."""
        cluster = self._gen.cluster if self._gen is not None else (self._clusters[-1] if self._clusters else None)
        return cluster.task_pid(job, index) if cluster is not None else None

    # -- the view a policy sees ----------------------------------------------------------
    @property
    def history(self):
        """Recent pushes, newest last."""
        return self.state.history

    def view(self) -> ClusterView:
        return self.state.view(time.time(), self.monitor.latest())

    # -- carrying out decisions ----------------------------------------------------------
    def apply(self, decision: Decision) -> None:
        s, gen = self.state, self._gen
        pending = len(s.pending_workers)
        applied = s.apply(decision, time.time())
        if applied.lr_changed:
            scale = s.lr_scale
            rescale = lambda: gen.set_hyper(lr_scale=scale)  # noqa: E731
        rows = token_rows(decision.grants, s.round, applied.seqs)
        if applied.closed and applied.lr_changed:
            # the round was pushed at the old rate (its pushes recorded it: BSP's n x eta when a
            # straggler policy goes to ASP): apply it so, then change the rate, then grant
            self._channel.barrier(pending, rows[:0])
            self._channel.call(rescale)
            if decision.grants:
                self._channel.release(rows)
        elif applied.closed:  # the channel is FIFO: earlier releases go out before the barrier
            self._channel.barrier(pending, rows)
        else:
            if applied.lr_changed:
                self._channel.call(rescale)  # before the grants: their steps use the new rate
            if decision.grants:
                self._channel.release(rows)  # merged there with every release still waiting
        if decision.grants:
            logger.debug("grant %s", [(g.worker, g.batch_size, g.mode.value) for g in decision.grants])
        self._wake_at = decision.wake_at if decision.wake_at is not None else self._wake_at

    def in_flight(self) -> int:
        return self.state.in_flight()

    # -- receiving pushes ----------------------------------------------------------------
    def _next_result(self):
        """The next finished closure of the current generation, watching for dead tasks,
        timeouts and policy timers; None when a timer is due, or when a lost worker's
        recovery left nothing in flight (while draining, nothing more is granted)."""
        waited = 0.0
        while True:
            if time.monotonic() - self._dead_checked > 0.5:  # results may keep coming from others
                self._dead_checked = time.monotonic()
                if self._raise_if_dead() and self.in_flight() == 0:
                    return None  # a lost worker's recovery replaced the cluster: nothing is outstanding
                self._channel.check()
            timeout = 0.5
            if self._wake_at is not None:
                timeout = max(0.0, min(timeout, self._wake_at - time.time()))
            try:
                gen, value, err = self._results.get(timeout=timeout)
            except queue.Empty:
                waited += timeout
                if self._wake_at is not None and time.time() >= self._wake_at:
                    return None
                if self._raise_if_dead() and self.in_flight() == 0:
                    return None  # (a drain, the workload done: the recovery granted nothing)
                if waited > self.timeout_s:
                    raise EngineError(
                        f"no step finished in {self.timeout_s:.0f} s (outstanding steps: "
                        f"{self.in_flight()}); raise train.timeout_s if steps are this slow")
                continue
            if gen is not self._gen:
                continue  # a closure of a replaced generation
            self._standing -= 1
            if err is not None:
                time.sleep(0.2)  # let the OS report a task that just died
                if self._raise_if_dead(err) or self.recovering:
                    continue  # a closure of a lost worker: the cluster is being restarted
                raise EngineError(f"a training step failed: {type(err).__name__}: {str(err).splitlines()[0]}") from err
            return value

    def _raise_if_dead(self, cause: BaseException | None = None) -> bool:
        """Recover from lost workers (True if it did); raise for any other dead task."""
        if self.recovering is None and recover_lost_workers(self, self._policy):
            return True
        dead = [d for d in self._gen.cluster.dead_tasks() if d[0] != "worker" or d[1] not in (self.recovering or ())]
        if dead:
            job, i, code = dead[0]
            raise EngineError(
                f"task {job}:{i} died (exit code {code}); logs in {self.run_dir}/logs, "
                f"last checkpoint in {self.run_dir}/checkpoints") from cause
        return False

    def _record(self, result, policy: Policy) -> Push | None:
        r = np.asarray(result)
        wid, token, (start, end, loss, version, rate) = r[0], r[1:5].astype(np.int64), r[5:10]
        if int(token[BATCH]) == 0:
            return None
        s = self.state
        w = int(wid)
        if int(token[SEQ]) != s.clocks[w] + 1:
            logger.warning("worker %d pushed step %d, expected %d", w, int(token[SEQ]), s.clocks[w] + 1)
        mode = PushMode.AGGREGATE if int(token[MODE]) == MODE_AGGREGATE else PushMode.APPLY
        now = time.time()
        push = s.push(w, int(token[BATCH]), mode, int(token[ROUND]), int(version), start=float(start),
                      end=float(end), arrival=now, loss=float(loss))
        record = push_record(push, time=self.recorder.since(now), pushes=s.pushes, updates=s.updates,
                             samples=s.samples, protocol=policy.name, lr=float(rate),
                             predicted=policy.predicted_speed(w))
        self.recorder.push(record)
        t = time.perf_counter()
        self.controller.record(record)
        self._control_s += time.perf_counter() - t
        return push

    # -- phases --------------------------------------------------------------------------
    def _run_phase(self, phase: Phase, end_samples: int, total: int) -> None:
        policy = self._policy = phase.policy
        self.apply(policy.start(self.view()))
        self._check_live(policy)
        start_samples, epoch = self.state.samples, 0
        while self.state.samples < end_samples:
            if callable(phase.momentum):
                e = int((self.state.samples - start_samples) / self.epoch_samples)
                if e != epoch:
                    epoch = e
                    m, gen = phase.momentum(e), self._gen
                    self._channel.call(lambda: gen.set_hyper(momentum=m))
            try:
                result = self._next_result()
            except (EngineError, ChannelError) as e:
                # a control call can fail on a PS that died before its hook reports it: wait for that
                if not recover_lost_ps(self, phase, wait_s=5.0 if isinstance(e, ChannelError) else 0.0):
                    raise
                continue
            if result is None:  # a timer, or a recovery that left nothing in flight
                self._wake_at = None
                self.apply(policy.on_timer(self.view()))
                continue
            self._schedule()
            push = self._record(result, policy)
            if push is None or self.state.samples >= end_samples:
                continue  # the workload of this phase is done: drain, grant nothing more
            self.apply(policy.on_push(push, self.view()))
            self._check_live(policy)
            self._evaluate_if_due()
            t = time.perf_counter()
            commands = self.controller.commands()
            self._control_s += time.perf_counter() - t
            for cmd in commands:
                self._obey(phase, cmd)
                policy = self._policy = phase.policy
            if self.progress:
                self.progress(self, policy, total)
            if self.checkpoint_every and self.state.updates - self._last_ckpt_updates >= self.checkpoint_every \
                    and self.state.samples < end_samples:
                try:
                    self.drain(policy)
                    self.checkpoint("periodic")
                except (EngineError, ChannelError, tf.errors.UnavailableError):
                    # the PS died during the save (CI: UnavailableError "Socket closed" from it)
                    if not recover_lost_ps(self, phase, wait_s=5.0):
                        raise
                    continue
                self.apply(policy.start(self.view()))
        self.drain(policy)

    def _obey(self, phase: Phase, cmd: Command) -> None:
        """Carry out a manager's command at this step boundary and report the outcome."""
        try:
            message, path = carry_out(self, phase, cmd, self.setup.max_batch_size)
        except StopRequested as stop:
            self.controller.result(CommandResult(cmd.id, True, "stopping", self.state.updates, stop.checkpoint_path))
            raise
        except (ValueError, PolicyError) as e:
            logger.warning("command %s (%s) refused: %s", cmd.id, cmd.kind, e)
            self.controller.result(CommandResult(cmd.id, False, str(e), self.state.updates))
            return
        self.recorder.event("command", id=cmd.id, command=cmd.kind, message=message)
        self.controller.result(CommandResult(cmd.id, True, message, self.state.updates, path))

    def event(self, kind: str, **fields) -> None:
        """Record something that happened to the run (metrics.jsonl, and the manager's
        job store for the kinds it keeps)."""
        self.recorder.event(kind, **fields)
        self.controller.event(kind, fields)

    def begin_phase(self, phase: Phase, stats_of_previous: dict | None = None) -> dict:
        """A timeline entry for ``phase`` starting now (and the previous one's final stats)."""
        if stats_of_previous is not None and self.timeline:
            self.timeline[-1]["stats"] = stats_of_previous
        start = {"protocol": phase.policy.name, "samples": self.state.samples,
                 "updates": self.state.updates, "time": round(self.recorder.since(), 4),
                 "policy": phase.policy.describe(), "lr_scale": phase.lr_scale,
                 "lr": None if self.base_lr is None else self.base_lr * phase.lr_scale}
        self.timeline.append(start)
        self.recorder.phase(start, self.state.pushes, len(self.timeline) - 1)
        return start

    def _check_live(self, policy: Policy) -> None:
        if self.in_flight() == 0 and self._wake_at is None:
            raise PolicyError(f"policy {policy.name!r} granted no step while every worker is idle: training would hang")

    def drain(self, policy: Policy) -> None:
        """Wait for every granted step, then apply what the round aggregated."""
        self._policy, self.draining = policy, True
        try:
            while self.in_flight() > 0:
                result = self._next_result()
                if result is None:
                    self._wake_at = None
                    continue
                self._schedule()
                self._record(result, policy)
        finally:
            self.draining = False
        self.apply(policy.finish(self.view()))
        if self.state.pending_workers:
            self.apply(Decision(barrier=True))
        self._channel.sync()

    def checkpoint(self, why: str) -> str:
        t = time.time()
        path = self._ckpt_dir.save(self._gen, self.state.updates, self.save_state())
        self._last_ckpt_updates = self.state.updates
        self.checkpoints.append({"path": path, "updates": self.state.updates, "samples": self.state.samples,
                                 "pushes": self.state.pushes,
                                 "why": why, "seconds": round(time.time() - t, 4)})
        self.event("checkpoint", path=path, updates=self.state.updates, why=why,
                   samples=self.state.samples, pushes=self.state.pushes, round=self.state.round)
        return path

    # -- state beyond the weights, saved beside each checkpoint ------------------------------
    def save_state(self) -> dict:
        """The books and the running policy's learned state (JSON)."""
        return {"ledger": self.state.save_state(),
                "policy": self._policy.save_state() if self._policy is not None else {}}

    def hand_over(self, state: dict, policy: Policy, why: str) -> bool:
        """Give ``policy`` (fresh, before its start) a saved policy state of the same
        protocol; a state that does not fit it is refused, said in an event, and the
        policy starts afresh. Returns whether it took the state."""
        if not state or state.get("protocol") != policy.name:
            return False
        try:
            policy.restore_state(state, workers=self.workers)
        except ValueError as e:
            logger.warning("%s: %s starts afresh: %s", why, policy.name, e)
            self.event("policy_state", protocol=policy.name, restored=False, why=why, reason=str(e))
            return False
        self.event("policy_state", protocol=policy.name, restored=True, why=why)
        return True

    def switch_to(self, old: Policy, phase: Phase, index: int, carry: bool = True) -> None:
        """Drain ``old``, switch to ``phase`` hot or by restart; with ``carry``, a policy of
        the same protocol takes over what ``old`` learned (``hand_over``)."""
        t0 = time.time()
        self.drain(old)
        t_drained = time.time()
        parts = {}
        if phase.switch == "restart":
            path = self.checkpoint("switch")
            parts["save_s"] = time.time() - t_drained
            cluster = self._next_cluster or self._launch()
            self._next_cluster = None
            t = time.time()
            if self.evaluator is not None:
                self.evaluator.wait()
            self._close_generation(kill=True)
            parts["stop_old_s"] = time.time() - t
            t = time.time()
            parts.update(self._open_generation(cluster, restore=path))
            parts["start_new_s"] = time.time() - t
        if carry and phase.policy is not old:
            self.hand_over(old.save_state(), phase.policy, "switch")
        self._set_config(phase)
        t1 = time.time()
        event = {"index": index, "from": old.name, "to": phase.policy.name, "method": phase.switch,
                 "samples": self.state.samples, "updates": self.state.updates,
                 "drain_s": round(t_drained - t0, 4), "switch_s": round(t1 - t_drained, 4),
                 "overhead_s": round(t1 - t0, 4), **{k: round(v, 4) for k, v in parts.items()}}
        self.switches.append(event)
        self.event("switch", **event)
        logger.info("switched %s -> %s by %s in %.3f s", old.name, phase.policy.name, phase.switch, t1 - t0)

    def _set_config(self, phase: Phase) -> None:
        self.state.lr_scale = phase.lr_scale
        momentum = phase.momentum(0) if callable(phase.momentum) else phase.momentum
        self._gen.set_hyper(lr_scale=phase.lr_scale, momentum=momentum)

    # -- the whole run -------------------------------------------------------------------
    def run(self, phases: list[Phase], total_samples: int, restore: str | None = None,
            resume: dict | None = None) -> dict:
        """Train through ``phases`` for ``total_samples`` examples; returns the summary.

        ``resume``: a checkpoint event of an earlier run of this job (``last_checkpoint``):
        the weights come from its ``path`` and the counters (samples, updates, pushes,
        round) continue from it, so phases already done are skipped."""
        if not phases:
            raise ValueError("run() needs at least one phase")
        self._closing = False
        self._t0 = time.time()
        self.recorder.begin(self._t0, resume=resume is not None, workers=self.workers, ps=self.ps)
        saved = None
        if resume:
            restore = resume["path"]
            self.state.round = int(resume.get("round", 0))
            self.rewind(resume, "resume")
            self.recorder.event("resume", **resume)
            saved = load_state(restore)
            if saved is not None:  # clocks, membership, rate factor too
                self.state.restore_state(saved["ledger"])
        try:
            if hasattr(self.progress, "starting"):
                self.progress.starting(self)
            self._open_generation(self._launch(), restore=restore)
            self.train_started = time.time()  # rates over training time start here (tfsync.progress)
            t_init = self.train_started - self._t0
            if self.on_start is not None:
                self.on_start()
            self._set_config(phases[0])
            # the phase the checkpoint was taken in gets its policy's saved state
            resumed = None if saved is None else \
                next((p for p in phases if p.until * total_samples > self.state.samples), phases[-1])
            stopped = None
            for i, phase in enumerate(phases):
                if i > 0:
                    self.switch_to(phases[i - 1].policy, phase, len(self.timeline), carry=phase is not resumed)
                if phase is resumed:
                    self.hand_over(saved["policy"], phase.policy, "resume")
                if i + 1 < len(phases) and phases[i + 1].switch == "restart" and self._next_cluster is None:
                    self._next_cluster = self._launch()  # new tasks start while this phase trains
                self.begin_phase(phase)
                try:
                    self._run_phase(phase, int(round(phase.until * total_samples)), total_samples)
                except StopRequested as stop:
                    stopped = stop
                finally:
                    self.timeline[-1]["stats"] = phase.policy.stats()  # e.g. FluentPS's delayed pulls
                if stopped:
                    break
            wall = time.time() - self._t0
            if stopped is None:
                self.checkpoint("final")
            summary = self._summary(wall, t_init, total_samples)
            summary["stopped"] = stopped is not None
            if resume:
                summary["resumed_from"] = resume
            if stopped is not None:
                summary["stop_checkpoint"] = stopped.checkpoint_path
            self.recorder.summary(summary)
            self.close()
            return summary
        finally:
            self.close(graceful=False)  # on failure or Ctrl-C: kill the tasks at once

    def evaluate(self) -> float | None:
        """Test accuracy of the current weights on the whole test set, computed on the
        coordinator (after a background evaluation still running)."""
        return self.test_scores()["accuracy"]

    def test_scores(self) -> dict:
        """``evaluator.scores`` (loss, accuracy, metrics) of the current weights on the whole test set."""
        if self.setup.x_test is None or self._gen is None:
            return {"loss": None, "accuracy": None, "metrics": {}}
        if self.evaluator is not None:
            self.evaluator.wait()
        return scores(self._local_model(), self.setup.x_test, self.setup.y_test, self.setup.loss_fn,
                      self.setup.metrics)

    def _local_model(self):
        """A copy of the model here with the current weights."""
        local = self.setup.model_fn()
        local.set_weights(self._gen.model.get_weights())
        return local

    def test_loss(self) -> float | None:
        return self.test_scores()["loss"]

    def _evaluate_if_due(self) -> None:
        ev = self.evaluator
        if ev is None:
            return
        for e in ev.drain():
            self._log_eval(e)
        s = self.state
        if ev.due(s.pushes):
            ev.request(self._gen, s.pushes, s.updates, s.samples, self.recorder.since())

    def _log_eval(self, e: Evaluation) -> None:
        self.evals.append(e)
        self.recorder.evaluation(e.to_dict(), self.state.pushes if e.pushes is None else e.pushes)

    def final_weights(self) -> list[np.ndarray]:
        return self._final_weights

    def _summary(self, wall: float, t_init: float, total: int) -> dict:
        s = self.state
        train = max(wall - t_init, 1e-9)
        self._final_weights = self._gen.weights()
        final = self.test_scores()
        acc = final["accuracy"]
        ev = self.evaluator
        if ev is not None:  # the curve's last point, on the evaluator's own test subset
            for e in ev.drain():
                self._log_eval(e)
            t = time.perf_counter()
            last = final if arrays.length(ev.y) == arrays.length(self.setup.y_test) else ev.evaluate(self._gen)
            self._log_eval(Evaluation(s.updates, s.samples, self.recorder.since(), last["accuracy"],
                                      time.perf_counter() - t, last["loss"], last["metrics"], s.pushes))
        curve = [e.accuracy for e in self.evals if e.accuracy is not None]
        return {
            "wall_s": round(wall, 3), "init_s": round(t_init, 3), "started_at": round(self._t0, 3),
            "time_base": round(self.recorder.origin, 3), "workers": self.workers, "ps": self.ps,
            "pushes": s.pushes, "updates": s.updates, "samples": s.samples, "dropped": s.dropped,
            # rates over training time: the cluster's start (init_s) left out
            "train_s": round(train, 3), "workload_samples": total, "pushes_per_s": round(s.pushes / train, 3),
            "samples_per_s": round(s.samples / train, 3), "test_accuracy": acc, "test_loss": final["loss"],
            **{f"test_{k}": v for k, v in final["metrics"].items()},
            "timeline": self.timeline, "switches": self.switches, "checkpoints": self.checkpoints,
            "clocks": list(s.clocks), "control_s": round(self._control_s, 6), "recoveries": self.recovery_log,
            "optimizer_iterations": int(self._gen.optimizer.iterations.numpy()),
            "meta": self.setup.meta,
            "evals": [e.to_dict() for e in self.evals],
            "converged_accuracy": converged_accuracy(curve) if curve else acc,
            "evals_skipped": self.evaluator.skipped if self.evaluator is not None else 0,
            # what protects the task ports: a string (local cluster), or per node (hooks)
            "task_ports": self._gen.cluster.task_ports() if hasattr(self._gen.cluster, "task_ports")
            else netns.describe(getattr(self._gen.cluster, "network", None)),
            # each worker's last CPU/memory reading (cpu: contention; "node" where its hook measured it)
            "resources": {str(w): r for w, r in sorted(self.monitor.latest().items())},
        }

    def close(self, graceful: bool = True) -> None:
        """Stop training and every task process this engine started (idempotent)."""
        self._closing = True
        self.monitor.stop()
        try:
            if self._gen is not None:
                try:
                    self._close_generation(kill=not graceful)
                except Exception as e:  # the cluster may already be gone
                    logger.debug("closing generation: %s", e)
        finally:
            for c in self._clusters:
                c.stop()
            self.recorder.close()
