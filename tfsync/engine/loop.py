"""The engine's loop: the hot path of a run, in one place.

It takes each finished step (``results.Arrivals``), has the run log count it, asks the
running policy, and carries out its decision: tokens released to the workers' gates and
barriers, through the generation's ordered channel to the PS; a round the PS runs itself
(``pilot``) it only observes. Between pushes it obeys the manager's commands, takes
periodic checkpoints and has the lifecycle recover lost tasks and rejoin nodes.

What it holds is the state of the hot path: the policy and phase running now, the plan's
phases (a scale changes those still to run), whether it drains, the policy's next timer,
the PS's rounds (``pilot``) and the results waiting (``arrivals``). The cluster's
generations are the lifecycle's (``tfsync.engine.lifecycle``), the counts, records and
checkpoints the run log's (``tfsync.engine.runlog``).

The other parts decide and the loop carries out what they decided, as Ray Train's
controller does with its policies' decisions: recovery (``recovery.after_ps_loss``,
``after_worker_loss``), scaling (``scaling.decide``, ``after_loss``), a switch command
(``commands.plan_switch``) and the PS's rounds (``Pilot.observe``) return values; none
receives this loop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Callable

import tensorflow as tf

from ..policy.base import ClusterView, Decision, Policy, PolicyError
from ..policy.checks import InvalidCommand
from . import recovery, scaling
from .channel import ChannelError
from .commands import Command, CommandResult, Controller, StopRequested, check, plan_switch
from .lifecycle import Lifecycle
from .phase import EngineError, Phase
from .pilot import ROUND_CLOSED, Pilot, is_marker
from .resources import LatestReadings
from .results import Arrivals
from .runlog import RunLog
from .scaling import Elastic, ScaleDecision
from .switching import hand_over, set_config, switch_event

logger = logging.getLogger(__name__)

PILOT_LINGER_S = 0.05   # how long records wait while the PS runs the rounds (Loop._pace)


class Loop:
    def __init__(self, lifecycle: Lifecycle, runlog: RunLog, lr_rule: Callable[[str, int], float], elastic: Elastic,
                 controller: Controller, on_push: Callable, on_step_done: Callable[[float], None],
                 evaluator=None, checkpoint_every: int = 0, timeout_s: float = 600.0, epoch_samples: int = 1,
                 ps_rounds: bool = True):
        """``on_push(push, record)``: the run's observers, after each counted push and its
        grants; ``on_step_done(seconds)``: the time between two pushes, observers included
        (they are timed against it); ``lr_rule(protocol, workers)``: the rate factor a
        protocol switched to by a command runs at; ``evaluator``: the background one,
        waited for before tasks stop."""
        self.lifecycle, self.runlog = lifecycle, runlog
        self.lr_rule, self.elastic, self.controller = lr_rule, elastic, controller
        self.on_push, self.on_step_done, self.evaluator = on_push, on_step_done, evaluator
        self.checkpoint_every, self.timeout_s = int(checkpoint_every), float(timeout_s)
        self.epoch_samples = epoch_samples
        self.policy: Policy | None = None  # the policy running now
        self.phase: Phase | None = None    # the phase running now
        self.phase_end: int | None = None  # the samples at which it ends
        self.phases: list[Phase] = []      # the run's plan (a scale changes the phases still to run)
        self.draining = False
        self.wake_at: float | None = None  # the policy's next timer
        self.commands_s = 0.0              # time spent taking commands from the controller
        self.paced_at = 0.0                # when the links were last told the policy's patience
        self.paced_piloted = False         # whether the PS ran the rounds then
        self.arrivals = Arrivals(lifecycle, self.in_flight, self._dead, self.timeout_s)   # the results waiting
        self.pilot = Pilot(runlog.ledger, lifecycle, enabled=ps_rounds)
        lifecycle.on_close.append(self.pilot.abandon)

    @property
    def ledger(self):
        """The run's counts (``runlog.ledger``): pushes, updates, samples, clocks, grants."""
        return self.runlog.ledger

    @property
    def workers(self) -> int:
        return self.lifecycle.workers

    def view(self) -> ClusterView:
        return self.ledger.view(time.time(), LatestReadings(self.lifecycle.monitor), self.phase_end)

    def in_flight(self) -> int:
        return self.ledger.in_flight()

    # -- carrying out decisions ----------------------------------------------------------
    def apply(self, decision: Decision) -> None:
        s, gen, channel = self.ledger, self.lifecycle.current, self.lifecycle.channel
        if self.phase_end is not None:  # no step granted ahead that the phase has no work for
            decision = s.within(decision, self.phase_end)
        if self.checkpoint_every:   # nor past the next periodic checkpoint, which would wait for it
            decision = s.within_updates(decision, self.runlog.updates_to_checkpoint(self.checkpoint_every))
        pending = len(s.pending_workers)
        applied = s.apply(decision, time.time())
        calls = []   # on the PS, in order, after the round closed here and before the grants
        if applied.undone is not None:
            calls.append(gen.restore_kept)
            self.runlog.rewound("undo")
        elif decision.undo:   # (no mark)
            logger.warning("the policy asked to undo its updates since it kept the weights, but no copy is kept "
                           "(none was asked for, or the cluster restarted since): nothing is undone")
        if applied.hyper_changed:
            scale, momentum = s.lr_scale, s.momentum
            calls.append(lambda: gen.set_hyper(lr_scale=scale, momentum=momentum))
        if decision.keep_weights:
            calls.append(gen.keep_weights)
        room = None if self.draining or self.phase_end is None or self.wake_at is not None \
            else self.phase_end - s.samples   # (the PS runs rounds only within the phase, with no timer set)
        rows, rounds = self.pilot.rows(decision, applied.seqs, room,
                                       lambda: self.runlog.updates_to_checkpoint(self.checkpoint_every),
                                       lambda: self.policy.steady_round(self.view()))
        if applied.closed and calls:
            # the round was pushed at the old rate (its pushes recorded it: BSP's n x eta when a
            # straggler policy goes to ASP): apply it so, then change the rate, then grant
            channel.barrier(pending, rows[:0])
            for call in calls:
                channel.call(call)
            if decision.grants:
                channel.release(rows)
        elif applied.closed:  # the channel is FIFO: earlier releases go out before the barrier
            channel.barrier(pending, rows)
        else:
            for call in calls:
                channel.call(call)  # before the grants: their steps use the new rate, the weights put back
            if decision.grants:
                channel.release(rows)  # merged there with every release still waiting
        if rounds:   # the PS closes this round and opens the next ones itself
            self.pilot.launch(rounds, rows, decision, self.policy.self_sizing)
        if decision.grants:
            logger.debug("grant %s", [(g.worker, g.batch_size, g.mode.value) for g in decision.grants])
        self.wake_at = decision.wake_at if decision.wake_at is not None else self.wake_at

    # -- what comes back -------------------------------------------------------------------
    def next_result(self):
        """The next finished step's row (``Arrivals.next``); None when a timer is due or a
        recovery left nothing in flight; ROUND_CLOSED after a round the PS closed itself,
        whose end the pilot mirrored (``_rounds_ended`` after its last)."""
        value = self.arrivals.next(lambda: self.wake_at)
        if value is None or not is_marker(value):
            return value
        ended = self.pilot.observe(value)
        if ended is not None:
            self._rounds_ended(ended.deferred)
        return ROUND_CLOSED

    def _rounds_ended(self, deferred: Decision | None) -> None:
        """The PS ran its last round (tfsync.engine.pilot): the decision that halted the
        rounds is carried out (its barrier is the round the PS closed; its grants only if
        training goes on), and where nothing is in flight then, the policy grants again."""
        go_on = not self.draining and self.phase_end is not None and self.ledger.samples < self.phase_end \
            and not self.runlog.checkpoint_due(self.checkpoint_every)
        if deferred is not None:
            self.apply(deferred if go_on else dataclasses.replace(deferred, grants=()))
        if go_on and self.in_flight() == 0:
            # halted for a command, or the halting decision granted nothing (it came within
            # a round whose end, on the coordinator, would have granted): the policy grants again
            self.apply(self.policy.start(self.view()))

    # -- a phase -------------------------------------------------------------------------
    def run_phase(self, phase: Phase, end_samples: int) -> None:
        """Train ``phase`` until the ledger counts ``end_samples``, then drain."""
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
        if self.ledger.samples < end_samples:  # (a phase done before it starts, as at a resume, grants nothing)
            self._check_live(policy)
        start_samples, epoch, t_push = self.ledger.samples, 0, None
        while self.ledger.samples < end_samples:
            if self.in_flight() == 0 and not self.pilot.active and self.runlog.checkpoint_due(self.checkpoint_every):
                self._checkpoint_if_due(phase, policy, end_samples)   # (nothing was granted past it: due now)
                continue
            if callable(phase.momentum):
                e = int((self.ledger.samples - start_samples) / self.epoch_samples)
                if e != epoch:
                    epoch = e
                    m, gen = phase.momentum(e), self.lifecycle.current
                    self.ledger.momentum = m
                    self.lifecycle.channel.call(lambda: gen.set_hyper(momentum=m))
            try:
                result = self.next_result()
            except (EngineError, ChannelError) as e:
                # a control call can fail on a PS that died before its hook reports it: wait for that
                if not self.recover_ps(phase, wait_s=5.0 if isinstance(e, ChannelError) else 0.0):
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
            self._pace(policy)
            if self.ledger.samples >= end_samples:  # the workload of this phase is done: drain, grant nothing more
                self.on_push(push, line)
                continue
            decision = policy.on_push(push, self.view())
            if self.pilot.active:   # the PS closes the rounds: a round's end only resizes them
                self.pilot.follow(decision, policy.name, lambda: policy.steady_round(self.view()))
            else:
                self.apply(decision)
                self._check_live(policy)
            self.on_push(push, line)  # observers after the grants went out
            t_commands = time.perf_counter()
            commands = self.controller.commands()
            self.commands_s += time.perf_counter() - t_commands
            if commands:
                self.pilot.halt()   # the policy decides again from the next round's end
            for cmd in commands:
                self.obey(phase, cmd)
                policy = self.policy = phase.policy
            now = time.perf_counter()
            if t_push is not None:
                self.on_step_done(now - t_push)
            t_push = now
            if not self._checkpoint_if_due(phase, policy, end_samples):
                continue   # (the PS was lost during the save: training goes on from the last checkpoint)
            back = self.lifecycle.returned()
            if back and self.ledger.samples < end_samples:
                self.rejoin(policy, back)

    def _checkpoint_if_due(self, phase: Phase, policy: Policy, end_samples: int) -> bool:
        """A periodic checkpoint where ``checkpoint_every`` updates have passed (drained,
        then the policy starts again); False if the PS died during it and training went
        back to the last one."""
        if not self.runlog.checkpoint_due(self.checkpoint_every) or self.ledger.samples >= end_samples:
            return True
        try:
            self.drain(policy)
            if self.ledger.samples >= end_samples:   # the drain finished the phase: what ends it saves
                return True
            self.checkpoint("periodic")
        except (EngineError, ChannelError, tf.errors.UnavailableError, tf.errors.CancelledError):
            # the PS died during the save (UnavailableError "Socket closed" from it, or the
            # save cancelled with the drain that waited on it)
            if not self.recover_ps(phase, wait_s=5.0):
                raise
            return False
        self.apply(policy.start(self.view()))
        return True

    def _record(self, result, policy: Policy):
        return self.runlog.record(result, policy.name, policy.predicted_speed(int(result[0])),
                               self.pilot.turnaround(result))

    def _pace(self, policy: Policy | None, every_s: float = 0.25) -> None:
        """Let the links take records in batches as far as ``policy`` can wait for them
        (``Policy.patience``; None: not at all), asked at most every ``every_s``, and at
        once when the PS starts or stops running the rounds itself: while it does, no
        round waits for the coordinator, and the records wait ``PILOT_LINGER_S`` (each
        drain costs the coordinator about 1 ms of CPU; a drain per round was a third of
        its CPU under BSP at 4 workers of a tiny model on loopback)."""
        now = time.monotonic()
        piloted = self.pilot.active and not self.pilot.halting
        if policy is not None and now < self.paced_at + every_s and piloted == self.paced_piloted:
            return
        self.paced_at, self.paced_piloted = now, piloted
        linger = 0.0 if policy is None else max(policy.patience(self.view()), PILOT_LINGER_S if piloted else 0.0)
        self.lifecycle.current.links.set_linger(linger)

    def _check_live(self, policy: Policy) -> None:
        if self.in_flight() == 0 and self.wake_at is None and not self.runlog.checkpoint_due(self.checkpoint_every):
            raise PolicyError(f"policy {policy.name!r} granted no step while every worker is idle: training would hang")

    def drain(self, policy: Policy) -> None:
        """Wait for every granted step, then apply what the round aggregated."""
        self.policy, self.draining = policy, True
        self.pilot.halt()
        self._pace(None)   # every record at once: what follows may need them so
        try:
            while self.in_flight() > 0 or self.pilot.active:
                result = self.next_result()
                if result is None or result is ROUND_CLOSED:
                    self.wake_at = None
                    continue
                push, line = self._record(result, policy)
                self.on_push(push, line)
        finally:
            self.draining = False
        self.finish(policy)

    def finish(self, policy: Policy) -> None:
        """Apply what ``policy``'s round aggregated (its ``finish``, and a barrier for a
        round still pending), and wait until the PS has it."""
        self.apply(policy.finish(self.view()))
        if self.ledger.pending_workers:
            self.apply(Decision(barrier=True))
        self.lifecycle.sync()

    def stop_generation(self) -> None:
        """Stop the current generation's tasks at once, after a background evaluation that
        reads their weights (a restart switch, a scale)."""
        if self.evaluator is not None:
            self.evaluator.wait()
        self.lifecycle.close(kill=True)

    # -- carrying out what the parts decided ----------------------------------------------
    def switch(self, old: Policy, phase: Phase, index: int, carry: bool = True, by: str = "plan") -> None:
        """Drain ``old``, switch to ``phase`` hot (same tasks) or by restart (checkpoint, new
        tasks, restore); with ``carry``, a policy of the same protocol takes over what
        ``old`` learned (``switching.hand_over``). The run log records a switch event with
        timings and ``by`` whom: the job's "plan" or a "command"."""
        t0 = time.time()
        self.lifecycle.keep_weights |= phase.policy.keeps_weights   # (the generations opened from now on)
        self.drain(old)
        t_drained = time.time()
        parts = {}
        if phase.switch == "restart":
            path = self.checkpoint("switch")
            parts["save_s"] = time.time() - t_drained
            cluster = self.lifecycle.take_next()
            t = time.time()
            self.stop_generation()
            parts["stop_old_s"] = time.time() - t
            t = time.time()
            parts.update(self.lifecycle.open(cluster, restore=path))
            parts["start_new_s"] = time.time() - t
            self.ledger.mark = None   # (the weights kept went with the old generation: nothing to undo to)
        if carry and phase.policy is not old:
            hand_over(self.runlog, old.save_state(), phase.policy, "switch")
        set_config(self.ledger, self.lifecycle.current, phase)
        t1 = time.time()
        seconds = {"drain_s": t_drained - t0, "switch_s": t1 - t_drained, "overhead_s": t1 - t0, **parts}
        self.runlog.switched(switch_event(index, old.name, phase, by, self.ledger, seconds))
        logger.info("switched %s -> %s by %s in %.3f s", old.name, phase.policy.name, phase.switch, t1 - t0)

    def obey(self, phase: Phase, cmd: Command) -> None:
        """Carry out a manager's command at this step boundary and report the outcome."""
        report, updates = self.controller.result, lambda: self.ledger.updates
        try:
            message, path = self._carry_out(phase, cmd)
        except StopRequested as stop:
            self.runlog.recorder.event("command", id=cmd.id, command=cmd.kind, message="stopping",
                                       **({"checkpoint": stop.checkpoint_path} if stop.checkpoint_path else {}))
            report(CommandResult(cmd.id, True, "stopping", updates(), stop.checkpoint_path))
            raise
        except (ValueError, PolicyError) as e:
            logger.warning("command %s (%s) refused: %s", cmd.id, cmd.kind, e)
            report(CommandResult(cmd.id, False, str(e), updates(), invalid=isinstance(e, InvalidCommand)))
            return
        except EngineError as e:   # it failed halfway (a scale whose new tasks died): the run ends with it
            report(CommandResult(cmd.id, False, str(e), updates()))
            raise
        self.runlog.recorder.event("command", id=cmd.id, command=cmd.kind, message=message)
        report(CommandResult(cmd.id, True, message, updates(), path))

    def _carry_out(self, phase: Phase, cmd: Command) -> tuple[str, str]:
        """``cmd`` inside ``phase`` (whose policy a switch replaces); returns (message,
        checkpoint path). Raises StopRequested for ``stop``; ValueError where it is refused."""
        options = check(cmd, self.workers)
        old, max_batch = phase.policy, self.lifecycle.setup.max_batch_size
        if cmd.kind == "batch_sizes":
            phase.set_batch_sizes(cmd.batch_sizes, max_batch)
            return f"batch sizes {list(cmd.batch_sizes)} from the next grant", ""
        if cmd.kind == "checkpoint":
            self.drain(old)
            path = self.checkpoint("command")
            self.apply(old.start(self.view()))
            return f"checkpoint {path}", path
        if cmd.kind == "stop":
            self.drain(old)
            raise StopRequested(self.checkpoint("stop") if cmd.save else "")
        if cmd.kind == "scale":   # this phase and the plan's later ones
            return self.scale(phase, cmd.workers), ""
        if cmd.kind == "join":
            e = self.elastic
            return scaling.join(self.lifecycle.cluster_factory, cmd.hook, self.workers, cmd.workers, e.max_workers,
                                lambda n, **detail: self.scale(phase, n, **detail), self.runlog.event), ""
        restartable = getattr(self.lifecycle.current.cluster, "restartable", True)
        plan = plan_switch(cmd, options, phase, self.workers, max_batch, self.lr_rule, restartable)
        new = plan.target.policy
        self.switch(old, plan.target, len(self.runlog.timeline), by="command")
        old_stats = old.stats()
        phase.switched(new, cmd.method, plan.target.lr_scale, plan.options)
        self.runlog.begin_phase(phase, self.lifecycle.base_lr, stats_of_previous=old_stats)
        self.apply(new.start(self.view()))
        return plan.message(old.name), ""

    def scale(self, phase: Phase, workers: int, by: str = "command", **detail) -> str:
        """Go on with ``workers`` workers (``phase`` and the plan's later ones follow:
        ``scaling.decide``); returns what was done and what it cost, in a line. ValueError,
        having changed nothing, where the scale is refused or the new tasks cannot start;
        EngineError where it fails after the old tasks stopped."""
        e, cluster = self.elastic, self.lifecycle.current.cluster
        scaling.check_scale(workers, self.workers, e, getattr(cluster, "restartable", True), self.ledger.active,
                            self.policy.name)
        decision = scaling.decide(scaling.phases_left(self.phases, phase), self.workers, workers, e, self.lr_rule,
                                  self.lifecycle.setup.max_batch_size, by=by, **detail)
        t0 = time.time()
        try:
            cluster = self.lifecycle.launch(workers)   # the new tasks start while the old ones train
        except Exception as err:   # noqa: BLE001 - e.g. the hooks' task ports are fewer than the tasks
            raise ValueError(f"{workers} workers could not be started: {err}") from None
        path = None
        try:
            self.drain(self.policy)
            path = self.checkpoint("scale")
            event = self.resize(decision, path, t0, cluster=cluster)
        except Exception as err:
            cluster.stop()
            where = f"; everything counted is in {path}: `tfsync resume`" if path else ""
            raise EngineError(f"the scale to {workers} workers failed: {err}{where}") from err
        return scaling.scaled_line(event, self.policy)

    def resize(self, decision: ScaleDecision, path: str, t0: float, cluster=None) -> dict:
        """Carry out a scale ``decision`` once the job drained and checkpointed at ``path``:
        stop the tasks, make the new count the ledger's and the lifecycle's, resize the
        phases, open ``cluster`` (or new tasks) restored from ``path`` and start the policy;
        returns the ``scaled`` event the run log records."""
        old, workers, policy, t_saved = self.workers, decision.workers, self.policy, time.time()
        rate = decision.lr_scale(self.ledger.lr_scale, policy)
        self.lifecycle.drop_next()   # tasks started ahead for a restart switch: the old count
        self.stop_generation()
        self.ledger.forget_grants()   # (after a loss: the steps the killed tasks held)
        self.ledger.resize(workers)
        decision.resize()
        t_stopped = time.time()
        opened = self.lifecycle.reopen(workers, cluster, restore=path)   # its parts' seconds
        self.ledger.lr_scale = rate
        self.lifecycle.current.set_hyper(lr_scale=rate)
        t1 = time.time()
        seconds = {"drain_save_s": t_saved - t0, "restart_s": t1 - t_stopped, **opened, "seconds": t1 - t0}
        event = decision.event(rate, self.ledger.samples, self.ledger.updates, path, seconds)
        self.runlog.scaled(event)
        if not self.draining and (self.phase_end is None or self.ledger.samples < self.phase_end):
            self.apply(policy.start(self.view()))
        logger.info("scaled %d -> %d workers (%s) in %.1f s", old, workers, decision.by, t1 - t0)
        return event

    def _dead(self, cause: BaseException | None = None) -> bool:
        """Dead tasks of the current generation (``Arrivals``' question): recover from lost
        workers (True if it did); raise for any other dead task."""
        # one look at the tasks: a second could see a death the first did not (a hook's report
        # arriving in between) and end the run for a worker that can be recovered
        dead = self.lifecycle.current.cluster.dead_tasks()
        if not dead:
            return False
        if self.lifecycle.recovering is None:
            decided = recovery.after_worker_loss(dead, self.runlog.recoveries, self.lifecycle.max_recoveries)
            if decided is not None:
                with self.lifecycle.recovering_from(decided.workers):  # their errors and deaths are expected now
                    self.recover_workers(self.policy, decided)
                return True
        lost = self.lifecycle.recovering or ()
        dead = [d for d in dead if d[0] != "worker" or d[1] not in lost]
        if dead:
            self._died(*dead[0], cause)
        return False

    def _died(self, job: str, i: int, code: int, cause: BaseException | None = None):
        run_dir = self.runlog.run_dir
        raise EngineError(f"task {job}:{i} died (exit code {code}); logs in {run_dir}/logs, "
                          f"last checkpoint in {run_dir}/checkpoints") from cause

    def recover_workers(self, policy: Policy, decided: recovery.WorkerRecovery) -> None:
        """Lost workers (``decided``): finish the live workers' steps, apply the round,
        checkpoint, and go on from it: new tasks for them, or without them where the job's
        elastic bounds allow (``scaling.after_loss``)."""
        t0 = time.time()
        self.pilot.abandon()   # rounds the PS ran: what it applied is what was counted
        # Not waiting for the live workers' running steps: ParameterServerStrategy holds every
        # closure while it waits for the lost worker to come back. What the PS has applied and
        # the engine counted is saved; steps still running anywhere are lost with the cluster.
        lost = self._lost(decided.dead)
        in_flight = self.in_flight()
        self.finish(policy)  # what the round aggregated is applied, not lost
        path = self.checkpoint("worker_lost")
        # A second look: workers lost while this loss was handled go with it (two node pods
        # deleted at once, whose hooks went silent a second apart on a busy machine: the
        # first look saw one, and the job went on at 3 workers of 4, the other never counted)
        more = [d for d in self.lifecycle.current.cluster.dead_tasks() if d[0] == "worker" and d[1] not in lost]
        if more and recovery.after_worker_loss(more, self.runlog.recoveries, self.lifecycle.max_recoveries) is None:
            self._died(*more[0])   # (recovered as often as allowed already)
        lost.update(self._lost(more))
        self.lifecycle.recovering.update(lost)   # (their closures' errors and deaths are expected too)
        lost_workers = sorted(lost)
        shrink = scaling.after_loss(scaling.phases_left(self.phases, self.phase), self.workers, lost_workers,
                                    self.elastic, self.lr_rule, self.lifecycle.setup.max_batch_size)
        shrunk = self.resize(shrink, path, t0) if shrink is not None else None   # go on without them
        if shrunk is None:
            self.lifecycle.restart(restore=path)
        for w in lost_workers:
            event = {"task": f"worker:{w}", "steps_lost": lost[w], "in_flight_lost": in_flight, "checkpoint": path,
                     "seconds": round(time.time() - t0, 3), **({"shrunk_to": shrunk["to"]} if shrunk else {})}
            if shrunk is None:
                self.runlog.recovered(event, "worker_rejoined", worker=w, steps_lost=lost[w],
                                      seconds=event["seconds"])
            else:
                self.runlog.recovered(event)
        if shrunk is None and not self.draining:   # (a shrink started the policy)
            self.apply(policy.start(self.view()))

    def _lost(self, dead) -> dict[int, int]:
        """Say that the workers of ``dead`` (job, index, exit code) died; returns each one's
        steps granted and not counted."""
        s = self.ledger
        for _, w, code in dead:
            logger.warning("worker %d died (exit code %s) at step %d; restarting the cluster from its state now",
                           w, code, s.clocks[w])
            self.runlog.event("worker_lost", worker=w, exit_code=code, step=s.clocks[w], granted=s.granted[w],
                              pushes=s.pushes)
        return {w: s.granted[w] - s.clocks[w] for _, w, _ in dead}

    def recover_ps(self, phase: Phase, wait_s: float = 0.0) -> bool:
        """Restart the cluster and restore if a PS died and a checkpoint exists
        (``recovery.after_ps_loss``); returns whether training can go on. ``wait_s``: how
        long to wait for a dead PS to show."""
        gen = self.lifecycle.current
        dead = recovery.wait_for_ps_loss(gen.cluster if gen is not None else None, wait_s)
        t0 = time.time()   # (the checkpoints' read-back counts)
        decided = recovery.after_ps_loss(dead, self.runlog.checkpoints, self.runlog.recoveries,
                                         self.lifecycle.max_recoveries)
        if decided is None:
            return False
        for path, why in decided.skipped:
            logger.warning("checkpoint %s does not read back (%s); restoring an older one", path, why)
            self.runlog.event("checkpoint_skipped", path=path, reason=why)
        last = decided.checkpoint
        if last is None:
            return False
        logger.warning("task %s:%d died; restarting the cluster from %s", decided.task[0], decided.task[1],
                       last["path"])
        self.lifecycle.restart(restore=last["path"])
        lost = self.ledger.samples - last["samples"]
        self.runlog.rewind(last, "ps_lost")
        self.runlog.recovered(decided.event(lost, time.time() - t0), "task_restarted")
        self.apply(phase.policy.start(self.view()))
        return True

    def rejoin(self, policy: Policy, back: list[str]) -> None:
        """Nodes the current generation left out (``back``: their hooks, which answer again)
        are used again: drain, checkpoint, and restart on every node that answers. Nothing
        counted is lost; the restart costs a few seconds, as a restart switch does."""
        t0 = time.time()
        self.drain(policy)
        path = self.checkpoint("node_rejoined")
        self.lifecycle.restart(restore=path)
        still_out = self.lifecycle.left_out()   # a node lost again before the new generation started
        for node in back:
            if node not in still_out:
                logger.warning("node %s is back: its hook answers again; the cluster now uses it", node)
                self.runlog.event("node_rejoined", node=node, checkpoint=path, seconds=round(time.time() - t0, 3))
        self.apply(policy.start(self.view()))

    # -- checkpoints ---------------------------------------------------------------------
    def checkpoint(self, why: str) -> str:
        """Save the weights, the ledger and the policy's state (``RunLog.checkpoint``)."""
        return self.runlog.checkpoint(self.lifecycle.current, self.save_state, why)

    def save_state(self) -> dict:
        """The ledger and the running policy's learned state (strict JSON), saved beside
        checkpoints; a policy state that is not (a diverged predictor's inf) is left out,
        said in a policy_state event, and the policy starts afresh at a resume."""
        policy = self.policy.save_state() if self.policy is not None else {}
        try:
            json.dumps(policy, allow_nan=False)
        except (TypeError, ValueError) as e:
            logger.warning("%s's state is not saved with the checkpoint: %s", self.policy.name, e)
            self.runlog.event("policy_state", protocol=self.policy.name, saved=False, reason=str(e))
            policy = {}
        changed = {"until": self.phase.until, **self.phase.changed} if self.phase and self.phase.changed else {}
        return {"ledger": self.ledger.save_state(), "policy": policy, **({"changed": changed} if changed else {})}
