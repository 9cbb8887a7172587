"""The engine's loop: the hot path of a run, in one place.

It takes each finished step (``results.next_result``), has the run log count it, asks the
running policy, and carries out its decision: tokens released to the workers' gates and
barriers, through the generation's ordered channel to the PS; a round the PS runs itself
(``pilot``) it only observes. Between pushes it obeys the manager's commands, takes
periodic checkpoints and has the lifecycle recover lost tasks and rejoin nodes.

What it holds is the state of the hot path: the policy and phase running now, the plan's
phases (a scale changes those still to run), whether it drains, the policy's next timer,
and the PS's rounds. The cluster's generations are the lifecycle's
(``tfsync.engine.lifecycle``), the counts, records and checkpoints the run log's
(``tfsync.engine.runlog``). Switching, commands, scaling, recovery and the wait for
results receive this loop, with the lifecycle and the run log as its parts.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Callable

import tensorflow as tf

from ..policy.base import ClusterView, Decision, Policy, PolicyError
from .channel import ChannelError
from .commands import Controller, obey
from .lifecycle import Lifecycle
from .phase import EngineError, Phase
from .pilot import ROUND_CLOSED, Pilot
from .recovery import recover_lost_ps, rejoin_nodes
from .results import Backlog, next_result
from .runlog import RunLog
from .scaling import Elastic

logger = logging.getLogger(__name__)

PILOT_LINGER_S = 0.05   # how long records wait while the PS runs the rounds (Loop._pace)


class Loop:
    def __init__(self, lifecycle: Lifecycle, log: RunLog, lr_rule: Callable[[str, int], float], elastic: Elastic,
                 controller: Controller, on_push: Callable, on_step_done: Callable[[float], None],
                 evaluator=None, checkpoint_every: int = 0, timeout_s: float = 600.0, epoch_samples: int = 1,
                 ps_rounds: bool = True):
        """``on_push(push, record)``: the run's observers, after each counted push and its
        grants; ``on_step_done(seconds)``: the time between two pushes, observers included
        (they are timed against it); ``lr_rule(protocol, workers)``: the rate factor a
        protocol switched to by a command runs at; ``evaluator``: the background one,
        waited for before tasks stop."""
        self.lifecycle, self.log = lifecycle, log
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
        self.held = None                   # (generation, rows) of a drained batch not yet taken (next_result)
        self.backlog = Backlog()           # the batches waiting behind each one taken
        self.pilot = Pilot(self, enabled=ps_rounds)
        lifecycle.on_close.append(self.pilot.abandon)

    @property
    def ledger(self):
        """The run's counts (``log.ledger``): pushes, updates, samples, clocks, grants."""
        return self.log.ledger

    @property
    def workers(self) -> int:
        return self.lifecycle.workers

    def view(self) -> ClusterView:
        return self.ledger.view(time.time(), self.lifecycle.monitor.latest())

    def in_flight(self) -> int:
        return self.ledger.in_flight()

    # -- carrying out decisions ----------------------------------------------------------
    def apply(self, decision: Decision) -> None:
        s, gen, channel = self.ledger, self.lifecycle.current, self.lifecycle.channel
        if self.phase_end is not None:  # no step granted ahead that the phase has no work for
            decision = s.within(decision, self.phase_end)
        if self.checkpoint_every:   # nor past the next periodic checkpoint, which would wait for it
            decision = s.within_updates(decision, self.log.updates_to_checkpoint(self.checkpoint_every))
        pending = len(s.pending_workers)
        applied = s.apply(decision, time.time())
        calls = []   # on the PS, in order, after the round closed here and before the grants
        if applied.undone is not None:
            calls.append(gen.restore_kept)
            self.log.rewound("undo")
        elif decision.undo:   # (no mark)
            logger.warning("the policy asked to undo its updates since it kept the weights, but no copy is kept "
                           "(none was asked for, or the cluster restarted since): nothing is undone")
        if applied.hyper_changed:
            scale, momentum = s.lr_scale, s.momentum
            calls.append(lambda: gen.set_hyper(lr_scale=scale, momentum=momentum))
        if decision.keep_weights:
            calls.append(gen.keep_weights)
        rows, rounds = self.pilot.rows(decision, applied.seqs)
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
            self.pilot.launch(rounds, rows, decision)
        if decision.grants:
            logger.debug("grant %s", [(g.worker, g.batch_size, g.mode.value) for g in decision.grants])
        self.wake_at = decision.wake_at if decision.wake_at is not None else self.wake_at

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
            if self.in_flight() == 0 and not self.pilot.active and self.log.checkpoint_due(self.checkpoint_every):
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
            self._pace(policy)
            if self.ledger.samples >= end_samples:  # the workload of this phase is done: drain, grant nothing more
                self.on_push(push, line)
                continue
            decision = policy.on_push(push, self.view())
            if self.pilot.active:   # the PS closes the rounds: a round's end only resizes them
                self.pilot.follow(decision)
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
                obey(self, phase, cmd)
                policy = self.policy = phase.policy
            now = time.perf_counter()
            if t_push is not None:
                self.on_step_done(now - t_push)
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
            if self.ledger.samples >= end_samples:   # the drain finished the phase: what ends it saves
                return True
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
        if self.in_flight() == 0 and self.wake_at is None and not self.log.checkpoint_due(self.checkpoint_every):
            raise PolicyError(f"policy {policy.name!r} granted no step while every worker is idle: training would hang")

    def drain(self, policy: Policy) -> None:
        """Wait for every granted step, then apply what the round aggregated."""
        self.policy, self.draining = policy, True
        self.pilot.halt()
        self._pace(None)   # every record at once: what follows may need them so
        try:
            while self.in_flight() > 0 or self.pilot.active:
                result = next_result(self)
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

    # -- checkpoints ---------------------------------------------------------------------
    def checkpoint(self, why: str) -> str:
        """Save the weights, the ledger and the policy's state (``RunLog.checkpoint``)."""
        return self.log.checkpoint(self.lifecycle.current, self.save_state, why)

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
