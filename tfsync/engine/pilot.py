"""Steady BSP rounds the PS closes and opens by itself: the coordinator off their
critical path.

A BSP round driven by the coordinator waits for it twice: the last push's record has to
reach the coordinator (a drain call), and the barrier and the next round's tokens have
to come back (a barrier call); at 10 ms a node that is most of a round. Yet a policy
whose decision at the end of every round is the same (BSP with fixed batch sizes:
``Policy.steady_round``) needs no decision at all. So the engine grants such a round as
usual but with ROUND tokens, and asks the PS once to run the following rounds itself
(``PSControl.rounds``, in the spirit of SyncReplicasOptimizer's chief queue runner, here
on the PS): each round's rows are taken on the PS, the weighted mean applied and the next
round released there, then the rows and a marker row go to the coordinator, which counts
every push as before and mirrors each marker in its ledger (the barrier and the grants
the PS made). Its loop observes; it never gates a step.

The policy still sees every push and makes its decisions, which at a round's end can
only be the steady round again. Where its batch sizes changed (LB-BSP's, sized from the
workers' predicted speeds), the engine sets them on the PS (``PSControl.set_sizes``) and
the PS grants them from the next round it opens: a round or more later than the
coordinator would have, since the PS opened the following round before the coordinator
saw this one's pushes (LB-BSP's sizes then come from predictions a round older, as in its
non-blocking mode, LB-BSP §4). Each marker says which sizes the round it opened had.

Anything that needs the coordinator halts the pilot (:meth:`Pilot.halt`): a drain (a
switch, a checkpoint, a stop, a rejoin, the end of the phase), a command, or a decision
the steady round does not make (a straggler policy that detects a straggler or reaches
its switch point: its ``steady_round`` holds only while it sees none). The PS finishes
the round in flight and releases nothing more; the marker saying so ends the pilot, and
outside a drain the halting decision is carried out then, or else the policy grants
again (either may start a new pilot). So a straggler policy's reaction comes a round
later than on the coordinator's rounds: the round in flight, the straggler's step in it,
closes first. The
number of rounds asked for ends exactly at the phase's workload, or at the update a
periodic checkpoint is due (``checkpoint_every``), which the engine then takes, as the
coordinator's own loop would. A lost worker leaves the round in flight unfinished: what the PS applied
is what the coordinator counted (rows reach it only after their round was applied).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from typing import Callable

import numpy as np
import tensorflow as tf

from ..policy.base import NOTHING, Decision
from .control import BATCH, MARKER_SIZES, MODE, MODE_ROUND, ROUND, ROW_END, ROW_LANDED, ROW_START, SEQ, token_rows

logger = logging.getLogger(__name__)

ROUND_CLOSED = object()   # what the engine's wait returns after a marker row


def _same(grants) -> set:
    """What a steady round keeps from round to round: its members and their modes."""
    return {(g.worker, g.mode) for g in grants}


def is_marker(row) -> bool:
    return row[0] < 0


def _total(grants) -> int:
    return sum(g.batch_size for g in grants)


@dataclasses.dataclass(frozen=True)
class RoundsEnded:
    """The PS ran its last round: the loop carries out ``deferred`` (the decision that
    halted the rounds, if one did: its barrier is the round the PS closed, its grants only
    where training goes on) and, where training goes on with nothing in flight, has the
    policy grant again."""

    deferred: Decision | None


class Pilot:
    """The engine's PS-run rounds: at most one ``rounds`` call at a time. The engine's loop
    (tfsync.engine.loop) asks it what a decision's tokens are (``rows``), tells it each
    decision while it runs (``follow``) and each marker row (``observe``, which says when
    the rounds ended and what the loop is to carry out then)."""

    def __init__(self, ledger, lifecycle, enabled: bool = True):
        """``ledger``: the run's counts, in which it mirrors the rounds the PS ran;
        ``lifecycle``: the generation it calls and the channel it calls through."""
        self.ledger, self.lifecycle, self.enabled = ledger, lifecycle, enabled
        self.active = False      # a rounds call runs, or its last marker is still to come
        self.epoch = 0           # the current (or last) call's number, for halt
        self.grants = ()         # the grants the PS makes at each round's end
        self.rounds = 0          # rounds the PS closed, over the run
        self.halting = False
        self.deferred: Decision | None = None   # a decision that halted the rounds, carried out after them
        self.version = 0         # of the sizes last set on the PS (set_sizes); only grows
        self.sized: dict[int, tuple] = {}   # version -> the grants of those sizes
        self.released_at: dict[int, float] = {}   # round -> when the PS released it (its clock)

    def take(self, decision: Decision, room: int | None, updates_left: Callable[[], int | None],
             steady: Callable[[], Decision | None]) -> int:
        """How many rounds the PS should run from this decision on (0: it should not):
        the decision grants a steady round (``steady()``: the policy's), every member one
        step, nothing else pending. ``room``: the samples the phase has still to train
        (None: the loop grants no rounds ahead: it drains, or waits for a timer);
        ``updates_left()``: those before the next periodic checkpoint (None: none due)."""
        s = self.ledger
        if not self.enabled or self.active or room is None or not decision.grants \
                or {g.worker for g in decision.grants} != s.active:   # (ASP's push: no view built)
            return 0
        steady_round = steady()
        if steady_round is None or _same(steady_round.grants) != _same(decision.grants) \
                or s.pending_workers or decision.remove or decision.restore:
            return 0
        k = math.ceil(room / _total(decision.grants))
        left = updates_left()   # (the loop takes it once they stop)
        return max(0, k if left is None else min(k, left))

    def launch(self, k: int, first_rows: np.ndarray, decision: Decision, self_sizing: bool) -> None:
        """Run rounds 2..k of the round just granted (``first_rows``) on the PS; a
        ``self_sizing`` policy's sizes go there first."""
        gen = self.lifecycle.current
        self.epoch += 1
        self.active, self.halting, self.grants = True, False, tuple(decision.grants)
        self.deferred = None
        self.sized = {self.version: self.grants}   # (sizes the PS holds from an earlier call are older)
        self.released_at = {}
        if self_sizing:   # (traced now, not when a round's end needs it: the PS goes on)
            self._set_sizes(gen)
        following = first_rows.copy()
        following[:, 1 + ROUND] += 1
        following[:, 1 + SEQ] += 1
        threading.Thread(target=self._run, args=(gen, k, self.epoch, following, self.version), daemon=True,
                         name=f"tfsync-rounds-{self.epoch}").start()

    def _run(self, gen, k, epoch, tokens, version) -> None:
        try:
            gen.links.rounds(k, epoch, tokens, version)
        except Exception as e:   # the PS died, or the generation closed
            if gen is self.lifecycle.current:
                self.lifecycle.results.put((gen, None, e))

    def halt(self) -> None:
        """The PS releases no round after the one in flight (asked in order with the
        engine's other PS calls)."""
        if self.active and not self.halting:
            self.halting = True
            gen, epoch = self.lifecycle.current, self.epoch
            self.lifecycle.channel.call(lambda: gen.control.halt(epoch))

    def follow(self, decision: Decision, name: str, steady: Callable[[], Decision | None]) -> None:
        """The policy's decision after a push while the PS runs the rounds: nothing within
        a round; at its end, the steady round again, whose new batch sizes go to the PS.
        New sizes of another total halt the rounds (their number was counted from the
        total): the policy grants again after the round in flight, as after a command.
        A decision that changes more (members, modes, the rate: a straggler policy's
        detection or planned switch) halts them too, and is carried out once the round in
        flight has closed (``observe``); said with a warning where the policy's
        ``steady_round`` (``steady()``) still promises no change; ``name``: the policy's."""
        if decision == NOTHING or self.halting:
            return
        if decision != Decision(decision.grants, barrier=True) or _same(decision.grants) != _same(self.grants):
            if steady() is not None:
                logger.warning("%s changed its steady round (%s): the PS's rounds stop after the one in flight",
                               name, decision)
            self.deferred = decision
            self.halt()
            return
        if _total(decision.grants) != _total(self.grants):
            self.halt()
            return
        latest = self.sized[self.version]
        if {(g.worker, g.batch_size) for g in decision.grants} == {(g.worker, g.batch_size) for g in latest}:
            return
        self.version += 1
        self.sized[self.version] = tuple(decision.grants)
        self._set_sizes(self.lifecycle.current)

    def _set_sizes(self, gen) -> None:
        """The sizes of the latest version to the PS, in order with the engine's other calls."""
        sizes = np.zeros(self.lifecycle.workers + 1, np.int64)
        sizes[0] = self.version
        for g in self.sized[self.version]:
            sizes[1 + g.worker] = g.batch_size
        self.lifecycle.channel.call(lambda: gen.control.set_sizes(tf.constant(sizes)))

    def observe(self, marker) -> RoundsEnded | None:
        """A marker row: mirror what the PS did at a round's end in the ledger. Returns None
        while the rounds go on; after the last, what the loop carries out then."""
        released = bool(marker[1 + SEQ])
        version = int(marker[MARKER_SIZES])
        if released and version not in self.sized:
            logger.warning("the PS opened a round at sizes %d, which were not set: the ledger counts %s",
                           version, self.sized[self.version])
        grants = self.sized.get(version, self.sized[self.version]) if released else ()
        applied = self.ledger.apply(Decision(grants, barrier=True), time.time())
        closed = int(marker[1 + ROUND])
        self.released_at = {r: t for r, t in self.released_at.items() if r > closed}
        if released:
            self.released_at[closed + 1] = float(marker[ROW_END])
        self.rounds += 1
        if applied.closed != int(marker[1 + BATCH]):
            logger.warning("the PS closed a round of %d pushes, the ledger %d", int(marker[1 + BATCH]), applied.closed)
        if released:
            return None
        self.active = False
        deferred, self.deferred = self.deferred, None
        return RoundsEnded(deferred)

    def turnaround(self, row) -> float | None:
        """A push of a round the PS released: from that release to the push's landing,
        both on the PS's clock (the ledger's mirrored grant is made when the coordinator
        sees the marker, after the round began: LB-BSP's speeds need the PS's times); of
        the round the engine granted before the PS took over, the worker's own step (the
        coordinator sees that round's pushes together too); None for any other push."""
        if int(row[1 + MODE]) != MODE_ROUND:
            return None
        released = self.released_at.get(int(row[1 + ROUND]))
        if released is None:
            return float(row[ROW_END] - row[ROW_START])
        return float(row[ROW_LANDED]) - released

    def abandon(self) -> None:
        """The generation is going (a lost worker or PS): a round the PS applied but whose
        marker was not seen yet is closed in the ledger too; nothing more is expected (a
        halting decision not yet carried out goes with it: the recovery's policy start
        decides again)."""
        if self.active and self.ledger.pending_workers:
            self.ledger.apply(Decision(barrier=True), time.time())
        self.active, self.deferred = False, None

    def rows(self, decision: Decision, seqs, room: int | None, updates_left: Callable[[], int | None],
             steady: Callable[[], Decision | None]) -> tuple[np.ndarray, int]:
        """The token rows for ``decision``'s grants, and the rounds the PS runs from them
        (``take``)."""
        k = self.take(decision, room, updates_left, steady)
        return token_rows(decision.grants, self.ledger.round, seqs, MODE_ROUND if k > 1 else None), \
            (k if k > 1 else 0)
