"""Elastic workers (``tfsync scale``): the running policy is resized between runs
(``Policy.resize``), grows 2 -> 3 and shrinks 3 -> 2 workers, and goes on. Each run is a
simulator of the new count driving the same policy object (start, then on_push on views
of that count). Checked: decisions name only workers below the count and every worker
runs; a new worker starts from the policy's stated prior; a removed worker leaves no
state; ``restore_state(save_state(), workers=new)`` takes the resized state; policies
that cannot resize refuse in one line, changing nothing. Pure Python, no TensorFlow.
"""

import contextlib
import json

import numpy as np
import pytest

from tfsync.batching import GpuProfile, cpu_rule
from tfsync.policy import ASP, BSP, LBBSP, PSSP, SSP, BatchSizer, ElasticBSP, FixedSizer, FluentPS, PushMode
from tfsync.policy.rlp import FEATURES, HISTORY, RLP, QNetwork, teacher
from tfsync.sim import Simulator, SpeedModel
from tfsync.switch.online import ElasticStragglerPolicy, GreedyStragglerPolicy
from tfsync.switch.stragglers import StragglerDetector

pytestmark = pytest.mark.unit

FACTORS = [1.0, 2.5, 1.6]  # worker w's speed whatever the count
STRAGGLER = [1.0] * 5 + [4.0]  # worker 5 is slow


def plain(state: dict) -> dict:
    """``state`` through strict JSON, as it is written beside a checkpoint."""
    return json.loads(json.dumps(state, allow_nan=False))


@contextlib.contextmanager
def named(policy):
    """The workers every decision of ``policy`` names (grants, removals, restorations)."""
    seen = set()

    def watch(method):
        def call(*args):
            d = method(*args)
            seen.update({g.worker for g in d.grants} | d.remove | d.restore)
            return d
        return call
    for m in ("start", "on_push", "on_timer", "finish"):
        setattr(policy, m, watch(getattr(policy, m)))
    try:
        yield seen
    finally:
        for m in ("start", "on_push", "on_timer", "finish"):
            delattr(policy, m)


def run_on(policy, n: int, *, at: float = 0.0, pushes: int = 60, seed: int = 4, factors=FACTORS):
    """Run ``policy`` on ``n`` workers from time ``at`` (coordinator time goes on across a
    scale); every worker runs and no decision names a worker outside 0..n-1."""
    sim = Simulator(n, SpeedModel(fixed=0.01, per_sample=0.001, factors=factors, jitter=0.1, seed=seed))
    sim.now = at
    with named(policy) as workers:
        result = sim.run(policy, pushes=pushes)
    assert workers == set(range(n)) == {p.worker for p in result.log}
    return result


def rounds(result):
    """Batch sizes per aggregation round, {worker: size}."""
    out = {}
    for p in result.log:
        if p.mode is PushMode.AGGREGATE:
            out.setdefault(p.round, {})[p.worker] = p.batch_size
    return [out[r] for r in sorted(out)]


def resized(policy, n: int) -> dict:
    """Resize to ``n``; the saved state, which a fresh policy restores for ``n`` workers
    (and refuses for another count, where the state is per worker)."""
    policy.resize(n)
    state = plain(policy.save_state())
    if state.get("workers") is not None:
        assert state["workers"] == n
        with pytest.raises(ValueError, match=f"of {n} workers, this job has {n + 1}"):
            type(policy)(**FRESH.get(type(policy), dict)()).restore_state(state, workers=n + 1)
    return state


def q_network(seed: int = 0) -> QNetwork:
    rng = np.random.default_rng(seed)
    sizes = [HISTORY * FEATURES, 16, 3]
    return QNetwork([a for i in range(2) for a in (rng.normal(0, 1, (sizes[i], sizes[i + 1])),
                                                   rng.normal(0, 0.1, sizes[i + 1]))])


FRESH = {GreedyStragglerPolicy: lambda: dict(detector=StragglerDetector(1.0, 3)),  # constructor arguments
         ElasticStragglerPolicy: lambda: dict(detector=StragglerDetector(1.0, 3))}

