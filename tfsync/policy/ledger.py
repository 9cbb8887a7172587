"""The ledger: the server's counts, kept the same way by the engine and the simulator: push counts
and clocks, grants and their times, aggregation rounds, membership, and what applying a
policy's Decision changes in them. Both drivers hold one :class:`Ledger`; what they do
besides (release tokens on a PS, or move simulated time and a NumPy model) stays theirs,
so the two cannot count differently.

The drain rule, decided here once for both: a drain runs every step already granted
(the engine's tokens are on the PS gates already and cannot be taken back), grants
nothing more, then applies what the round aggregated. And the end rule: no asynchronous
step is granted that the workload has no room for (:meth:`Ledger.within`).
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass

from .base import ClusterView, Decision, PolicyError, Push, PushMode, validate_decision


class _MinClock:
    """The smallest clock among members in O(1) amortised per push (clocks only grow)."""

    def __init__(self, clocks, members):
        self.counts = collections.Counter(clocks[w] for w in members)
        self.value = min(self.counts) if self.counts else 0

    def advance(self, old: int) -> None:
        self.counts[old] -= 1
        self.counts[old + 1] += 1
        while not self.counts[self.value]:
            self.value += 1


@dataclass(frozen=True)
class Applied:
    """What a Decision changed: ``closed`` aggregated pushes were applied as one update
    (0: no barrier); ``seqs``: each grant's step number (its worker's grant count);
    ``hyper_changed``: the learning-rate scale or the momentum changed; ``undone``: the
    counters went back to the mark (``Decision.undo``) and the pushes after ``undone``
    (the pushes counted then) are to be set aside (None: nothing undone, an undo asked
    without a mark included)."""

    closed: int = 0
    seqs: tuple[int, ...] = ()
    hyper_changed: bool = False
    undone: int | None = None


class Ledger:
    """``clocks[w]``: steps worker w pushed; ``granted[w]``: steps granted to it. The rest
    as in :class:`ClusterView`, which :meth:`view` builds from them."""

    def __init__(self, num_workers: int, history: int = 256):
        self.num_workers = num_workers
        self.clocks = [0] * num_workers
        self.granted = [0] * num_workers
        self.batch_sizes = [0] * num_workers  # each worker's batch in its latest grant: the one in force
        self.round = self.pushes = self.updates = self.samples = self.dropped = 0
        self.pending_workers: list[int] = []
        self.pending_samples = 0
        self.active = frozenset(range(num_workers))
        self.lr_scale = 1.0
        self.momentum: float | None = None   # in force, where set (None: the optimizer's own)
        self.history: collections.deque[Push] = collections.deque(maxlen=history)
        # each worker's outstanding grants, oldest first (steps run in order): when made, on how many samples
        self._grants = [collections.deque() for _ in range(num_workers)]
        self.in_flight_samples = 0  # the samples of every step granted and not yet pushed
        self._arrivals = [0.0] * num_workers  # each worker's last push: its next step is ready after it
        self._member_in_flight = 0
        self._min = _MinClock(self.clocks, self.active)
        self.mark: tuple[int, int, int] | None = None   # (samples, updates, pushes) where the weights were kept

    # -- what the policy sees --------------------------------------------------------------
    def view(self, now: float, resources=None, end: int | None = None) -> ClusterView:
        """What the policy sees at ``now``; ``end``: the samples the run (or its phase)
        ends at, where known (``ClusterView.remaining``)."""
        return ClusterView(
            num_workers=self.num_workers, clocks=tuple(self.clocks), granted=tuple(self.granted),
            round=self.round, pending_workers=tuple(self.pending_workers), pending_samples=self.pending_samples,
            pushes=self.pushes, updates=self.updates, samples=self.samples, now=now, active=self.active,
            history=self.history, resources=resources if resources is not None else {},
            remaining=None if end is None else max(0, end - self.samples),
        ).known(members=self.active, in_flight=self._member_in_flight, min_clock=self._min.value)

    def in_flight(self) -> int:
        """Steps granted to any worker, member or not, and not yet pushed: what a drain waits for."""
        return sum(g - c for g, c in zip(self.granted, self.clocks))

    # -- a push arrives -----------------------------------------------------------------
    def push(self, worker: int, batch_size: int, mode: PushMode, round: int, version: int, *,
             start: float, end: float, arrival: float, loss: float, turnaround: float | None = None) -> Push:
        """Count worker's finished step; ``version``: updates applied when it read the
        weights. An AGGREGATE push of a round already closed is dropped (counted, not
        aggregated). ``turnaround``: where the server measured it (it released the step
        itself; this ledger's grant time, a mirror, is not when), ``ready_at`` is the
        arrival less it. Returns the Push the policy is shown."""
        w, b = worker, int(batch_size)
        grants = self._grants[w]
        granted_at, granted_b = grants.popleft() if grants else (0.0, 0)
        self.in_flight_samples -= granted_b
        ready_at = max(granted_at, self._arrivals[w]) if granted_at else 0.0
        if turnaround is not None:
            ready_at = arrival - max(turnaround, 0.0)
        self._arrivals[w] = arrival
        if w in self.active:  # the trackers count members only
            self._min.advance(self.clocks[w])
            self._member_in_flight -= 1
        self.clocks[w] += 1
        self.pushes += 1
        dropped = mode is PushMode.AGGREGATE and round < self.round
        during = max(0, self.updates - version) if mode is PushMode.APPLY else 0  # RLP §3.2 l_n
        if dropped:
            self.dropped += 1
        else:
            self.samples += b
            if mode is PushMode.AGGREGATE:
                self.pending_workers.append(w)
                self.pending_samples += b
            else:
                self.updates += 1
        push = Push(worker=w, step=self.clocks[w], batch_size=b, start=start, end=end, arrival=arrival,
                    loss=loss, mode=mode, round=round, dropped=dropped, version=version,
                    pushes_during=during, granted_at=granted_at, ready_at=ready_at)
        self.history.append(push)
        return push

    # -- a decision is carried out ----------------------------------------------------------
    def apply(self, decision: Decision, now: float) -> Applied:
        """Membership, then the barrier (the round's aggregate becomes one update and the
        next round opens, so grants made here belong to it), then the grants."""
        d = decision
        if d.remove or d.restore:
            self.active = (self.active - d.remove) | d.restore
            self._member_in_flight = sum(self.granted[w] - self.clocks[w] for w in self.active)
            self._min = _MinClock(self.clocks, self.active)
        validate_decision(d, self.active)
        changed = (d.lr_scale is not None and d.lr_scale != self.lr_scale) or (
            d.momentum is not None and d.momentum != self.momentum)
        if d.lr_scale is not None:
            self.lr_scale = d.lr_scale
        if d.momentum is not None:
            self.momentum = d.momentum
        closed = 0
        if d.barrier and self.pending_workers:
            closed = len(self.pending_workers)
            self.round += 1
            self.updates += 1
            self.pending_workers, self.pending_samples = [], 0
        undone = None
        if d.undo and self.mark is not None:
            if self.in_flight() or self.pending_workers:
                raise PolicyError("a policy asked to undo with steps in flight or a round open: drain first")
            undone = self.mark[2]
            self.rewind(*self.mark)
        if d.keep_weights:
            self.mark = (self.samples, self.updates, self.pushes)
        seqs = []
        for g in d.grants:
            self.granted[g.worker] += 1
            self.batch_sizes[g.worker] = int(g.batch_size)
            seqs.append(self.granted[g.worker])
            self._grants[g.worker].append((now, int(g.batch_size)))
            self.in_flight_samples += int(g.batch_size)
            if g.worker in self.active:
                self._member_in_flight += 1
        return Applied(closed, tuple(seqs), changed, undone)

    def within(self, decision: Decision, end_samples: int) -> Decision:
        """``decision`` less the APPLY grants a workload ending at ``end_samples`` has no
        room for: each is kept while the samples counted and in flight fall short of the
        end, taken in turns over the workers (every worker's first grant, then every
        second), so a phase ends less than one batch past its end whatever ``depth`` a
        policy grants ahead. AGGREGATE grants (a round's) are all kept, and counted first:
        a round without some of its workers would not be the round the protocol defines."""
        return self._cut(decision, end_samples - self.samples - self.in_flight_samples, lambda g: g.batch_size)

    def within_updates(self, decision: Decision, updates: int) -> Decision:
        """``decision`` less the APPLY grants past the next ``updates`` updates (each APPLY
        step is one; the steps in flight count first), as :meth:`within` cuts them: a
        checkpoint due then (the engine's ``checkpoint_every``) waits for no step granted
        past it."""
        return self._cut(decision, updates - self.in_flight(), lambda g: 1)

    def _cut(self, decision: Decision, room: float, cost) -> Decision:
        """The APPLY grants of ``decision`` that fit in ``room``, each costing ``cost(g)``,
        in turns over the workers, after every AGGREGATE grant."""
        room -= sum(cost(g) for g in decision.grants if g.mode is not PushMode.APPLY)
        apply = [i for i, g in enumerate(decision.grants) if g.mode is PushMode.APPLY]
        if not apply or sum(cost(decision.grants[i]) for i in apply) <= room:
            return decision   # (apply validates it)
        validate_decision(decision, (self.active - decision.remove) | decision.restore)   # before any is cut
        turn, seen = {}, collections.Counter()
        for i in apply:
            turn[i] = seen[decision.grants[i].worker]
            seen[decision.grants[i].worker] += 1
        keep = set()
        for i in sorted(apply, key=lambda i: (turn[i], i)):
            if room <= 0:
                break
            keep.add(i)
            room -= cost(decision.grants[i])
        grants = [g for i, g in enumerate(decision.grants) if g.mode is not PushMode.APPLY or i in keep]
        return dataclasses.replace(decision, grants=tuple(grants))

    # -- the engine's restarts and rewinds ----------------------------------------------------
    def forget_grants(self) -> None:
        """The grants still outstanding went with the tasks that held them (a new cluster
        generation): nothing is granted in the new one yet."""
        self.granted = list(self.clocks)
        for grants in self._grants:
            grants.clear()
        self._member_in_flight = self.in_flight_samples = 0
        self.mark = None   # (its copy of the weights went with the old generation)

    def resize(self, workers: int) -> None:
        """The job now has ``workers`` workers (0..workers-1), between generations, with
        nothing in flight and no round open: the kept workers keep their clocks; a new one
        starts level with the slowest member (a clock of 0 would hold SSP's fast workers
        back until it caught up); every worker is a member; the recent pushes of removed
        workers leave the history. Counters are the job's and stay."""
        if self.in_flight() or self.pending_workers:
            raise ValueError("resize needs a drained ledger: steps are in flight or a round is open")
        start = self._min.value if self.active else 0
        keep = min(workers, self.num_workers)
        self.clocks = self.clocks[:keep] + [start] * (workers - keep)
        self.batch_sizes = self.batch_sizes[:keep] + [0] * (workers - keep)
        self._arrivals = self._arrivals[:keep] + [0.0] * (workers - keep)
        self._grants = [collections.deque() for _ in range(workers)]
        self.history = collections.deque((p for p in self.history if p.worker < workers), maxlen=self.history.maxlen)
        self.num_workers = workers
        self.active = frozenset(range(workers))
        self._min = _MinClock(self.clocks, self.active)
        self.forget_grants()

    def rewind(self, samples: int, updates: int, pushes: int) -> None:
        """Back to a checkpoint's (or the mark's) counters: what came after it is trained
        again; a mark later than them goes."""
        self.samples, self.updates, self.pushes = int(samples), int(updates), int(pushes)
        self.pending_workers, self.pending_samples = [], 0
        if self.mark is not None and self.mark[2] > self.pushes:
            self.mark = None

    # -- saved beside a checkpoint --------------------------------------------------------------
    def save_state(self) -> dict:
        return {"clocks": list(self.clocks), "round": self.round, "pushes": self.pushes,
                "updates": self.updates, "samples": self.samples, "dropped": self.dropped,
                "active": sorted(self.active), "lr_scale": self.lr_scale, "momentum": self.momentum}

    def restore_state(self, state: dict) -> None:
        """The counters of a saved ledger (same number of workers), with nothing granted."""
        if len(state["clocks"]) != self.num_workers:
            raise ValueError(f"the saved ledger has {len(state['clocks'])} workers, this run {self.num_workers}")
        self.clocks = [int(c) for c in state["clocks"]]
        for key in ("round", "pushes", "updates", "samples", "dropped"):
            setattr(self, key, int(state[key]))
        self.active = frozenset(int(w) for w in state["active"])
        self.lr_scale = float(state["lr_scale"])
        momentum = state.get("momentum")   # (none saved before 2026-11-29)
        self.momentum = None if momentum is None else float(momentum)
        self.pending_workers, self.pending_samples = [], 0
        self._min = _MinClock(self.clocks, self.active)
        self.forget_grants()
