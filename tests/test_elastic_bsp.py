"""ElasticBSP in the simulator: supersteps follow the searched barrier, the
barrier is minimal for the predictions, and every superstep starts from shared weights."""

import numpy as np
import pytest

from tfsync import policy as P
from tfsync.policy.barrier_search import brute_force
from tfsync.policy.elastic_bsp import predict
from tfsync.policy.base import PushMode
from tfsync.sim import Simulator, SpeedModel

pytestmark = pytest.mark.unit


def run(factors, pushes=600, lookahead=5, **speed):
    pol = P.get("elastic_bsp", lookahead=lookahead)
    sim = Simulator(len(factors), SpeedModel(factors=factors, seed=2, **speed))
    return pol, sim.run(pol, pushes=pushes)


def supersteps(result):
    """Pushes grouped by superstep: an AGGREGATE push closes a worker's superstep."""
    groups, current = [], {}
    open_workers = None
    for p in result.log:
        if open_workers is None:
            open_workers = set(range(result.num_workers))
        current.setdefault(p.worker, []).append(p)
        if p.mode is PushMode.AGGREGATE:
            open_workers.discard(p.worker)
            if not open_workers:
                groups.append(current)
                current, open_workers = {}, None
    return groups


def test_steady_speeds_follow_the_plan_and_wait_as_predicted():
    pol, r = run([1.0, 1.7, 2.9])
    groups = supersteps(r)
    plans = list(pol.barriers)
    assert len(groups) >= 20 and [len(p) for p in groups[0].values()] == [1, 1, 1]  # measuring
    for group, plan in zip(groups[1:], plans):
        assert tuple(len(group[w]) for w in plan["workers"]) == plan["steps"]
        ends = [group[w][-1].arrival for w in plan["workers"]]
        assert max(ends) - min(ends) == pytest.approx(plan["spread"], abs=1e-9)
    assert any(len(set(plan["steps"])) > 1 for plan in plans)  # fast workers run more steps


def test_each_barrier_is_minimal_for_its_predictions():
    pol, _ = run([1.0, 1.3, 1.7, 2.2, 2.9], lookahead=6, jitter=0.1, straggle_p=0.1, straggle_mean=0.05)
    assert len(pol.barriers) > 20
    for plan in pol.barriers:
        best = brute_force(predict(plan["time"], plan["intervals"], 6))
        assert plan["steps"] == best.steps and plan["spread"] == best.spread


def test_supersteps_start_from_the_same_weights():
    _, r = run([1.0, 1.5, 2.5, 4.0], jitter=0.05)
    groups = supersteps(r)[1:]
    assert len(groups) > 10
    for group in groups:
        firsts = {steps[0].version for steps in group.values()}
        assert len(firsts) == 1  # all read the weights right after the barrier


def test_beats_bsp_on_uneven_workers():
    factors = [1.0, 1.0, 2.0, 3.0]
    _, elastic = run(factors, pushes=1200)
    bsp = Simulator(4, SpeedModel(factors=factors, seed=2)).run(P.get("bsp"), pushes=1200)
    assert elastic.pushes / elastic.time > 1.5 * bsp.pushes / bsp.time


def test_options_are_checked():
    with pytest.raises(ValueError, match="lookahead"):
        P.get("elastic_bsp", lookahead=0)
    with pytest.raises(ValueError, match="search = 'gridscan': must be one of .*\"brute_force\""):
        P.get("elastic_bsp", search="gridscan")


def test_wait_share_objective_makes_longer_supersteps_and_runs_faster():
    """On many uneven workers the paper's smallest-wait barrier is nearly always the
    first iteration of everyone (BSP); minimising the wait per unit of superstep is not."""
    factors = list(np.random.default_rng(0).uniform(1, 2, 16))
    runs = {}
    for objective in ("spread", "share"):
        pol = P.get("elastic_bsp", lookahead=15, objective=objective)
        r = Simulator(16, SpeedModel(factors=factors, jitter=0.1, seed=1)).run(pol, pushes=4000)
        runs[objective] = (len(pol.barriers), r.pushes / r.time)
    assert runs["share"][0] < runs["spread"][0] / 3
    assert runs["share"][1] > 1.05 * runs["spread"][1]
    with pytest.raises(ValueError, match="zipline_fast"):
        P.get("elastic_bsp", objective="share", search="zipline")
