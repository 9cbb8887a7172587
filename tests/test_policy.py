"""Policies on invented clusters: pure Python, no TensorFlow (STYLE.md habit 3)."""

import heapq
import random

import pytest

from tfsync import policy as P
from tfsync.policy.base import ClusterView, Decision, Grant, PolicyError, Push, PushMode, validate_decision
from tfsync.switch.configuration import ConfigPolicy

pytestmark = pytest.mark.unit


def drive(policy, speeds, pushes=200, seed=0):
    """A tiny event loop over per-worker step times: returns (worker, step, start, end)
    for each step, and checks every decision keeps the engine's rules."""
    n = len(speeds)
    rng = random.Random(seed)
    clocks, granted, queued = [0] * n, [0] * n, [[] for _ in range(n)]
    busy_until = [None] * n
    state = {"round": 0, "pending": [], "updates": 0, "samples": 0, "pushes": 0}
    events, log, now = [], [], 0.0

    def view():
        return ClusterView(n, tuple(clocks), tuple(granted), state["round"], tuple(state["pending"]),
                           pushes=state["pushes"], updates=state["updates"], samples=state["samples"], now=now)

    def start_ready(t):
        for w in range(n):
            if busy_until[w] is None and queued[w]:
                g = queued[w].pop(0)
                end = t + speeds[w] * (0.9 + 0.2 * rng.random())
                busy_until[w] = end
                heapq.heappush(events, (end, w, g, t, state["round"]))

    def apply(d):
        validate_decision(d, frozenset(range(n)))
        if d.barrier and state["pending"]:
            state["round"] += 1
            state["updates"] += 1
            state["pending"] = []
        for g in d.grants:
            granted[g.worker] += 1
            queued[g.worker].append(g)

    apply(policy.start(view()))
    start_ready(now)
    while events and state["pushes"] < pushes:
        now, w, g, t0, rnd = heapq.heappop(events)
        busy_until[w] = None
        clocks[w] += 1
        state["pushes"] += 1
        state["samples"] += g.batch_size
        if g.mode is PushMode.AGGREGATE:
            state["pending"].append(w)
        else:
            state["updates"] += 1
        log.append((w, clocks[w], t0, now, g))
        apply(policy.on_push(Push(w, clocks[w], g.batch_size, t0, now, now, 0.0, g.mode, rnd), view()))
        start_ready(now)
        assert any(granted[i] > clocks[i] for i in range(n)), "policy stalled the cluster"
    return log, state


def test_bsp_runs_rounds_in_lock_step_and_aggregates():
    log, state = drive(P.BSP(), [1.0, 3.0, 1.5], pushes=90)
    for w, step, start, end, g in log:
        assert g.mode is PushMode.AGGREGATE
        assert all(sum(1 for (v, s, _, e, _) in log if v == u and e <= start) >= step - 1 for u in range(3))
    assert state["updates"] == 30  # 90 pushes = 30 rounds, each applied at its barrier


def test_asp_keeps_every_worker_busy_and_applies_each_push():
    log, state = drive(P.ASP(), [1.0, 5.0], pushes=120)
    assert state["updates"] == 120
    fast = sum(1 for w, *_ in log if w == 0)
    assert fast > 4 * (120 - fast)  # no waiting for the slow worker


@pytest.mark.parametrize("s", [0, 1, 3])
def test_ssp_bound_holds_and_is_reached(s):
    log, _ = drive(P.SSP(staleness=s), [1.0, 4.0], pushes=150)
    lead = 0
    for w, step, start, _, _ in log:
        done_by_slowest = min(sum(1 for (v, _, _, e, _) in log if v == u and e <= start) for u in (0, 1))
        assert step <= done_by_slowest + s + 1
        lead = max(lead, step - 1 - done_by_slowest)
    assert lead == s


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
    with pytest.raises(ValueError, match="valid: asp, bsp, elastic_bsp, fluentps, pssp, ssp"):
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
