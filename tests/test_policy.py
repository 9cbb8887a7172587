"""Policies on invented clusters: pure Python, no TensorFlow (STYLE.md habit 3)."""

import pytest

from tfsync import policy as P
from tfsync.policy.base import ClusterView, Decision, Grant, PolicyError, PushMode, validate_decision
from tfsync.sim import Simulator, SpeedModel
from tfsync.switch.configuration import ConfigPolicy

pytestmark = pytest.mark.unit


def drive(policy, speeds, pushes=200, seed=0):
    """The simulator over per-worker step times (5 % log-normal jitter)."""
    sim = Simulator(len(speeds), SpeedModel(fixed=1.0, per_sample=0.0, factors=speeds, jitter=0.05, seed=seed))
    return sim.run(policy, pushes=pushes)


def finished_before(log, worker, t):
    return sum(1 for p in log if p.worker == worker and p.arrival <= t)


def test_bsp_runs_rounds_in_lock_step_and_aggregates():
    r = drive(P.BSP(), [1.0, 3.0, 1.5], pushes=90)
    for p in r.log:
        assert p.mode is PushMode.AGGREGATE
        assert all(finished_before(r.log, u, p.start) >= p.step - 1 for u in range(3))
    assert r.pushes == 90 and r.updates == 30  # rounds of 3, each applied at its barrier; none past the limit


def test_asp_keeps_every_worker_busy_and_applies_each_push():
    r = drive(P.ASP(), [1.0, 5.0], pushes=120)
    assert r.updates == r.pushes
    trained = r.log[:120]  # (the drain then runs the steps granted ahead: the slow worker's too)
    fast = sum(1 for p in trained if p.worker == 0)
    assert fast > 4 * (len(trained) - fast)  # no waiting for the slow worker


@pytest.mark.parametrize("s", [0, 1, 3])
def test_ssp_bound_holds_and_is_reached(s):
    r = drive(P.SSP(staleness=s), [1.0, 4.0], pushes=150)
    lead = 0
    for p in r.log:
        done_by_slowest = min(finished_before(r.log, u, p.start) for u in (0, 1))
        assert p.step <= done_by_slowest + s + 1
        lead = max(lead, p.step - 1 - done_by_slowest)
    assert lead == s


def test_ssp_grants_by_queue_s_within_the_bound_and_waits_for_no_record_while_a_worker_is_at_it():
    """SSP grants a worker the steps it runs in queue_s, never past the bound (s = 6:
    min clock + 7), and lets the records wait a quarter of the shortest member's room,
    none while a member is at the bound (it waits for the slowest's push)."""
    from tfsync.policy.base import Push
    from tfsync.policy.pacing import MAX_PATIENCE_S

    ssp = P.get("ssp", staleness=6)   # depth 2, queue_s 0.25
    assert ssp.patience(ClusterView(2, (0, 0), (0, 0))) == 0.0   # no step seen
    for i in range(1, 11):   # worker 0's steps 10 ms apart, worker 1's 100 ms
        for w, gap in ((0, 0.01), (1, 0.1)):
            ssp.on_push(Push(w, i, 8, start=gap * i, end=gap * i + 0.001, arrival=gap * i + 0.002, loss=0.0),
                        ClusterView(2, (i, i), (i, i)))
    view = ClusterView(2, (10, 10), (10, 10))
    grants = ssp.start(view).grants
    assert [g.worker for g in grants] == [0] * 7 + [1] * 3   # the bound (not 25 steps in 0.25 s); 0.25 s of 0.1 s
    assert ssp.patience(view) == pytest.approx(7 * 0.01 / 4)
    assert ssp.patience(ClusterView(2, (17, 10), (17, 12))) == 0.0   # worker 0 at the bound
    slow = P.get("ssp", staleness=6)
    for i in range(1, 4):
        slow.on_push(Push(0, i, 8, start=i, end=i + 0.5, arrival=i + 0.6, loss=0.0), ClusterView(1, (i,), (i,)))
    assert slow.patience(ClusterView(1, (3,), (3,))) == MAX_PATIENCE_S
    fixed = P.get("ssp", staleness=6, queue_s=0)   # depth alone
    for i in range(1, 4):
        t = 0.01 * i
        fixed.on_push(Push(0, i, 8, start=t, end=t, arrival=t, loss=0.0), ClusterView(1, (i,), (i,)))
    assert len(fixed.on_push(Push(0, 3, 8, start=0.03, end=0.03, arrival=0.03, loss=0.0),
                             ClusterView(1, (3,), (3,))).grants) == 2
    with pytest.raises(ValueError, match="queue_s"):
        P.get("ssp", queue_s=-1.0)


