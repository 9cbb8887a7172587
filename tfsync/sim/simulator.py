"""A discrete-event simulator of a parameter-server cluster, driving the same policy
objects as the engine (``tfsync.policy``). TF-free and deterministic for a seed.

Time is simulated seconds. A worker runs one granted step at a time: its step starts
(and reads the weights) when a grant is queued for it and it is free, lasts the speed
model's step time plus ``comm`` (pull + push), and ends with its push reaching the
server; its record's ``end`` is that arrival (the engine's is when the gradient was
computed, before the push: a simulated ``compute_s`` holds the push's half of ``comm``).
The server then asks the policy, exactly as the engine does (RLP §3.1, Algorithm 1):
AGGREGATE pushes wait for the barrier, APPLY pushes update at once.

With a ``model`` (``tfsync.sim.model``) the simulator also trains: a step computes its
gradient at the weights current when it started, so the staleness the schedule implies
is the staleness the model sees (RLP §4 trains an MLP on MNIST this way).

With ``coordinator_s`` the server's decisions cost time: the coordinator is one serial
server that spends ``coordinator_s`` on each push (its CPU per push, as
``experiments/bench_coordinator_scale.py`` measures it), so a push is counted, applied to
a ``model`` and shown to the policy, and its grants go out, when the coordinator is done
with it and every push before it. Where pushes come faster than
``1 / coordinator_s`` a second, the decisions fall behind and workers wait for their
grants: the capacity of a coordinator, projected to worker counts this machine cannot
run.

Views carry ``resources``: every worker's CPU contention as the engine's monitor reports
it, from the speed model (tfsync.sim.monitor). Learned speed predictors (LB-BSP's NARX)
train inline on the simulator's own trainer, not on the process-wide background one, so
one seed gives one run.
"""

from __future__ import annotations

import collections
import heapq
import json
import math
import os
import statistics
from dataclasses import dataclass, field

from ..base import safefile
from ..policy.base import ClusterView, Decision, Policy, PolicyError, Push, PushMode
from ..policy.ledger import Ledger
from ..predict.trainer import NarxTrainer, training_with
from ..policy.pushlog import push_record, write_jsonl
from .monitor import SimMonitor
from .speeds import SpeedModel


_TIMER, _DECIDE = -1, -2   # events other than a worker's: a policy timer; the coordinator takes a push


@dataclass
class _Step:
    grant: object
    round: int
    start: float = 0.0
    version: int = 0
    grads: object = None
    loss: float = math.nan


