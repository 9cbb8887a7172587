"""The ledger the engine and the simulator share (tfsync.policy.ledger): unit rules, and
the two drivers against each other on one schedule (a real engine's pushes replayed in
the simulator must be counted the same, push by push)."""

import json

import pytest

from tfsync.policy import BSP, SSP, Decision, FixedSizer, Grant, PushMode
from tfsync.policy.ledger import Ledger
from tfsync.sim.simulator import Simulator
from tfsync.sim.speeds import SpeedModel

AGG, APPLY = PushMode.AGGREGATE, PushMode.APPLY


def _push(ledger, w, mode=AGG, round=0, version=0, t=1.0):
    return ledger.push(w, 8, mode, round, version, start=0.0, end=t, arrival=t, loss=0.5)


@pytest.mark.unit
def test_a_barrier_closes_the_round_and_its_grants_open_the_next():
    ledger = Ledger(2)
    ledger.apply(Decision((Grant(0, 8, AGG), Grant(1, 8, AGG))), now=0.0)
    _push(ledger, 0), _push(ledger, 1)
    assert ledger.pending_workers == [0, 1] and ledger.pending_samples == 16 and ledger.updates == 0
    applied = ledger.apply(Decision((Grant(0, 8, AGG),), barrier=True), now=2.0)
    assert applied.closed == 2 and applied.seqs == (2,)
    assert (ledger.round, ledger.updates, ledger.pending_workers) == (1, 1, [])
    late = _push(ledger, 0, round=0, t=3.0)  # a push of the closed round is counted, not aggregated
    assert late.dropped and ledger.dropped == 1 and ledger.samples == 16 and ledger.pushes == 3


@pytest.mark.unit
def test_an_undo_takes_the_counters_back_to_the_mark_once_nothing_is_in_flight():
    """The mark is made after the round a decision closes; an undo with steps in flight is
    refused, one without a mark undoes nothing (the engine says so), and a new generation (its
    copy of the weights gone) drops the mark."""
    from tfsync.policy import PolicyError

    ledger = Ledger(2)
    ledger.apply(Decision((Grant(0, 8, AGG), Grant(1, 8, AGG))), now=0.0)
    _push(ledger, 0), _push(ledger, 1)
    kept = ledger.apply(Decision((Grant(0, 8, APPLY), Grant(1, 8, APPLY)), barrier=True, keep_weights=True), now=1.0)
    assert kept.closed == 2 and ledger.mark == (16, 1, 2)
    _push(ledger, 0, APPLY, version=1)
    with pytest.raises(PolicyError, match="in flight"):
        ledger.apply(Decision(undo=True), now=2.0)
    _push(ledger, 1, APPLY, version=1)
    assert (ledger.samples, ledger.updates, ledger.pushes) == (32, 3, 4)
    undone = ledger.apply(Decision((Grant(0, 8, AGG),), undo=True), now=3.0)
    assert undone.undone == 2 and undone.seqs == (3,)
    assert (ledger.samples, ledger.updates, ledger.pushes) == (16, 1, 2) and ledger.clocks == [2, 2]
    ledger.forget_grants()
    assert ledger.mark is None
    refused = ledger.apply(Decision(undo=True), now=4.0)
    assert refused.undone is None and ledger.samples == 16


@pytest.mark.unit
def test_a_push_knows_when_its_step_could_start_and_how_stale_it_is():
    ledger = Ledger(2)
    ledger.apply(Decision((Grant(0, 8, APPLY), Grant(0, 8, APPLY), Grant(1, 8, APPLY))), now=10.0)
    first = _push(ledger, 1, APPLY, version=0, t=11.0)
    second = _push(ledger, 0, APPLY, version=0, t=12.0)
    third = _push(ledger, 0, APPLY, version=2, t=14.0)
    assert (first.pushes_during, second.pushes_during, third.pushes_during) == (0, 1, 0)
    assert second.ready_at == 10.0 and third.ready_at == 12.0  # granted at 10, but worker 0 was busy until 12
    assert third.turnaround == 2.0 and ledger.updates == 3


@pytest.mark.unit
def test_removed_workers_are_drained_but_the_view_counts_members_only():
    ledger = Ledger(3)
    ledger.apply(Decision(tuple(Grant(w, 8, APPLY) for w in range(3))), now=0.0)
    ledger.apply(Decision(remove={2}), now=0.0)
    view = ledger.view(1.0)
    assert view.in_flight == 2 and ledger.in_flight() == 3 and view.members == {0, 1}
    _push(ledger, 0, APPLY), _push(ledger, 2, APPLY)
    assert ledger.view(2.0).in_flight == 1 and ledger.view(2.0).min_clock == 0 and ledger.in_flight() == 1


@pytest.mark.unit
def test_grants_ahead_stop_where_the_phase_has_no_more_work_taken_in_turns_over_the_workers():
    ledger = Ledger(3)
    ledger.samples = 100
    ahead = Decision(tuple(Grant(w, 8, APPLY) for w in range(3) for _ in range(8)))  # ASP at depth 8
    assert ledger.within(ahead, end_samples=100 + 24 * 8) is ahead   # room for all of them
    kept = ledger.within(ahead, end_samples=140)  # 40 samples of work: the first five in turns
    assert [g.worker for g in kept.grants] == [0, 0, 1, 1, 2]
    ledger.apply(kept, now=0.0)
    assert ledger.in_flight_samples == 40 and ledger.within(ahead, end_samples=140).grants == ()
    _push(ledger, 1, APPLY)   # a push moves its samples from in flight to counted: still no room
    assert ledger.in_flight_samples == 32 and ledger.within(ahead, end_samples=140).grants == ()
    assert [g.worker for g in ledger.within(ahead, end_samples=141).grants] == [0]  # a step past the end
    rounds = Decision(tuple(Grant(w, 8, AGG) for w in range(3)))  # a round's grants are never cut
    assert ledger.within(rounds, end_samples=0) is rounds
    ledger.forget_grants()
    assert ledger.in_flight_samples == 0


