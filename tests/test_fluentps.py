"""FluentPS on recorded simulator schedules: each model's defining property."""

import math

import pytest

from tfsync import policy as P
from tfsync.sim import Simulator, SpeedModel

pytestmark = pytest.mark.unit

STRAGGLY = dict(jitter=0.2, straggle_p=0.2, straggle_mean=0.15, straggle_std=0.05)


def run(spec, n=8, pushes=3000, seed=1, **speed):
    pol = P.get(dict(spec), seed=seed)
    return pol, Simulator(n, SpeedModel(seed=seed, **(speed or STRAGGLY))).run(pol, pushes=pushes)


def finished_by(result):
    """finished(w, t): steps worker w had pushed by time t."""
    arrivals = {}
    for p in result.log:
        arrivals.setdefault(p.worker, []).append(p.arrival)
    return lambda w, t: sum(a <= t for a in arrivals[w]), sorted(arrivals)


def test_soft_barrier_ssp_is_exactly_our_ssp():
    """Table III's SSP row answered by the soft barrier is the SSP bound itself."""
    _, fluent = run({"name": "fluentps", "staleness": 2, "probability": 1.0, "execution": "soft"})
    ssp = Simulator(8, SpeedModel(seed=1, **STRAGGLY)).run(P.get("ssp", staleness=2), pushes=3000)
    assert [(p.worker, p.step, p.start) for p in fluent.log] == [(p.worker, p.step, p.start) for p in ssp.log]


@pytest.mark.parametrize("execution", ["lazy", "soft"])
def test_ssp_bound_holds(execution):
    s = 2
    _, r = run({"name": "fluentps", "staleness": s, "probability": 1.0, "execution": execution})
    done, workers = finished_by(r)
    for p in r.log:  # step k (progress k-1) started only with every worker past iteration k-1-s
        assert p.step <= min(done(w, p.start) for w in workers) + s + 1


def test_lazy_pulls_read_fresh_weights_soft_ones_may_not():
    fresh = {}
    for execution in ("lazy", "soft"):
        pol, r = run({"name": "fluentps", "staleness": 2, "probability": 1.0, "execution": execution})
        done, workers = finished_by(r)
        start = {(p.worker, p.step): p.start for p in r.log}
        released = [(w, k) for w, k in pol.released if (w, k) in start]
        assert len(released) > 50
        # fresh: every worker had pushed the requester's own iteration (step k-1) before it read
        fresh[execution] = [all(done(u, start[w, k]) >= k - 1 for u in workers) for w, k in released]
    assert all(fresh["lazy"])
    assert not all(fresh["soft"])


@pytest.mark.parametrize("c", [0.3, 0.5])
def test_constant_pssp_pauses_with_probability_c(c):
    pol, r = run({"name": "pssp", "staleness": 2, "probability": c}, pushes=6000)
    draws, pauses = sum(pol.draws.values()), sum(pol.pauses.values())
    assert draws > 500
    assert abs(pauses / draws - c) < 4 * math.sqrt(c * (1 - c) / draws)
    done, workers = finished_by(r)
    gaps = [p.step - 1 - min(done(w, p.start) for w in workers) for p in r.log]
    assert max(gaps) > 2 + 1  # unlike SSP, PSSP lets some pulls run past the bound


def test_dynamic_pssp_pauses_follow_the_logistic():
    s, alpha = 2, 0.8
    pol, _ = run({"name": "pssp", "staleness": s, "probability": "dynamic", "alpha": alpha}, pushes=8000)
    checked = 0
    for k, draws in pol.draws.items():
        if draws >= 200:
            p = alpha / (1 + math.exp(s - k))
            assert abs(pol.pauses[k] / draws - p) < 4 * math.sqrt(p * (1 - p) / draws)
            checked += 1
    assert checked >= 2 and pol.pause_probability(s) == pytest.approx(alpha / 2)


def test_dprs_lazy_fewer_than_soft_and_pssp_fewer_than_equivalent_ssp():
    """FluentPS Table IV and Fig. 9 trends: lazy execution saves DPRs; PSSP(s, c) makes
    fewer DPRs than SSP with the same regret bound, s' = s + 1/c - 1."""
    dpr = {}
    for key, spec in {"lazy": {"name": "fluentps", "staleness": 2, "probability": 1.0},
                      "soft": {"name": "fluentps", "staleness": 2, "probability": 1.0, "execution": "soft"},
                      "pssp": {"name": "pssp", "staleness": 2, "probability": 0.5, "execution": "soft"},
                      "ssp'": {"name": "fluentps", "staleness": 3, "probability": 1.0, "execution": "soft"},
                      }.items():
        pol, _ = run(spec, pushes=4000)
        dpr[key] = pol.stats()["dpr_per_100_iterations"]
    assert dpr["lazy"] < dpr["soft"]
    assert dpr["pssp"] < dpr["ssp'"]


def test_asp_never_delays_and_bsp_is_lock_step():
    pol, r = run({"name": "fluentps", "staleness": None})
    assert pol.delayed == 0 and r.updates == r.pushes
    pol, r = run({"name": "fluentps", "staleness": 0})
    done, workers = finished_by(r)
    assert all(p.step <= min(done(w, p.start) for w in workers) + 1 for p in r.log)
    assert pol.stats()["dpr_per_100_iterations"] == pytest.approx(700, rel=0.02)  # N-1 of N wait


def test_drop_stragglers_quorum_leaves_the_slowest_behind():
    speed = dict(factors=[1] * 7 + [5], jitter=0.05)
    _, full = run({"name": "fluentps", "staleness": 0}, **speed)
    _, quorum = run({"name": "fluentps", "staleness": 0, "quorum": 7}, **speed)
    steps = lambda r, w: max(p.step for p in r.log if p.worker == w)  # noqa: E731
    assert steps(full, 0) - steps(full, 7) <= 1
    assert steps(quorum, 0) > 3 * steps(quorum, 7)
    assert quorum.time < full.time / 2


def test_options_are_checked():
    for bad in ({"probability": 2.0}, {"execution": "eager"}, {"staleness": -1}, {"alpha": 0}):
        with pytest.raises(ValueError):
            P.get("fluentps", **bad)