@dataclass
class SimResult:
    """What a run produced: the pushes (engine's format via ``records()``), counters,
    the policy's own statistics and, with a model, the accuracy curve."""

    policy: dict
    stats: dict
    time: float
    pushes: int
    updates: int
    samples: int
    dropped: int
    num_workers: int
    log: list = field(default_factory=list, repr=False)  # Push objects, arrival order
    counts: list = field(default_factory=list, repr=False)  # (updates, samples) after each push
    accuracy: list = field(default_factory=list)  # (time, updates, accuracy)
    lr: float = 0.0

    def records(self) -> list[dict]:
        out = []
        for i, (p, (updates, samples)) in enumerate(zip(self.log, self.counts), 1):
            out.append(push_record(p, time=p.arrival, pushes=i, updates=updates, samples=samples,
                                   protocol=self.policy.get("name", "?"), lr=self.lr))
        return out

    def staleness(self) -> dict:
        s = sorted(p.pushes_during for p in self.log if p.mode is PushMode.APPLY)
        if not s:
            return {"mean": 0.0, "p50": 0, "p99": 0, "max": 0}
        return {"mean": statistics.fmean(s), "p50": s[len(s) // 2],
                "p99": s[min(len(s) - 1, int(0.99 * len(s)))], "max": s[-1]}

    def time_to_accuracy(self, target: float) -> float | None:
        return next((t for t, _, a in self.accuracy if a >= target), None)

    def summary(self) -> dict:
        return {"policy": self.policy, "stats": self.stats, "time": self.time,
                "pushes": self.pushes, "updates": self.updates, "samples": self.samples,
                "dropped": self.dropped, "num_workers": self.num_workers,
                "pushes_per_s": self.pushes / self.time if self.time else 0.0,
                "staleness": self.staleness(), "accuracy": self.accuracy}

    def write(self, run_dir: str) -> str:
        """``metrics.jsonl`` and ``summary.json`` in ``run_dir``, as the engine writes them."""
        os.makedirs(run_dir, exist_ok=True)
        write_jsonl(os.path.join(run_dir, "metrics.jsonl"), self.records())
        safefile.write(os.path.join(run_dir, "summary.json"), json.dumps(self.summary(), indent=2))
        return run_dir


class Simulator:
    """``Simulator(n, SpeedModel(...)).run(policy, pushes=10_000)``.

    ``comm``: seconds of pull + push added to every step. ``model``: optional trainable
    model (``NumpyMLP``); ``lr`` its base learning rate, scaled by the policy's
    ``lr_scale``; ``eval_every``: accuracy measured every this many updates.
    ``record``: keep every Push (turn off for scheduling-only speed runs).
    ``monitor_interval``: seconds between resource samples (tfsync.sim.monitor; 0: read
    at the view's time). ``trainer``: trains learned predictors that have no trainer of
    their own, inline (``threads=0``); default a fresh one. ``coordinator_s``: the
    coordinator's time per push (0: none; see above).
    """

    def __init__(self, num_workers: int, speeds: SpeedModel | None = None, *, comm: float = 0.0,
                 model=None, lr: float = 0.05, eval_every: int = 200, record: bool = True,
                 history: int = 256, monitor_interval: float = 1.0, trainer: NarxTrainer | None = None,
                 coordinator_s: float = 0.0):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.trainer = NarxTrainer(threads=0) if trainer is None else trainer
        if self.trainer.threads != 0:
            raise ValueError(f"the simulator's trainer must train inline (threads=0) so one seed gives "
                             f"one run; got threads={self.trainer.threads}")
        self.n = num_workers
        self.speeds = speeds or SpeedModel()
        self.monitor = SimMonitor(self.speeds, num_workers, monitor_interval)
        self.comm = float(comm)
        if not coordinator_s >= 0:
            raise ValueError(f"coordinator_s must be >= 0, got {coordinator_s!r}")
        self.coordinator_s = float(coordinator_s)
        self._coordinator_free = 0.0   # when the coordinator is done with every push so far
        self._decide: dict[int, tuple] = {}   # pushes the coordinator takes at their event's time
        self.model, self.lr, self.eval_every = model, float(lr), int(eval_every)
        self.record = record
        self.now = 0.0
        self.ledger = Ledger(num_workers, history)  # counted as the engine counts (tfsync.policy.ledger)
        self._pending_grads: list = []
        self._kept: list | None = None   # the model's weights where a policy kept them (Decision.keep_weights)
        self._samples_end: int | None = None  # a run's samples limit, while it runs
        self.log: list[Push] = []
        self.counts: list[tuple[int, int]] = []
        self.accuracy: list[tuple[float, int, float]] = []
        self._queues = [collections.deque() for _ in range(num_workers)]
        self._running: list[_Step | None] = [None] * num_workers
        self._events: list = []
        self._seq = 0
        self._next_eval = 0

    # the ledger's counters, read-only here
    clocks = property(lambda self: self.ledger.clocks)
    granted = property(lambda self: self.ledger.granted)
    members = property(lambda self: self.ledger.active)
    lr_scale = property(lambda self: self.ledger.lr_scale)
    pushes = property(lambda self: self.ledger.pushes)
    updates = property(lambda self: self.ledger.updates)
    samples = property(lambda self: self.ledger.samples)

    # -- the policy's view ---------------------------------------------------------------
    def view(self) -> ClusterView:
        return self.ledger.view(self.now, self.monitor.at(self.now), self._samples_end)

    # -- running -------------------------------------------------------------------------
    def run(self, policy: Policy, *, pushes: int | None = None, updates: int | None = None,
            samples: int | None = None, time: float | None = None,
            accuracy: float | None = None) -> SimResult:
        """Run ``policy`` until one of the limits is reached (counted from now; ``accuracy``:
        the model's measured accuracy reaches it), then let the steps already granted
        finish (no new grants) and apply what is aggregated (``policy.finish``). Call
        again with another policy to switch."""
        if pushes is None and updates is None and samples is None and time is None and accuracy is None:
            raise ValueError("give a limit: pushes, updates, samples, time or accuracy")
        if accuracy is not None and self.model is None:
            raise ValueError("an accuracy limit needs a model")
        target = math.inf if accuracy is None else accuracy
        limits = (self.pushes + pushes if pushes is not None else math.inf,
                  self.updates + updates if updates is not None else math.inf,
                  self.samples + samples if samples is not None else math.inf,
                  self.now + time if time is not None else math.inf)
        if self.model is not None and not self.accuracy:
            self._evaluate()
        def done() -> bool:
            return (self.pushes >= limits[0] or self.updates >= limits[1] or self.samples >= limits[2]
                    or self.now >= limits[3] or bool(self.accuracy and self.accuracy[-1][2] >= target))

        with training_with(self.trainer):
            # as the engine: no step granted ahead that a samples limit leaves no work for
            self._samples_end = limits[2] if samples is not None else None
            try:
                self._apply(policy.start(self.view()))
                while not done():
                    if not self._events:
                        raise PolicyError(f"policy {policy.name!r} left every worker idle with nothing "
                                          f"granted (pushes so far: {self.pushes})")
                    self._event(policy, done)
            finally:
                self._samples_end = None
            self._drain(policy)
        return SimResult(policy.describe(), policy.stats(), self.now, self.pushes, self.updates,
                         self.samples, self.ledger.dropped, self.n, list(self.log), list(self.counts),
                         list(self.accuracy), self.lr)

    def _drain(self, policy: Policy) -> None:
        """The steps granted run (queued ones too: the ledger's drain rule), nothing more is granted."""
        self._events = [e for e in self._events if e[2] != _TIMER]  # timers belong to the policy
        # (pushes the coordinator has still to take are counted, and nothing granted for them)
        heapq.heapify(self._events)
        while self._events:
            self._event(None, None)
        self._apply(policy.finish(self.view()))

    def _event(self, policy: Policy | None, done) -> None:
        """The next event; a push is shown to ``policy`` unless it completed the run
        (``done()``): then nothing more is granted, as in the engine."""
        t, seq, w = heapq.heappop(self._events)
        self.now = t
        if w == _DECIDE:   # the coordinator takes a push
            self._take(policy, done, *self._decide.pop(seq))
            return
        if w == _TIMER:
            self._apply(policy.on_timer(self.view()))
            return
        step, self._running[w] = self._running[w], None
        if self.coordinator_s:   # its push waits for the coordinator to be done with every one before it
            self._coordinator_free = max(self.now, self._coordinator_free) + self.coordinator_s
            self._decide[self._schedule(self._coordinator_free, _DECIDE)] = (w, step, self.now)
        else:
            self._take(policy, done, w, step, self.now)
        if self._running[w] is None and self._queues[w]:
            self._start_step(w)

    def _take(self, policy: Policy | None, done, w: int, step: _Step, arrival: float) -> None:
        """Count ``w``'s push and show it to ``policy`` (unless it completed the run)."""
        push = self._finish_step(w, step, arrival)
        if policy is not None and not done():
            self._apply(policy.on_push(push, self.view()))

    def _schedule(self, t: float, w: int) -> int:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, w))
        return self._seq

    def _start_step(self, w: int) -> None:
        step = self._queues[w].popleft()
        step.start, step.version = self.now, self.updates
        if self.model is not None:
            step.grads, step.loss = self.model.gradient(w, step.grant.batch_size)
        self._running[w] = step
        self._schedule(self.now + self.speeds.step_time(w, step.grant.batch_size, self.now) + self.comm, w)

    def _finish_step(self, w: int, step: _Step, arrival: float) -> Push:
        """Count ``w``'s finished ``step``, which reached the server at ``arrival``."""
        g = step.grant
        push = self.ledger.push(w, g.batch_size, g.mode, step.round, step.version, start=step.start,
                               end=arrival, arrival=arrival, loss=step.loss)
        if self.model is not None and not push.dropped:
            if g.mode is PushMode.AGGREGATE:
                self._pending_grads.append((g.batch_size, step.grads))
            else:
                self._train(step.grads, self.lr * self.lr_scale)
        if self.record:
            self.log.append(push)
            self.counts.append((self.updates, self.samples))
        return push

    def _train(self, grads, lr: float) -> None:
        """An update the ledger counted, applied to the model at rate ``lr``."""
        self.model.apply(grads, lr)
        if self.updates >= self._next_eval:
            self._evaluate()

    def _evaluate(self) -> None:
        self.accuracy.append((self.now, self.updates, self.model.accuracy()))
        self._next_eval = self.updates + self.eval_every

    def _apply(self, d: Decision) -> None:
        if self._samples_end is not None:
            d = self.ledger.within(d, self._samples_end)
        lr = self.lr * self.lr_scale  # a round closed now was pushed at the rate before this decision
        applied = self.ledger.apply(d, self.now)
        if applied.closed and self.model is not None:
            grads = self.model.weighted_mean(self._pending_grads)  # batch-size-weighted mean (LB-BSP eq. 8)
            self._pending_grads = []
            self._train(grads, lr)
        if self.model is not None and applied.undone is not None:
            self.model.params = [p.copy() for p in self._kept]
            self._evaluate()   # (the curve shows the weights put back; the next point follows as before)
        if self.model is not None and d.keep_weights:
            self._kept = [p.copy() for p in self.model.params]
        for g, _ in zip(d.grants, applied.seqs):
            self._queues[g.worker].append(_Step(g, self.ledger.round))
        for g in d.grants:
            if self._running[g.worker] is None and self._queues[g.worker]:
                self._start_step(g.worker)
        if d.wake_at is not None:
            self._schedule(max(d.wake_at, self.now), _TIMER)