@pytest.mark.unit
def test_grants_ahead_stop_at_the_next_checkpoints_update_taken_in_turns_over_the_workers():
    """``within_updates``: no APPLY step granted past the update a checkpoint is due at
    (each is one update; those in flight count first); a round's grants are all kept."""
    ledger = Ledger(3)
    ahead = Decision(tuple(Grant(w, 8, APPLY) for w in range(3) for _ in range(8)))  # ASP at depth 8
    assert ledger.within_updates(ahead, 24) is ahead
    kept = ledger.within_updates(ahead, 5)   # the first five in turns
    assert [g.worker for g in kept.grants] == [0, 0, 1, 1, 2]
    ledger.apply(kept, now=0.0)
    assert ledger.within_updates(ahead, 5).grants == () and len(ledger.within_updates(ahead, 7).grants) == 2
    _push(ledger, 0, APPLY)   # one of them pushed: one update closer, one fewer in flight
    assert ledger.within_updates(ahead, 4).grants == () and len(ledger.within_updates(ahead, 5).grants) == 1
    rounds = Decision(tuple(Grant(w, 8, AGG) for w in range(3)))
    assert ledger.within_updates(rounds, 0) is rounds


@pytest.mark.unit
def test_the_books_survive_a_json_round_trip_with_nothing_granted():
    ledger = Ledger(2)
    assert ledger.apply(Decision((Grant(0, 8, AGG), Grant(1, 8, AGG)), lr_scale=2.0), now=0.0).hyper_changed
    _push(ledger, 0), _push(ledger, 1)
    assert ledger.apply(Decision((Grant(0, 8, AGG),), barrier=True, momentum=0.25), now=1.0).hyper_changed
    assert not ledger.apply(Decision(momentum=0.25, lr_scale=2.0), now=1.0).hyper_changed
    again = Ledger(2)
    again.restore_state(json.loads(json.dumps(ledger.save_state())))
    assert (again.clocks, again.round, again.updates, again.samples, again.lr_scale) == ([1, 1], 1, 1, 16, 2.0)
    assert again.momentum == 0.25
    assert again.granted == [1, 1] and again.in_flight() == 0
    with pytest.raises(ValueError, match="has 2 workers, this run 3"):
        Ledger(3).restore_state(ledger.save_state())


class _Replay(SpeedModel):
    """Each worker's steps end when the engine's did (seconds after the run's first grant)."""

    def __init__(self, arrivals):
        super().__init__(fixed=1.0, per_sample=0.0)  # unused: step_time is the replay
        self.arrivals = {w: list(ts) for w, ts in arrivals.items()}

    def step_time(self, worker, batch_size, now):
        return max(self.arrivals[worker].pop(0) - now, 0.0)


def _counted(p):
    return (p.worker, p.step, p.batch_size, p.mode, p.round, p.dropped, p.version, p.pushes_during)


def _counted_without_version(p):
    """An APPLY push updates the PS before the coordinator hears of it, so a real step may
    read a version ahead of the coordinator's count; the simulator applies at arrival."""
    return _counted(p)[:6]


@pytest.mark.cluster
@pytest.mark.parametrize("protocol", ["bsp", "ssp"])
def test_the_engine_and_the_simulator_count_one_schedule_the_same(tiny_problem, tmp_path, protocol):
    """3 real workers run BSP (uneven batches) or SSP (staleness 1); the order in which
    their pushes arrived is replayed in the simulator with the same policy: every push is
    counted the same (step, round, dropped; under BSP also the version read and the
    staleness) and so are the totals."""
    from tfsync.engine.generation import TrainSetup
    from tfsync.engine.engine import Engine
    from tfsync.engine.phase import Phase

    def make():
        sizer = FixedSizer([4, 8, 12])
        return BSP(sizer) if protocol == "bsp" else SSP(1, sizer)

    x, y, model_fn, optimizer_fn, loss_fn = tiny_problem
    setup = TrainSetup(model_fn, optimizer_fn, loss_fn, x, y, max_batch_size=16, shuffle=False)
    engine = Engine(setup, workers=3, run_dir=str(tmp_path), tensorboard=False, timeout_s=120)
    summary = engine.run([Phase(make())], total_samples=40 * 24)
    real = list(engine.history)
    assert len(real) == summary["pushes"] < engine.history.maxlen
    t0 = min(p.granted_at for p in real)
    arrivals = {w: [p.arrival - t0 for p in real if p.worker == w] for w in range(3)}
    assert all(len(a) > 5 for a in arrivals.values())

    sim = Simulator(3, _Replay(arrivals))
    result = sim.run(make(), samples=40 * 24)
    counted = _counted if protocol == "bsp" else _counted_without_version
    assert [counted(p) for p in sim.ledger.history] == [counted(p) for p in real]
    for key in ("pushes", "updates", "samples", "dropped"):
        assert getattr(result, key) == summary[key], key
    assert sim.ledger.round == engine.ledger.round and sim.clocks == engine.ledger.clocks


@pytest.mark.unit
@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
def test_a_rate_factor_that_is_not_a_finite_positive_number_is_refused(scale):
    from tfsync.policy import PolicyError

    ledger = Ledger(2)
    with pytest.raises(PolicyError, match="lr_scale"):
        ledger.apply(Decision(lr_scale=scale), now=0.0)
    assert ledger.lr_scale == 1.0
    with pytest.raises(PolicyError, match="momentum"):
        ledger.apply(Decision(momentum=1.0), now=0.0)