MAKERS = {
    "bsp": BSP, "asp": ASP, "ssp": lambda: SSP(staleness=1),
    "pssp": lambda: PSSP(staleness=1, probability=0.5, seed=7),
    "fluentps_soft": lambda: FluentPS(staleness=2, probability="dynamic", execution="soft", seed=7),
    "elastic_bsp": lambda: ElasticBSP(lookahead=6, window=4),
    "lbbsp": lambda: LBBSP(batch_size=32), "lbbsp_lagged": lambda: LBBSP(batch_size=32, blocking=False),
    "lbbsp_affine": lambda: LBBSP(batch_size=32, model="affine"),
    "rlp": lambda: RLP(q_network()), "rlp_ssp2": lambda: RLP(teacher=teacher("ssp2")),
    "greedy": lambda: GreedyStragglerPolicy(StragglerDetector(1.0, 3), 150_000),
    "elastic": lambda: ElasticStragglerPolicy(StragglerDetector(1.0, 3), 150_000),
    "bsp_fixed": lambda: BSP(FixedSizer([40, 24])),
}


# -- every policy ---------------------------------------------------------------------------------
@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_every_policy_grows_2_to_3_and_shrinks_3_to_2_and_goes_on(make):
    policy = make()
    t = run_on(policy, 2).time
    state = resized(policy, 3)
    fresh = make()
    fresh.restore_state(state, workers=3)  # the resized state fits a job of the new count
    if state:  # the restored policy goes on (one that keeps nothing is a new one)
        t = run_on(fresh, 3, at=t).time
    t = run_on(policy, 3, at=t).time  # and so does the resized one
    state = resized(policy, 2)
    make().restore_state(state, workers=2)
    run_on(policy, 2, at=t)


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_a_count_below_one_is_refused_in_one_line_naming_the_policy(make):
    policy = make()
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match=rf"protocol {policy.name!r} cannot resize to {bad!r} workers"):
            policy.check_resize(bad)
        with pytest.raises(ValueError) as e:
            policy.resize(bad)
        assert "\n" not in str(e.value)


def test_a_sizer_of_one_size_keeps_it_for_any_count():
    sizer = BatchSizer(24)
    sizer.resize(5)
    assert sizer.batch_size == 24 and sizer.describe() == {"name": "BatchSizer", "batch_size": 24}
    with pytest.raises(ValueError, match="BatchSizer cannot resize to 0 workers"):
        sizer.resize(0)


# -- sizes set by a command (FixedSizer) ----------------------------------------------------------
def test_sizes_set_by_hand_a_new_worker_gets_their_mean_a_removed_one_loses_its_own():
    policy = BSP()
    policy.set_batch_sizes([48, 17], max_batch=64)
    t = run_on(policy, 2).time
    policy.resize(3)
    assert policy.sizer.per_worker == (48, 17, 33)  # 32.5 rounded half up
    r = run_on(policy, 3, at=t)
    assert set(map(lambda s: tuple(sorted(s.items())), rounds(r))) == {((0, 48), (1, 17), (2, 33))}
    policy.set_batch_sizes([40, 10, 31], max_batch=64)
    policy.resize(2)
    assert policy.sizer.per_worker == (40, 10) and policy.sizer.batch_size == 40
    assert all(s == {0: 40, 1: 10} for s in rounds(run_on(policy, 2, at=r.time)))
    policy.resize(3)  # worker 2's 31 went with it: the prior is the kept sizes' mean
    assert policy.sizer.per_worker == (40, 10, 25)
    policy.resize(3)
    assert policy.sizer.per_worker == (40, 10, 25)  # a second resize to the same count changes nothing


# -- LB-BSP ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("blocking", [True, False])
def test_lbbsp_sizes_a_new_worker_at_the_mean_prediction_and_the_round_total_follows(blocking):
    # the paper's rule (cpu_rule), without the guard, which measures 3 rounds of the even split after a resize
    policy = LBBSP(batch_size=32, blocking=blocking, model="proportional", floor=0.0, guard=False)
    t = run_on(policy, 2).time
    kept = dict(policy.sizer._next)
    assert set(kept) == {0, 1}
    state = resized(policy, 3)
    assert set(state["sizer"]["predictors"]) == {"0", "1"}  # worker 2 has no predictor until it pushes
    mean = (kept[0] + kept[1]) / 2
    expected = dict(enumerate(cpu_rule([kept[0], kept[1], mean], 96)))
    first = rounds(run_on(policy, 3, at=t))
    assert first[0] == expected and sum(first[0].values()) == 96
    assert all(sum(s.values()) == 96 for s in first)


