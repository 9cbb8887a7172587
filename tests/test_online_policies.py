"""Sync-Switch's online straggler policies (Sync-Switch §IV-B2) and the timing plan, on the
simulator with an injected transient straggler."""

from types import SimpleNamespace

import pytest

from tfsync.policy import BSP, PushMode
from tfsync.sim.simulator import Simulator
from tfsync.sim.speeds import SpeedModel
from tfsync.switch.online import ElasticStragglerPolicy, GreedyStragglerPolicy
from tfsync.switch.plan import SwitchPlan
from tfsync.switch.slowdown import Slowdown, TransientSlowdown
from tfsync.switch.stragglers import StragglerDetector

pytestmark = pytest.mark.unit

N, WINDOW, K = 6, 1.0, 3
T0, T1, SLOW = 5.0, 15.0, 4.0  # worker 2 is 4x slower for steps starting in [5, 15)
SAMPLES = 150_000  # about 40 simulated seconds of BSP on 6 workers


def straggler_speeds(seed=1):
    return TransientSlowdown(fixed=0.05, per_sample=0.0, jitter=0.05, seed=seed,
                             slowdowns=(Slowdown(worker=2, start=T0, end=T1, factor=SLOW),))


def detector():
    return StragglerDetector(WINDOW, K)


def run(policy, speeds, samples=SAMPLES):
    sim = Simulator(N, speeds)
    result = sim.run(policy, samples=samples)
    # No lost push: every grant still standing after the run was pushed.
    assert sim.granted == sim.clocks and result.pushes == sum(sim.clocks)
    return sim, result


def test_greedy_runs_asp_through_the_straggler_and_returns_to_bsp():
    policy = GreedyStragglerPolicy(detector())
    sim, result = run(policy, straggler_speeds())
    states = [s for _, s in policy.timeline]
    assert states == ["bsp", "asp", "drain", "bsp"]
    (_, _), (t_asp, _), (t_drain, _), (t_bsp, _) = policy.timeline
    assert T0 < t_asp <= T0 + (K + 1) * WINDOW
    assert T1 < t_drain <= T1 + (K + 2) * WINDOW
    asp = [p for p in result.log if p.mode is PushMode.APPLY]
    assert asp and all(t_asp <= p.arrival <= t_bsp for p in asp)
    # ASP -> BSP waited for every ASP step: no BSP step was granted before the last ASP push.
    later_bsp = [p for p in result.log if p.mode is PushMode.AGGREGATE and p.granted_at > t_asp]
    assert later_bsp and min(p.granted_at for p in later_bsp) >= max(p.arrival for p in asp)
    # BSP -> ASP applied the open round (barrier) and only steps still running were dropped.
    assert result.dropped <= N - 1
    rounds_before = {p.round for p in result.log if p.mode is PushMode.AGGREGATE and not p.dropped
                     and p.arrival <= t_asp}
    first_asp = [p for p in asp if p.start == t_asp]
    assert first_asp and all(p.version == len(rounds_before) for p in first_asp)  # saw the last round
    assert result.samples == sum(p.batch_size for p in result.log if not p.dropped)


def test_elastic_removes_exactly_the_straggler_and_readmits_it():
    policy = ElasticStragglerPolicy(detector(), readmit_after_s=12.0)
    sim, result = run(policy, straggler_speeds())
    (t_rm, what_rm, w_rm), (t_back, what_back, w_back) = policy.membership
    assert (what_rm, w_rm, what_back, w_back) == ("remove", 2, "restore", 2)
    assert T0 < t_rm <= T0 + (K + 1) * WINDOW
    assert t_rm + 12.0 <= t_back <= t_rm + 12.0 + 1.0
    assert sim.members == frozenset(range(N))
    between = [p for p in result.log if t_rm < p.start < t_back]
    assert between and all(p.worker != 2 for p in between)  # no step granted to it meanwhile
    assert all(p.mode is PushMode.AGGREGATE for p in result.log)  # still BSP throughout