def test_sizer_is_asked_once_per_decision_and_sizes_reach_grants():
    class Counting(P.BatchSizer):
        calls = 0

        def sizes(self, view):
            Counting.calls += 1
            return {0: 7, 1: 9}

    pol = P.BSP(Counting())
    d = pol.start(ClusterView(2, (0, 0), (0, 0)))
    assert Counting.calls == 1 and [(g.worker, g.batch_size) for g in d.grants] == [(0, 7), (1, 9)]


def test_registry_errors_list_valid_names_and_options():
    with pytest.raises(ValueError, match="valid: asp, auto, bsp, elastic_bsp, fluentps, lbbsp, pssp, rlp, ssp"):
        P.get("zipline")
    with pytest.raises(ValueError, match="takes no option 'stalenes'"):
        P.get("ssp", stalenes=2)
    assert P.get({"name": "ssp", "staleness": 2}).staleness == 2


def test_bad_decisions_are_refused():
    with pytest.raises(PolicyError, match="not a member"):
        validate_decision(Decision((Grant(5, 4),)), frozenset({0, 1}))
    with pytest.raises(PolicyError, match="batch size 0"):
        validate_decision(Decision((Grant(0, 0),)), frozenset({0, 1}))
    with pytest.raises(ValueError):
        P.FixedSizer([4, 0])
    with pytest.raises(ValueError):
        P.SSP(staleness=-1)


def test_configuration_policy_follows_sync_switch():
    c = ConfigPolicy()
    assert c.hyper("bsp", 4, 64, 0.9) == c.hyper("bsp", 4, 64, 0.9, after_switch=True)
    bsp, asp = c.hyper("bsp", 4, 64, 0.9), c.hyper("asp", 4, 64, 0.9, after_switch=True)
    assert (bsp.batch_size, bsp.lr_scale, bsp.momentum) == (64, 4.0, 0.9)
    assert (asp.batch_size, asp.lr_scale, asp.momentum) == (64, 1.0, 0.9)
    assert ConfigPolicy(batch="global").hyper("asp", 4, 64, 0.9).batch_size == 256
    ramp = ConfigPolicy(momentum="ramp_exp")
    assert [ramp.momentum_after(0.9, 4, e) for e in range(4)] == [0.25, 0.5, 0.9, 0.9]
    assert ConfigPolicy(momentum="zero").hyper("asp", 4, 64, 0.9, after_switch=True).momentum == 0.0
    with pytest.raises(ValueError, match="switch.momentum"):
        ConfigPolicy(momentum="nope")


def test_asp_grants_the_steps_a_worker_runs_in_queue_s_and_lets_its_records_wait_a_quarter_of_that():
    """ASP grants each worker the steps it runs in ``queue_s`` (its steps' mean time apart),
    at least ``depth`` and at most MAX_DEPTH, and its records may wait (the engine drains
    them in batches) a quarter of the time the shortest queue lasts, at most
    MAX_PATIENCE_S; a policy that decides at each push waits for none."""
    from tfsync.policy.pacing import MAX_DEPTH, MAX_PATIENCE_S
    from tfsync.policy.base import Push

    def run(asp, gaps):   # two workers: worker w's steps start gaps[w] apart; the grants after the last
        view = ClusterView(2, (0, 0), (0, 0))
        asp.start(view)
        decision = None
        for i in range(20):
            for w in (0, 1):
                t = 1.0 + gaps[w] * i
                decision = asp.on_push(Push(w, i + 1, 8, start=t, end=t + 0.001, arrival=t + 0.002, loss=0.0), view)
        return decision, view

    asp = P.get("asp", depth=8)   # queue_s 0.25
    assert asp.ahead(0) == 8 and asp.patience(ClusterView(2, (0, 0), (0, 0))) == 0.0   # no step seen
    decision, view = run(asp, {0: 0.004, 1: 0.1})
    assert (asp.ahead(0), asp.ahead(1)) == (63, 8)   # 0.25 s of 4 ms steps; 100 ms steps: the floor
    assert [g.worker for g in decision.grants] == [1] * 8   # its queue (nothing outstanding in this view)
    assert asp.patience(view) == pytest.approx(63 * 0.004 / 4)   # the shorter queue's quarter
    fast = P.get("asp", depth=8)
    _, view = run(fast, {0: 0.001, 1: 0.001})
    assert fast.ahead(0) == MAX_DEPTH and fast.patience(view) == pytest.approx(MAX_DEPTH * 0.001 / 4)
    fixed = P.get("asp", depth=8, queue_s=0)   # the depth, whatever the steps
    _, view = run(fixed, {0: 0.004, 1: 0.004})
    assert fixed.ahead(0) == 8 and fixed.patience(view) == pytest.approx(8 * 0.004 / 4)
    slow = P.get("asp", depth=8)
    _, view = run(slow, {0: 0.5, 1: 0.5})
    assert slow.ahead(0) == 8 and slow.patience(view) == MAX_PATIENCE_S
    assert P.get("bsp").patience(view) == 0.0
    with pytest.raises(ValueError, match="queue_s"):
        P.get("asp", queue_s=-1.0)