@pytest.mark.parametrize("model", ["proportional", "affine"])
@pytest.mark.parametrize("blocking", [True, False])
def test_lbbsp_shrink_leaves_no_state_of_the_removed_worker(blocking, model):
    policy = LBBSP(batch_size=32, blocking=blocking, model=model, guard=False)   # (the guard: measures first)
    t = run_on(policy, 3, pushes=90).time
    assert set(policy.sizer.predictors) == {0, 1, 2}
    state = resized(policy, 2)["sizer"]
    for key in ("predictors", "next", "last_speeds") + (("fits",) if model == "affine" else ()):
        assert set(state[key]) == {"0", "1"}, key
    assert state["current"] is None  # sized again for the new count, not held at the old one's
    assert state["plan"] is None if blocking else set(state["plan"]) == {"0", "1"}
    sizes = rounds(run_on(policy, 2, at=t))
    assert all(set(s) == {0, 1} and sum(s.values()) == 64 for s in sizes)
    assert sizes[0][0] > sizes[0][1]  # the kept predictions size the first round: worker 0 is faster


def test_lbbsp_refuses_new_workers_it_has_no_profile_or_bounds_for_and_changes_nothing():
    profiles = [GpuProfile(0.001, 0.01, 1, None), GpuProfile(0.003, 0.03, 1, None)]
    unprofiled = r"it has GPU profiles for workers \[0, 1\], not for \[2\]"
    for policy, why in ((LBBSP(batch_size=32, profiles=profiles), unprofiled),
                        (LBBSP(batch_size=32, lo=[4, 4]), "lo has 2 entries for 3 workers"),
                        (LBBSP(batch_size=32, hi=[40, 40]), "hi has 2 entries for 3 workers")):
        run_on(policy, 2)
        before = plain(policy.save_state())
        with pytest.raises(ValueError, match=f"protocol 'lbbsp' cannot resize to 3 workers: {why}"):
            policy.check_resize(3)
        with pytest.raises(ValueError, match=why):
            policy.resize(3)
        assert plain(policy.save_state()) == before
        policy.resize(1)  # a shrink keeps bounds and profiles for those left
        assert policy.sizer.workers == 1
    policy = LBBSP(batch_size=32, lo=[4, 5, 6])   # bounds for 3: a shrink to 2, then back to 3
    run_on(policy, 3)
    policy.resize(2)
    assert policy.sizer.lo == [4, 5]
    policy.resize(3)
    assert policy.sizer.lo == [4, 5, 6]
    policy = LBBSP(batch_size=32, hi=[20, 60])
    with pytest.raises(ValueError, match="total batch 32 cannot be split among 1 workers"):
        policy.resize(1)  # worker 0 alone may not take X = 32


# -- ElasticBSP ------------------------------------------------------------------------------------
def test_elastic_bsp_measures_a_new_worker_and_plans_at_once_after_a_shrink():
    policy = ElasticBSP(lookahead=6, window=4)
    t = run_on(policy, 2, pushes=80).time
    planned = len(policy.barriers)
    state = resized(policy, 3)
    assert set(state["intervals"]) == {"0", "1"}
    r = run_on(policy, 3, at=t, pushes=80)
    # prior: no interval for worker 2, so the first superstep is one measuring step each
    assert [(p.worker, p.step, p.mode) for p in sorted(r.log[:3], key=lambda p: p.worker)] == \
        [(w, 1, PushMode.AGGREGATE) for w in range(3)]
    assert policy.barriers[planned]["workers"] == [0, 1, 2]
    state = resized(policy, 2)
    assert set(state["intervals"]) == {"0", "1"} and set(policy.target) <= {0, 1}
    planned = len(policy.barriers)
    run_on(policy, 2, at=r.time)
    assert policy.barriers[planned]["workers"] == [0, 1]  # the first superstep is planned from what is kept


