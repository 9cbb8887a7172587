"""The engine: runs synchronization policies on ParameterServerStrategy.

Every worker always has standing closures (2 per worker) that block on its gate on the
PS. The engine's loop (``tfsync.engine.loop``) takes each finished step, updates the
cluster view, asks the policy, and carries out its decision: a barrier (apply the round's
weighted mean) and/or tokens released to gates. Phases run one policy each; between
phases the engine drains the cluster and switches hot (same tasks) or by restart
(checkpoint, new tasks, restore). The engine is three parts with their own state: the
loop, the cluster's lifecycle (generations, recovery's restarts, nodes that rejoin) and
the run log (ledger, records, checkpoints, timeline); this class makes them and runs the
plan's phases through them.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from ..base import nospace
from ..policy.catalogue import aggregating
from ..base.quiet import quiet_tf_loggers
from .callbacks import CallbackList, ControllerLink, Evaluations, ProgressDisplay
from .commands import Controller, StopRequested
from .evaluator import Evaluator
from .generation import Generation, TrainSetup
from .lifecycle import Lifecycle
from .loop import Loop
from .phase import EngineError, Phase
from .runlog import RunLog
from .scaling import Elastic, rescale
from .summary import failure_summary, summarize, whole_job
from .switching import carry_changes, resume_from, resume_policy, set_config
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
        self.setup, self.ps, self.host, self.run_dir = setup, ps, host, run_dir
        # the ledger, records, timeline, checkpoints, recoveries, test curve (tfsync.engine.runlog)
        self.runlog = RunLog(run_dir, workers, tensorboard=tensorboard,
                          on_event=lambda kind, fields: self.callbacks.call("on_event", self, kind, fields))
        self.lifecycle = Lifecycle(setup, self.runlog.ledger, workers, ps, host, run_dir, start_timeout,
                                   cluster_factory, base_lr=base_lr)
        self.lifecycle.node_wait_s = float(node_wait_s)
        self.lifecycle.on_pause = lambda kind, **fields: self.runlog.event(kind, **fields)
        self.controller = controller or Controller()
        self._link = ControllerLink(self.controller)
        self.total_samples = 0
        self._final_weights = None
        self.evaluator = None  # test loss, accuracy, metrics every ``eval_every`` steps, in the background
        if eval_every and setup.x_test is not None:
            self.evaluator = Evaluator(setup.model_fn, setup.x_test, setup.y_test, eval_every,
                                       samples=eval_samples or None, loss_fn=setup.loss_fn, metrics=setup.metrics)
        self.on_start = on_start
        self.callbacks = CallbackList([self._link, *([ProgressDisplay(progress)] if progress else []),
                                       *([Evaluations(self.evaluator)] if self.evaluator else []), *callbacks])
        self.loop = Loop(self.lifecycle, self.runlog,
                         lr_rule or (lambda protocol, n: float(n) if aggregating(protocol) else 1.0),
                         Elastic(scale_rule, min_workers, max_workers, fits), self.controller,
                         on_push=lambda push, line: self.callbacks.call("on_push", self, push, line),
                         on_step_done=self.callbacks.step_done, evaluator=self.evaluator,
                         checkpoint_every=checkpoint_every, timeout_s=timeout_s,
                         epoch_samples=epoch_samples or setup.train_examples, ps_rounds=ps_rounds)

    # -- what observers read (callbacks, the progress display) ----------------------------
    @property
    def ledger(self):
        """The run's counts (``runlog.ledger``): pushes, updates, samples, clocks, grants."""
        return self.runlog.ledger

    @property
    def history(self):
        """Recent pushes, newest last."""
        return self.ledger.history

    @property
    def generation(self) -> Generation | None:
        """The cluster generation training now (None before the first and after the end)."""
        return self.lifecycle.current

    @property
    def workers(self) -> int:
        return self.lifecycle.workers

    @property
    def policy(self):
        """The policy running now."""
        return self.loop.policy

    # -- the whole run -------------------------------------------------------------------
    def run(self, phases: list[Phase], total_samples: int, restore: str | None = None,
            resume: dict | None = None) -> dict:
        """Train through ``phases`` for ``total_samples`` examples; returns the summary.

        ``resume``: a checkpoint event of an earlier run of this job (``last_checkpoint``):
        the weights come from its ``path`` and the counters (samples, updates, pushes,
        round) continue from it, so phases already done are skipped."""
        if not phases:
            raise ValueError("run() needs at least one phase")
        self.total_samples, self.loop.phases = total_samples, phases
        self.lifecycle.keep_weights = any(p.policy.keeps_weights for p in phases)
        self.runlog.begin(self.workers, self.ps, resume=resume is not None)
        saved = resume_from(self.runlog, resume) if resume else None
        restore = resume["path"] if resume else restore
        try:
            self.callbacks.call("on_train_begin", self)
            self.lifecycle.open(self.lifecycle.launch(), restore=restore)
            self.runlog.training_began()
            t_init = self.runlog.train_started - self.runlog.started_at
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
                    rescale(phases[first:], resume["plan_workers"], self.workers, self.loop.elastic.rule,
                            self.loop.lr_rule, self.setup.max_batch_size)()
                except ValueError as e:
                    raise EngineError(f"resume with the {self.workers} workers the job was scaled to: {e}") from None
            if resumed is not None and resume.get("changed"):   # as the commands before the stop left it
                carry_changes(resumed, resume["changed"], self.workers, self.setup.max_batch_size)
                self.lifecycle.keep_weights |= resumed.policy.keeps_weights   # (from the next generation)
            set_config(self.ledger, self.generation, phases[first])
            stopped = None
            for i, phase in enumerate(phases):
                if i < first:
                    continue
                if i > first:
                    self.loop.switch(phases[i - 1].policy, phase, len(self.runlog.timeline), carry=phase is not resumed)
                if phase is resumed:
                    resume_policy(self.runlog, self.generation, saved, phase.policy)
                if i + 1 < len(phases) and phases[i + 1].switch == "restart" and self.lifecycle.next_cluster is None:
                    self.lifecycle.start_next()  # new tasks start while this phase trains
                self.runlog.begin_phase(phase, self.lifecycle.base_lr)
                try:
                    self.loop.run_phase(phase, int(round(phase.until * total_samples)))
                except StopRequested as stop:
                    stopped = stop
                finally:
                    self.runlog.timeline[-1]["stats"] = phase.policy.stats()  # e.g. FluentPS's delayed pulls
                if stopped:
                    break
            wall = time.time() - self.runlog.started_at
            self.runlog.training_ended()
            if stopped is None:
                self.loop.checkpoint("final")
            self._final_weights = self.generation.weights()
            summary = summarize(self, wall, t_init, total_samples, stopped, resume)
            self.runlog.recorder.summary(summary)
            self.close()
            return summary
        except nospace.NoSpaceError as e:   # what was done, if the disk still takes that much
            try:
                self.runlog.recorder.summary(whole_job(self.run_dir, resume, failure_summary(
                    self, time.time() - self.runlog.started_at, total_samples, e, resume)))
            except nospace.NoSpaceError:
                logger.warning("no summary.json: the disk is full")
            raise
        finally:
            self.close(graceful=False)  # on failure or Ctrl-C: kill the tasks at once

    def final_weights(self) -> list[np.ndarray]:
        return self._final_weights

    def control_seconds(self) -> float:
        """Time the loop spent with the controller: records, events, commands."""
        return self.callbacks.seconds(self._link) + self.loop.commands_s

    def close(self, graceful: bool = True) -> None:
        """Stop training and every task process this engine started (idempotent)."""
        self.lifecycle.monitor.stop()
        try:
            if self.generation is not None:
                try:
                    self.lifecycle.close(kill=not graceful)
                except Exception as e:  # the cluster may already be gone
                    logger.debug("closing generation: %s", e)
        finally:
            self.lifecycle.stop_all()
            self.runlog.recorder.close(strict=graceful)   # a failing run keeps its own error
