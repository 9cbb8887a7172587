"""The engine: runs synchronization policies on ParameterServerStrategy.

Every worker always has standing closures (2 per worker) that block on its gate on the
PS. The coordinator's loop takes each finished step, updates the cluster view, asks the
policy, and carries out its decision: a barrier (apply the round's weighted mean) and/or
tokens released to gates. Phases run one policy each; between phases the engine drains
the cluster and switches hot (same tasks) or by restart (checkpoint, new tasks, restore).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Callable

import numpy as np
import tensorflow as tf

from ..base import nospace
from ..policy.base import ClusterView, Decision, Policy, PolicyError
from ..policy.catalogue import aggregating
from ..base.quiet import quiet_tf_loggers
from .callbacks import CallbackList, ControllerLink, Evaluations, ProgressDisplay
from .channel import ChannelError
from .commands import Controller, StopRequested, obey
from .evaluator import Evaluator
from .generation import Generation, TrainSetup
from .lifecycle import Lifecycle
from .pilot import ROUND_CLOSED, Pilot
from .phase import EngineError, Phase  # noqa: F401 - the engine's public names
from .recovery import recover_lost_ps, rejoin_nodes
from .resources import ResourceMonitor
from .runlog import RunLog
from .scaling import rescale
from .summary import failure_summary, summarize, whole_job
from .switching import carry_changes, resume_from, resume_policy, set_config, switch
from .results import next_result
from .tfcompat import quiet_resource_deleters

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, setup: TrainSetup, workers: int = 2, ps: int = 1, host: str = "127.0.0.1",
                 run_dir: str = "runs/engine", base_lr: float | None = None,
                 checkpoint_every: int = 0, timeout_s: float = 600.0, tensorboard: bool = True,
                 progress=None, start_timeout: float = 120.0, epoch_samples: int | None = None,
                 controller: Controller | None = None, eval_every: int = 0, eval_samples: int = 0,
                 on_start: Callable | None = None, cluster_factory: Callable | None = None,
                 callbacks=(), ps_rounds: bool = True, lr_rule: Callable[[str, int], float] | None = None,
                 scale_rule: str = "local", min_workers: int | None = None, max_workers: int | None = None,
                 fits: Callable[[int], None] | None = None, node_wait_s: float = 0.0):
        """``progress``: a ``progress(engine, policy, total)`` display; ``controller``:
        commands from a manager, at step boundaries; ``callbacks``: more observers
        (tfsync.engine.callbacks.Callback); ``on_start``: called once training starts
        (e.g. a straggler injector); ``cluster_factory``: makes each generation's tasks;
        ``ps_rounds``: steady BSP rounds run on the PS alone (tfsync.engine.pilot);
        ``lr_rule(protocol, workers)``: the learning-rate factor a protocol switched to by a
        command runs at (the job's configuration policy; default its paper rule: n for a
        protocol that averages the workers' gradients, 1 for the others); ``scale_rule``:
        the rate and batch across a change of the worker count (tfsync.engine.scaling);
        ``min_workers`` / ``max_workers``: the bounds a scale keeps to; with ``min_workers``
        a lost worker shrinks the job while that many remain, instead of restarting;
        ``fits(n)``: raises where n workers do not fit the machine (tfsync.job.limits);
        ``node_wait_s``: how long the job pauses, when none of its node hooks answers,
        for one to come back (0: it fails at once)."""
        quiet_resource_deleters()  # no tracebacks from TF freeing resources of stopped tasks
        quiet_tf_loggers()  # nor a log line per closure a teardown cancels (tfsync.base.quiet)
        self.setup = setup
        self.workers, self.ps, self.host = workers, ps, host
        self.lifecycle = Lifecycle(setup, workers, ps, host, run_dir, start_timeout, cluster_factory)
        self.lifecycle.node_wait_s = float(node_wait_s)
        self.lifecycle.on_pause = lambda kind, **fields: self.log.event(kind, **fields)
        self.run_dir = run_dir
        self.checkpoint_every = int(checkpoint_every)
        self.timeout_s = float(timeout_s)
        self.controller = controller or Controller()
        self._link = ControllerLink(self.controller)
        self._commands_s = 0.0  # time the loop spent taking commands from the controller
        # the ledger, records, timeline, checkpoints, recoveries, test curve (tfsync.engine.runlog)
        self.log = RunLog(run_dir, workers, tensorboard=tensorboard,
                          on_event=lambda kind, fields: self.callbacks.call("on_event", self, kind, fields))
        self.policy: Policy | None = None  # the policy running now
        self.phase: Phase | None = None  # the phase running now
        self.phase_end: int | None = None  # the samples at which it ends
        self.lr_rule = lr_rule or (lambda protocol, n: float(n) if aggregating(protocol) else 1.0)
        self.scale_rule = scale_rule
        self.min_workers, self.max_workers, self.fits = min_workers, max_workers, fits
        self.phases: list[Phase] = []   # the run's plan (a scale changes the phases still to run)
        self.pilot = Pilot(self, enabled=ps_rounds)
        self.total_samples = 0
        self.draining = False
        self.epoch_samples = epoch_samples or setup.train_examples
        self.wake_at: float | None = None
        self.base_lr = base_lr
        self._final_weights = None
        self.evaluator = None  # test loss, accuracy, metrics every ``eval_every`` steps, in the background
        if eval_every and setup.x_test is not None:
            self.evaluator = Evaluator(setup.model_fn, setup.x_test, setup.y_test, eval_every,
                                       samples=eval_samples or None, loss_fn=setup.loss_fn, metrics=setup.metrics)
        self.monitor = ResourceMonitor()  # CPU/memory per worker task for the policies (view.resources)
        self.on_start = on_start
        self.callbacks = CallbackList([self._link, *([ProgressDisplay(progress)] if progress else []),
                                       *([Evaluations(self.evaluator)] if self.evaluator else []), *callbacks])

    # -- cluster generations ------------------------------------------------------------
    def open_generation(self, cluster, restore: str | None = None) -> dict:
        """Connect to ``cluster``, build (and restore) the model there; returns timings."""
        gen, timings = self.lifecycle.open(cluster, restore, self.ledger.round)
        self.monitor.set_pids(gen.cluster.worker_pids())   # (another cluster where a connect failed)
        self.monitor.set_remote(getattr(gen.cluster, "resource_readings", None))  # workers on other nodes
        self.monitor.start()
        if self.base_lr is None:
            self.base_lr = gen.learning_rate  # None under a schedule
        elif gen.learning_rate is None:
            raise EngineError(f"base_lr = {self.base_lr} given, but the optimizer's learning rate is a schedule; "
                              "leave base_lr unset (the schedule is the base rate)")
        gen.set_hyper(base_lr=self.base_lr, lr_scale=self.ledger.lr_scale)
        self.lifecycle.stand()
        return timings

    def close_generation(self, kill: bool = True) -> None:
        self.pilot.abandon()
        self.lifecycle.close(kill)

    @property
    def ledger(self):
        """The run's counts (``log.ledger``): pushes, updates, samples, clocks, grants."""
        return self.log.ledger

    @property
    def generation(self) -> Generation | None:
        """The cluster generation training now (None before the first and after the end)."""
        return self.lifecycle.current

    def restart_generation(self, restore: str) -> None:
        """Replace every task: stop this generation's, start new ones restored from the
        checkpoint ``restore``; nothing is granted in the new generation yet."""
        self.close_generation(kill=True)
        self.open_generation(self.lifecycle.launch(wait=True), restore=restore)
        self.ledger.forget_grants()

    def sync(self) -> None:
        """Wait until every release and barrier sent to the PS has landed."""
        self.lifecycle.channel.sync()

    # -- the view a policy sees ----------------------------------------------------------
    @property
    def history(self):
        """Recent pushes, newest last."""
        return self.ledger.history

    def view(self) -> ClusterView:
        return self.ledger.view(time.time(), self.monitor.latest())

    # -- carrying out decisions ----------------------------------------------------------
    def apply(self, decision: Decision) -> None:
        s, gen = self.ledger, self.generation
        pending = len(s.pending_workers)
        applied = s.apply(decision, time.time())
        if applied.lr_changed:
            scale = s.lr_scale
            rescale = lambda: gen.set_hyper(lr_scale=scale)  # noqa: E731
        rows, rounds = self.pilot.rows(decision, applied.seqs)
        if applied.closed and applied.lr_changed:
            # the round was pushed at the old rate (its pushes recorded it: BSP's n x eta when a
            # straggler policy goes to ASP): apply it so, then change the rate, then grant
            self.lifecycle.channel.barrier(pending, rows[:0])
            self.lifecycle.channel.call(rescale)
            if decision.grants:
                self.lifecycle.channel.release(rows)
        elif applied.closed:  # the channel is FIFO: earlier releases go out before the barrier
            self.lifecycle.channel.barrier(pending, rows)
        else:
            if applied.lr_changed:
                self.lifecycle.channel.call(rescale)  # before the grants: their steps use the new rate
            if decision.grants:
                self.lifecycle.channel.release(rows)  # merged there with every release still waiting
        if rounds:   # the PS closes this round and opens the next ones itself
            self.pilot.launch(rounds, rows, decision)
        if decision.grants:
            logger.debug("grant %s", [(g.worker, g.batch_size, g.mode.value) for g in decision.grants])
        self.wake_at = decision.wake_at if decision.wake_at is not None else self.wake_at

    def in_flight(self) -> int:
        return self.ledger.in_flight()

    # -- phases --------------------------------------------------------------------------
    def _run_phase(self, phase: Phase, end_samples: int) -> None:
        self.policy, self.phase = phase.policy, phase
        self.phase_end = end_samples
        try:
            self._run_until(phase, end_samples)
        finally:
            self.phase_end = None
        self.drain(self.policy)

    def _run_until(self, phase: Phase, end_samples: int) -> None:
        policy = self.policy
        self.apply(policy.start(self.view()))
        self._check_live(policy)
        start_samples, epoch, t_push = self.ledger.samples, 0, None
        while self.ledger.samples < end_samples:
            if callable(phase.momentum):
                e = int((self.ledger.samples - start_samples) / self.epoch_samples)
                if e != epoch:
                    epoch = e
                    m, gen = phase.momentum(e), self.generation
                    self.lifecycle.channel.call(lambda: gen.set_hyper(momentum=m))
            try:
                result = next_result(self)
            except (EngineError, ChannelError) as e:
                # a control call can fail on a PS that died before its hook reports it: wait for that
                if not recover_lost_ps(self, phase, wait_s=5.0 if isinstance(e, ChannelError) else 0.0):
                    raise
                continue
            if result is ROUND_CLOSED:  # the PS ran a round's end (tfsync.engine.pilot)
                if not self.pilot.active:   # its last: it stopped at a periodic checkpoint's update
                    self._checkpoint_if_due(phase, policy, end_samples)
                continue
            if result is None:  # a timer, or a recovery that left nothing in flight
                self.wake_at = None
                self.apply(policy.on_timer(self.view()))
                continue
            push, line = self._record(result, policy)
            if self.ledger.samples >= end_samples:  # the workload of this phase is done: drain, grant nothing more
                self.callbacks.call("on_push", self, push, line)
                continue
            decision = policy.on_push(push, self.view())
            if self.pilot.active:   # the PS closes the rounds: a round's end only resizes them
                self.pilot.follow(decision)
            else:
                self.apply(decision)
                self._check_live(policy)
            self.callbacks.call("on_push", self, push, line)  # observers after the grants went out
            t_commands = time.perf_counter()
            commands = self.controller.commands()
            self._commands_s += time.perf_counter() - t_commands
            if commands:
                self.pilot.halt()   # the policy decides again from the next round's end
            for cmd in commands:
                obey(self, phase, cmd)
                policy = self.policy = phase.policy
            now = time.perf_counter()
            if t_push is not None:
                self.callbacks.step_done(now - t_push)   # the time between pushes, observers included
            t_push = now
            if not self._checkpoint_if_due(phase, policy, end_samples):
                continue   # (the PS was lost during the save: training goes on from the last checkpoint)
            back = self.lifecycle.returned()
            if back and self.ledger.samples < end_samples:
                rejoin_nodes(self, policy, back)

    def _checkpoint_if_due(self, phase: Phase, policy: Policy, end_samples: int) -> bool:
        """A periodic checkpoint where ``checkpoint_every`` updates have passed (drained,
        then the policy starts again); False if the PS died during it and training went
        back to the last one."""
        if not self.log.checkpoint_due(self.checkpoint_every) or self.ledger.samples >= end_samples:
            return True
        try:
            self.drain(policy)
            self.checkpoint("periodic")
        except (EngineError, ChannelError, tf.errors.UnavailableError, tf.errors.CancelledError):
            # the PS died during the save (UnavailableError "Socket closed" from it, or the
            # save cancelled with the drain that waited on it)
            if not recover_lost_ps(self, phase, wait_s=5.0):
                raise
            return False
        self.apply(policy.start(self.view()))
        return True

    def _record(self, result, policy: Policy):
        return self.log.record(result, policy.name, policy.predicted_speed(int(result[0])),
                               self.pilot.turnaround(result))

    def save_state(self) -> dict:
        """The ledger and the running policy's learned state (strict JSON), saved beside
        checkpoints; a policy state that is not (a diverged predictor's inf) is left out,
        said in a policy_state event, and the policy starts afresh at a resume."""
        policy = self.policy.save_state() if self.policy is not None else {}
        try:
            json.dumps(policy, allow_nan=False)
        except (TypeError, ValueError) as e:
            logger.warning("%s's state is not saved with the checkpoint: %s", self.policy.name, e)
            self.log.event("policy_state", protocol=self.policy.name, saved=False, reason=str(e))
            policy = {}
        changed = {"until": self.phase.until, **self.phase.changed} if self.phase and self.phase.changed else {}
        return {"ledger": self.ledger.save_state(), "policy": policy, **({"changed": changed} if changed else {})}

    def _check_live(self, policy: Policy) -> None:
        if self.in_flight() == 0 and self.wake_at is None:
            raise PolicyError(f"policy {policy.name!r} granted no step while every worker is idle: training would hang")

    def drain(self, policy: Policy) -> None:
        """Wait for every granted step, then apply what the round aggregated."""
        self.policy, self.draining = policy, True
        self.pilot.halt()
        try:
            while self.in_flight() > 0 or self.pilot.active:
                result = next_result(self)
                if result is None or result is ROUND_CLOSED:
                    self.wake_at = None
                    continue
                push, line = self._record(result, policy)
                self.callbacks.call("on_push", self, push, line)
        finally:
            self.draining = False
        self.apply(policy.finish(self.view()))
        if self.ledger.pending_workers:
            self.apply(Decision(barrier=True))
        self.lifecycle.channel.sync()

    def checkpoint(self, why: str) -> str:
        """Save the weights, the ledger and the policy's state (``RunLog.checkpoint``)."""
        return self.log.checkpoint(self.generation, self.save_state, why)

    # -- the whole run -------------------------------------------------------------------
    def run(self, phases: list[Phase], total_samples: int, restore: str | None = None,
            resume: dict | None = None) -> dict:
        """Train through ``phases`` for ``total_samples`` examples; returns the summary.

        ``resume``: a checkpoint event of an earlier run of this job (``last_checkpoint``):
        the weights come from its ``path`` and the counters (samples, updates, pushes,
        round) continue from it, so phases already done are skipped."""
        if not phases:
            raise ValueError("run() needs at least one phase")
        self.total_samples, self.phases = total_samples, phases
        self.log.begin(self.workers, self.ps, resume=resume is not None)
        saved = resume_from(self.log, resume) if resume else None
        restore = resume["path"] if resume else restore
        try:
            self.callbacks.call("on_train_begin", self)
            self.open_generation(self.lifecycle.launch(), restore=restore)
            self.log.training_began()
            t_init = self.log.train_started - self.log.started_at
            if self.on_start is not None:
                self.on_start()
            # the phase the checkpoint was taken in gets its policy's saved state
            resumed = None if saved is None else \
                next((p for p in phases if p.until * total_samples > self.ledger.samples), phases[-1])
            # a resumed run starts in the phase its checkpoint was taken in: the phases before
            # it are done (run again, each would start its policy and train a round of it)
            first = phases.index(resumed) if resumed is not None else 0
            if resume and resume.get("plan_workers"):   # scaled before the stop: the plan for this count
                try:
                    rescale(phases[first:], resume["plan_workers"], self.workers, self.scale_rule, self.lr_rule,
                            self.setup.max_batch_size)()
                except ValueError as e:
                    raise EngineError(f"resume with the {self.workers} workers the job was scaled to: {e}") from None
            if resumed is not None and resume.get("changed"):   # as the commands before the stop left it
                carry_changes(resumed, resume["changed"], self.workers, self.setup.max_batch_size)
            set_config(self.ledger, self.generation, phases[first])
            stopped = None
            for i, phase in enumerate(phases):
                if i < first:
                    continue
                if i > first:
                    switch(self, phases[i - 1].policy, phase, len(self.log.timeline), carry=phase is not resumed)
                if phase is resumed:
                    resume_policy(self.log, self.generation, saved, phase.policy)
                if i + 1 < len(phases) and phases[i + 1].switch == "restart" and self.lifecycle.next_cluster is None:
                    self.lifecycle.next_cluster = self.lifecycle.launch()  # new tasks start while this phase trains
                self.log.begin_phase(phase, self.base_lr)
                try:
                    self._run_phase(phase, int(round(phase.until * total_samples)))
                except StopRequested as stop:
                    stopped = stop
                finally:
                    self.log.timeline[-1]["stats"] = phase.policy.stats()  # e.g. FluentPS's delayed pulls
                if stopped:
                    break
            wall = time.time() - self.log.started_at
            if stopped is None:
                self.checkpoint("final")
            self._final_weights = self.generation.weights()
            summary = summarize(self, wall, t_init, total_samples, stopped, resume)
            self.log.recorder.summary(summary)
            self.close()
            return summary
        except nospace.NoSpaceError as e:   # what was done, if the disk still takes that much
            try:
                self.log.recorder.summary(whole_job(self.run_dir, resume, failure_summary(
                    self, time.time() - self.log.started_at, total_samples, e, resume)))
            except nospace.NoSpaceError:
                logger.warning("no summary.json: the disk is full")
            raise
        finally:
            self.close(graceful=False)  # on failure or Ctrl-C: kill the tasks at once

    def final_weights(self) -> list[np.ndarray]:
        return self._final_weights

    def control_seconds(self) -> float:
        """Time the loop spent with the controller: records, events, commands."""
        return self.callbacks.seconds(self._link) + self._commands_s

    def close(self, graceful: bool = True) -> None:
        """Stop training and every task process this engine started (idempotent)."""
        self.monitor.stop()
        try:
            if self.generation is not None:
                try:
                    self.close_generation(kill=not graceful)
                except Exception as e:  # the cluster may already be gone
                    logger.debug("closing generation: %s", e)
        finally:
            self.lifecycle.stop_all()
            self.log.recorder.close(strict=graceful)   # a failing run keeps its own error