# -- FluentPS / PSSP ----------------------------------------------------------------------------------
def test_pssp_shrink_drops_the_removed_worker_from_waiting_and_released_pulls():
    policy = PSSP(staleness=1, probability=0.5, seed=7)
    t = run_on(policy, 3, pushes=200).time
    assert 2 in {w for w, _ in policy.released}
    policy.callbacks, policy.blocked = {5: [2, 0], 6: [2]}, {0, 2}  # as if stopped with pulls waiting
    draws, delayed = dict(policy.draws), policy.delayed
    policy.resize(2)
    assert {w for w, _ in policy.released} and {w for w, _ in policy.released} <= {0, 1}
    assert policy.callbacks == {5: [0]} and policy.blocked == {0}
    assert policy.draws == draws and policy.delayed == delayed  # counters by gap and the stream go on
    run_on(policy, 2, at=t, pushes=100)
    policy.resize(3)
    run_on(policy, 3, pushes=100)


def test_fluentps_with_a_quorum_above_the_new_count_refuses_and_changes_nothing():
    policy = FluentPS(staleness=0, quorum=3)
    run_on(policy, 3)
    released = list(policy.released)
    with pytest.raises(ValueError, match="protocol 'fluentps' cannot resize to 2 workers: its quorum is 3"):
        policy.check_resize(2)
    with pytest.raises(ValueError, match="quorum is 3"):
        policy.resize(2)
    assert list(policy.released) == released and policy._n == 3
    policy.resize(4)


# -- Sync-Switch's straggler policies -------------------------------------------------------------------
def test_a_straggler_policy_forgets_a_removed_straggler_and_starts_a_new_worker_unmarked():
    policy = GreedyStragglerPolicy(StragglerDetector(1.0, 2), 150_000)
    t = run_on(policy, 6, pushes=600, factors=STRAGGLER).time
    assert policy.detector.stragglers == {5} and policy.state == "asp"
    events = list(policy.detector.events)
    state = resized(policy, 5)
    detector = state["detector"]
    assert detector["stragglers"] == [] and "5" not in detector["bad"] and "5" not in detector["good"]
    assert all("5" not in per for per in detector["open"].values())
    assert policy.detector.events == events  # the record stays
    run_on(policy, 5, at=t, pushes=300, factors=STRAGGLER)
    state = resized(policy, 6)  # worker 5 again: a new worker, counted from nothing
    assert "5" not in state["detector"]["bad"] and policy.detector.stragglers == set()


def test_a_straggler_policy_shrunk_below_what_detection_needs_says_so(caplog):
    policy = GreedyStragglerPolicy(StragglerDetector(1.0, 3), 150_000)
    run_on(policy, 3, pushes=30)
    with caplog.at_level("WARNING", logger="tfsync.switch.online"):
        policy.resize(3 + 1)
        assert not caplog.records
        policy.resize(2)
    (said,) = [r.getMessage() for r in caplog.records]
    assert "with 2 workers: straggler detection" in said and "needs >= 3 workers" in said


def test_the_elastic_straggler_policy_refuses_while_it_holds_a_worker_out():
    policy = ElasticStragglerPolicy(StragglerDetector(1.0, 2), 150_000, readmit_after_s=None)
    run_on(policy, 6, pushes=600, factors=STRAGGLER)
    assert list(policy.removed) == [5]
    before = plain(policy.save_state())
    with pytest.raises(ValueError, match=r"'sync_switch_elastic' cannot resize now: it holds worker\(s\) \[5\]"):
        policy.check_resize(5)
    with pytest.raises(ValueError, match="out of the membership"):
        policy.resize(7)
    assert plain(policy.save_state()) == before


def test_a_straggler_policy_refuses_what_its_inner_bsp_refuses_and_changes_nothing():
    policy = GreedyStragglerPolicy(StragglerDetector(1.0, 3), 150_000, bsp=LBBSP(batch_size=32, lo=[4, 4]))
    run_on(policy, 2)
    before = plain(policy.save_state())
    with pytest.raises(ValueError, match="protocol 'lbbsp' cannot resize to 3 workers"):
        policy.resize(3)
    assert plain(policy.save_state()) == before and policy.workers == 2