def test_elastic_restores_the_straggler_at_the_switch_point():
    budget = 30_000  # reached while worker 2 is still slow and removed
    policy = ElasticStragglerPolicy(detector(), bsp_samples=budget, readmit_after_s=None)
    sim, result = run(policy, straggler_speeds())
    assert [what for _, what, _ in policy.membership] == ["remove", "restore"]
    t_switch = policy.timeline[-1][0]
    assert policy.timeline[-1][1] == "final" and policy.membership[-1][0] == t_switch
    assert policy.bsp_done >= budget and t_switch < T1
    assert sim.members == frozenset(range(N))
    assert any(p.worker == 2 and p.mode is PushMode.APPLY for p in result.log)


def test_both_policies_beat_bsp_with_the_straggler():
    _, bsp = run(BSP(), straggler_speeds())
    for policy in (GreedyStragglerPolicy(detector()), ElasticStragglerPolicy(detector(), readmit_after_s=12.0)):
        _, res = run(policy, straggler_speeds())
        assert res.time / res.samples < 0.95 * bsp.time / bsp.samples, policy.name


@pytest.mark.parametrize("make", [GreedyStragglerPolicy, ElasticStragglerPolicy])
def test_without_a_straggler_the_schedule_is_exactly_bsps(make):
    speeds = lambda: SpeedModel(fixed=0.05, per_sample=0.0, jitter=0.1, seed=4)  # noqa: E731
    _, bsp = run(BSP(), speeds(), samples=80_000)
    policy = make(detector())
    _, res = run(policy, speeds(), samples=80_000)
    schedule = lambda r: [(p.worker, p.step, p.start, p.end, p.round, p.mode) for p in r.log]  # noqa: E731
    assert schedule(res) == schedule(bsp)
    assert policy.switches == 0 and not policy.detector.events


def test_planned_switch_happens_at_a_round_boundary():
    budget = 20_000
    policy = GreedyStragglerPolicy(detector(), bsp_samples=budget, lr_scales={"bsp": N, "asp": 1.0})
    sim, result = run(policy, SpeedModel(fixed=0.05, per_sample=0.0, seed=5), samples=60_000)
    assert [s for _, s in policy.timeline] == ["bsp", "final"]
    assert result.dropped == 0 and budget <= policy.bsp_done < budget + N * 32
    assert sim.lr_scale == 1.0
    t_switch = policy.timeline[-1][0]
    assert all(p.mode is PushMode.APPLY for p in result.log if p.granted_at >= t_switch)


def test_switch_plan():
    plan = SwitchPlan()
    assert plan.phases == (("bsp", 0.5), ("asp", 1.0))
    assert [plan.protocol_at(x, 100) for x in (0, 49.9, 50, 99, 100)] == ["bsp", "bsp", "asp", "asp", "asp"]
    assert plan.boundaries(1000) == [("bsp", 500), ("asp", 1000)]
    assert SwitchPlan.bsp_then_asp(0.125).fraction_of("bsp") == 0.125
    assert SwitchPlan.bsp_then_asp(0.0).phases == (("asp", 1.0),)
    assert [(p.name, p.until) for p in plan.to_phases()] == [("bsp", 0.5), ("asp", 1.0)]
    with pytest.raises(ValueError, match="increasing"):
        SwitchPlan((("bsp", 0.6), ("asp", 0.5)))
    with pytest.raises(ValueError, match="last phase"):
        SwitchPlan((("bsp", 0.5),))


def test_greedy_goes_final_when_the_switch_point_passes_during_a_straggler():
    """The switch point is a position in the workload: ASP steps taken while a straggler
    is present count toward it, and once it is passed the policy stays with ASP (without
    this a run with a large BSP share ended still in BSP, its ASP phase never run)."""
    budget = 30_000  # passed while worker 2 is still slow
    policy = GreedyStragglerPolicy(detector(), bsp_samples=budget)
    _, result = run(policy, straggler_speeds())
    states = [s for _, s in policy.timeline]
    assert states[-1] == "final" and "asp" in states and "bsp" not in states[states.index("asp"):]
    t_final = policy.timeline[-1][0]
    assert all(p.mode is PushMode.APPLY for p in result.log if p.granted_at >= t_final)


def test_the_round_before_a_switch_to_asp_is_applied_at_bsps_rate():
    """Going to ASP, a straggler policy's decision carries the last BSP round's barrier and
    ASP's rate factor together: the engine applies the round at BSP's factor (n: the rate
    its pushes recorded), then sets ASP's, then releases the ASP grants."""
    from tfsync.engine.loop import Loop
    from tfsync.policy.base import Decision, Grant
    from tfsync.policy.ledger import Ledger

    scale, calls = [3.0], []

    class Gen:
        def set_hyper(self, lr_scale=None, momentum=None):
            scale[0] = lr_scale

    class Channel:
        def barrier(self, k, rows):
            calls.append(("barrier", k, len(rows), scale[0]))

        def release(self, rows):
            calls.append(("release", len(rows), scale[0]))

        def call(self, fn):
            fn()

    from tfsync.engine.pilot import Pilot

    loop = object.__new__(Loop)
    loop.runlog, loop.wake_at, loop.draining = SimpleNamespace(ledger=Ledger(3)), None, False
    loop.lifecycle = SimpleNamespace(current=Gen(), channel=Channel())
    loop.pilot, loop.phase_end, loop.checkpoint_every = Pilot(loop.ledger, loop.lifecycle, enabled=False), None, 0
    loop.ledger.lr_scale, loop.ledger.pending_workers = 3.0, [0, 1, 2]
    loop.apply(Decision(tuple(Grant(w, 16) for w in range(3)), barrier=True, lr_scale=1.0))
    assert calls == [("barrier", 3, 0, 3.0), ("release", 3, 1.0)]
    assert loop.ledger.updates == 1 and loop.ledger.round == 1 and loop.ledger.granted == [1, 1, 1]
    calls.clear()
    loop.apply(Decision((Grant(0, 16),), lr_scale=3.0))  # no round pending: the new factor, then the grant
    assert calls == [("release", 1, 3.0)]


@pytest.mark.parametrize("make", [GreedyStragglerPolicy, ElasticStragglerPolicy])
def test_the_ps_may_run_the_rounds_only_while_no_straggler_is_seen(make):
    """``steady_round`` (the engine's PS-run rounds, tfsync.engine.pilot): BSP's round of
    every worker while the policy runs BSP, sees no straggler and is before its switch
    point; None from a detection (elastic: while a worker is out) and at the switch point.
    A start away from BSP comes with ASP's rate factor (after PS-run rounds halted there)."""
    from tfsync.policy.base import ClusterView

    view = lambda samples=0: ClusterView(3, (0, 0, 0), (0, 0, 0), samples=samples)  # noqa: E731
    policy = make(detector(), bsp_samples=1000, lr_scales={"bsp": 3.0, "asp": 1.0})
    steady = policy.steady_round(view())
    assert steady is not None and steady.barrier and sorted(g.worker for g in steady.grants) == [0, 1, 2]
    assert policy.steady_round(view(samples=1000)) is None   # the switch point: its decision halts the rounds
    policy.detector._stragglers.add(2)   # (as a detection leaves it)
    assert policy.steady_round(view()) is None
    policy.detector._stragglers.clear()
    if make is ElasticStragglerPolicy:
        policy.removed[2] = 0.0
        assert policy.steady_round(view()) is None
        policy.removed.clear()
    assert policy.steady_round(view()) is not None
    policy.state = "asp"
    assert policy.steady_round(view()) is None and policy.start(view()).lr_scale == 1.0


def test_elastic_removes_a_straggler_once_while_the_membership_lags():
    """A removal waits for the PS's round in flight (tfsync.engine.pilot): until it is
    carried out the view still lists the worker as a member; the policy removes it once
    (one record, its first time kept for the readmission), not at every push."""
    from tfsync.policy.base import ClusterView

    policy = ElasticStragglerPolicy(detector())
    policy.detector._stragglers.add(2)   # (as a detection leaves it)
    first = policy._changes(ClusterView(3, (5, 5, 4), (5, 5, 5), now=10.0))
    again = policy._changes(ClusterView(3, (6, 6, 4), (6, 6, 5), now=10.2))
    assert first == (frozenset({2}), frozenset()) and again == (frozenset(), frozenset())
    assert policy.removed == {2: 10.0} and policy.stats()["removals"] == 1
