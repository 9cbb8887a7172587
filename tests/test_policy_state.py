"""Policy state across a restart (issue 15): every policy that learns or counts something
saves it as plain JSON, a fresh policy with the same options takes it back, and then
decides as the saved one would have; states that do not fit are refused, changing nothing.

The restarts are played in the simulator: a run up to a checkpoint, then the original
policy goes on, a restored fresh one goes on from a copy of the same run, and a fresh one
without the state goes on from another copy (it must decide differently, or the test
could not fail). Pure Python, no TensorFlow.
"""

import dataclasses
import json
import math
import os

import numpy as np
import pytest

from tfsync.policy import BSP, LBBSP, PSSP, SSP, ElasticBSP, FluentPS
from tfsync.policy.rlp import FEATURES, HISTORY, RLP, QNetwork, teacher
from tfsync.predict import NarxTrainer, NoObservation, get as predictor
from tfsync.sim import Simulator, SpeedModel
from tfsync.switch.online import ElasticStragglerPolicy, GreedyStragglerPolicy
from tfsync.switch.slowdown import Slowdown, TransientSlowdown
from tfsync.switch.stragglers import StragglerDetector

pytestmark = pytest.mark.unit


def plain(state: dict) -> dict:
    """``state`` through strict JSON, as it is written beside a checkpoint."""
    return json.loads(json.dumps(state, allow_nan=False))


@dataclasses.dataclass
class Restart:
    original: tuple  # (simulator result, policy): the saved policy going on
    restored: tuple  # a fresh policy given the state, going on from the same point
    fresh: tuple  # a fresh policy without the state, the same
    state: dict
    since: int  # pushes before the checkpoint


def restart(make_policy, make_sim, first: dict, then: dict, *, gap: float = 0.0) -> Restart:
    """Run ``make_policy()`` for ``first`` (the simulator's limits), save its state, then
    run each of the three ``then`` from copies of that point (the copies ``gap`` seconds of
    downtime later)."""
    sim = make_sim()
    original = make_policy()
    sim.run(original, **first)
    since, state = len(sim.log), plain(original.save_state())
    out = [(sim.run(original, **then), original)]
    for saved in (state, None):
        sim = make_sim()
        sim.run(make_policy(), **first)  # the same run up to the checkpoint
        policy = make_policy()
        if saved is not None:
            policy.restore_state(saved, workers=sim.n)
        sim.now += gap
        out.append((sim.run(policy, **then), policy))
    return Restart(*out, state, since)


def decisions(result, since: int, shift: float = 0.0):
    """What the policy decided, push by push: who ran, on how many samples, how, when."""
    return [(p.worker, p.step, p.batch_size, p.mode, p.round, p.dropped, round(p.arrival - shift, 6))
            for p in result.log[since:]]


def same_then_different(r: Restart, shift: float = 0.0):
    expected = decisions(r.original[0], r.since)
    assert len(expected) > 20
    assert decisions(r.restored[0], r.since, shift) == expected
    assert decisions(r.fresh[0], r.since, shift) != expected


# -- the default: policies that keep nothing ---------------------------------------------------
def test_a_policy_that_keeps_nothing_saves_an_empty_dict_and_refuses_another_state():
    for policy in (BSP(), SSP(staleness=2)):
        assert policy.save_state() == {}
        policy.restore_state({})  # always accepted
    with pytest.raises(ValueError, match="protocol 'bsp' keeps no state.*'lbbsp'"):
        BSP().restore_state(LBBSP().save_state())


# -- predictors ---------------------------------------------------------------------------------
def observations(n: int, seed: int = 0):
    """(speed, cpu, mem): speed falls as another load's CPU rises, with noise."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        cpu = 50 + 40 * math.sin(k / 7)
        out.append((float(100 - 0.5 * cpu + rng.normal(0, 2) + 0.1 * k), float(cpu), float(30 + k % 5)))
    return out


def rnn_weights(kind: str, units: int = 4, seed: int = 1) -> dict:
    """A model to start from, so the RNNs predict from the first steps without training (no TF)."""
    from tfsync.predict import nets
    rng = np.random.default_rng(seed)
    return {"kind": kind, "weights": [rng.normal(0, 0.3, s) for s in nets.shapes(kind, 2, units)],
            "x_mean": np.zeros((2, 1)), "x_std": np.ones((2, 1)), "y_mean": 0.0, "y_std": 1.0}


PREDICTORS = {
    "last": dict(name="last"),
    "ema": dict(name="ema", alpha=0.3),
    "arima": dict(name="arima", refit_every=5, window=40, min_obs=12),
    "narx": dict(name="narx", warmup=30, min_train=20, retrain_every=10, window=60),
    "narx_ema": dict(name="narx", warmup=30, min_train=20, retrain_every=10, window=60, baseline="ema",
                     lookback=3),
    "rnn": dict(name="rnn", min_train=150, window=200),
    "lstm": dict(name="lstm", min_train=150, window=200),
}


def make_predictor(key: str):
    options = dict(PREDICTORS[key])
    if options["name"] in ("narx", "rnn", "lstm"):
        options["trainer"] = NarxTrainer(threads=0)
    if options["name"] in ("rnn", "lstm"):
        options["weights"] = rnn_weights(options["name"])
    return predictor(options)


def predictions(p, obs):
    out = []
    for speed, cpu, mem in obs:
        p.update(speed, cpu, mem)
        out.append(p.predict())
    return out


@pytest.mark.parametrize("key", list(PREDICTORS))
def test_a_restored_predictor_predicts_as_the_saved_one(key):
    obs = observations(120)
    original = make_predictor(key)
    predictions(original, obs[:80])
    state = plain(original.save_state())
    assert state["predictor"] == PREDICTORS[key]["name"] and state["count"] == 80
    restored, fresh = make_predictor(key), make_predictor(key)
    restored.restore_state(state)
    assert restored.predict() == pytest.approx(original.predict(), rel=1e-12)
    expected = predictions(original, obs[80:])
    assert predictions(restored, obs[80:]) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(NoObservation):
        fresh.predict()
    if key != "last":  # memoryless: the same after one observation
        assert predictions(fresh, obs[80:]) != pytest.approx(expected, rel=1e-3)
    if key.startswith("narx"):  # its model was refit after the restore, the same way
        assert restored.fits == original.fits >= 7 and restored.using_model


def test_predictor_states_that_do_not_fit_are_refused_and_change_nothing():
    narx = make_predictor("narx")
    predictions(narx, observations(40))
    state = plain(narx.save_state())
    with pytest.raises(ValueError, match="predictor 'narx', not 'ema'"):
        make_predictor("ema").restore_state(state)
    for options, reason in ((dict(units=3), r"shapes .*\(8, 2\).*\(8, 3\)"), (dict(lookback=3), "11"),
                            (dict(baseline="ema"), "baseline")):
        other = predictor({**PREDICTORS["narx"], **options})
        with pytest.raises(ValueError, match=reason):
            other.restore_state(state)
        assert other.count == 0 and other.weights is None and other._v == []
    with pytest.raises(ValueError, match="version 99, this tfsync reads version 1"):
        make_predictor("narx").restore_state({**state, "version": 99})
    rnn = make_predictor("rnn")
    with pytest.raises(ValueError, match="shapes"):
        predictor({**PREDICTORS["rnn"], "units": 2}).restore_state(plain(rnn.save_state()))


def test_a_fit_asked_for_and_not_done_at_the_checkpoint_is_asked_for_again():
    class Later(NarxTrainer):  # takes requests and never trains (a background fit still running)
        def request(self, predictor):
            self.asked = getattr(self, "asked", 0) + 1

    narx = predictor({**PREDICTORS["narx"], "trainer": Later()})
    predictions(narx, observations(31))
    assert narx.trainer.asked == 1
    state = plain(narx.save_state())
    assert state["fit_pending"] and state["model"] is None
    restored = predictor({**PREDICTORS["narx"], "trainer": NarxTrainer(threads=0)})
    restored.restore_state(state)
    predictions(restored, observations(1))
    assert restored.fits == 1 and restored.using_model


# -- LB-BSP ---------------------------------------------------------------------------------------
def lbbsp_sim():
    return Simulator(3, SpeedModel(fixed=0.0, per_sample=0.001, factors=[1.0, 2.5, 1.6], jitter=0.1, seed=4))


@pytest.mark.parametrize("key", ["last", "ema", "arima", "narx"])
@pytest.mark.parametrize("blocking", [True, False])
def test_lbbsp_sizes_as_before_after_a_restart(key, blocking):
    pushes = 60 if key == "arima" else 150   # ARIMA refits cost most: its fit is in use after 12 rounds
    r = restart(lambda: LBBSP(batch_size=32, predictor=dict(PREDICTORS[key]), blocking=blocking),
                lbbsp_sim, dict(pushes=pushes), dict(pushes=pushes))
    assert r.state["protocol"] == "lbbsp" and r.state["workers"] == 3
    assert set(r.state["sizer"]["predictors"]) == {"0", "1", "2"}
    same_then_different(r)
    if key == "narx":
        assert all(p.using_model for p in r.restored[1].sizer.predictors.values())
    if key == "arima":   # the saved state holds a fitted model, not only its EMA fallback
        assert all(p["fits"] >= 1 and p["params"] for p in r.state["sizer"]["predictors"].values())


def test_lbbsp_affine_sizes_as_before_after_a_restart():
    """The affine model's lines are part of the state: without them a restored sizer
    falls back to the proportional rule until the batches differ again."""
    def sim():
        return Simulator(3, SpeedModel(fixed=0.02, per_sample=0.001, factors=[1.0, 2.5, 1.6], jitter=0.1, seed=4))
    r = restart(lambda: LBBSP(batch_size=32, model="affine"), sim, dict(pushes=150), dict(pushes=150))
    assert len(r.state["sizer"]["fits"]["1"]) == 16
    same_then_different(r)


def test_lbbsp_refuses_another_protocol_predictor_or_worker_count_and_changes_nothing():
    policy = LBBSP(batch_size=32, predictor="ema")
    lbbsp_sim().run(policy, pushes=30)
    state = plain(policy.save_state())
    with pytest.raises(ValueError, match="is of protocol 'lbbsp', not 'sync_switch_greedy'"):
        GreedyStragglerPolicy(StragglerDetector(1.0)).restore_state(state)
    other = LBBSP(batch_size=32, predictor="narx")
    with pytest.raises(ValueError, match="protocol 'lbbsp': the narx predictor: .*predictor 'ema', not 'narx'"):
        other.restore_state(state)
    with pytest.raises(ValueError, match="of 3 workers, this job has 4"):
        LBBSP(batch_size=32).restore_state(state, workers=4)
    broken = plain(state)
    broken["sizer"]["predictors"]["2"]["value"] = "fast"  # workers 0 and 1 fit, worker 2 does not
    fresh = LBBSP(batch_size=32)
    with pytest.raises(ValueError, match="protocol 'lbbsp'"):
        fresh.restore_state(broken)
    assert fresh.sizer.predictors == {} and fresh.sizer.current is None  # nothing restored


# -- Sync-Switch's straggler policies ------------------------------------------------------------
def straggler_sim():
    return Simulator(6, TransientSlowdown(fixed=0.05, per_sample=0.0, jitter=0.05, seed=1,
                                          slowdowns=(Slowdown(worker=2, start=5.0, end=15.0, factor=4.0),)))


@pytest.mark.parametrize("cls", [GreedyStragglerPolicy, ElasticStragglerPolicy])
def test_straggler_policies_go_on_in_the_same_mode_with_the_same_windows(cls):
    def make():  # readmitted 3 s after removal: before the run ends, only if the removal is known
        return cls(StragglerDetector(1.0, 3), 150_000, **({} if cls is GreedyStragglerPolicy else
                                                          dict(readmit_after_s=3.0)))

    # the checkpoint at 10 s: worker 2 is a straggler, the greedy policy runs ASP
    r = restart(make, straggler_sim, dict(time=10.0), dict(samples=120_000))
    assert r.state["mode"] == ("asp" if cls is GreedyStragglerPolicy else "bsp")
    assert r.state["detector"]["stragglers"] == [2]
    if cls is ElasticStragglerPolicy:
        assert list(r.state["removed"]) == ["2"]
    same_then_different(r)
    (_, original), (_, restored) = r.original, r.restored
    assert restored.timeline == original.timeline and restored.switches == original.switches
    assert restored.detector.events == original.detector.events


def test_a_removed_straggler_keeps_its_time_out_across_the_downtime():
    """Times are shifted by the downtime: the restored elastic policy readmits and removes
    the slow worker at the same running times as the original, 1000 s later."""
    def make():
        return ElasticStragglerPolicy(StragglerDetector(1.0, 2), None, readmit_after_s=6.0)

    def sim():  # worker 5 is slow for good: removed, readmitted after 6 s, removed again
        return Simulator(6, SpeedModel(fixed=0.05, per_sample=0.0, factors=[1, 1, 1, 1, 1, 3], jitter=0.05, seed=2))

    r = restart(make, sim, dict(time=8.0), dict(time=20.0), gap=1000.0)
    assert list(r.state["removed"]) == ["5"]
    same_then_different(r, shift=1000.0)
    known = len(r.state["membership"])
    later = [(round(t, 6), what, w) for t, what, w in r.original[1].membership[known:]]
    assert later and [(round(t - 1000.0, 6), what, w) for t, what, w in r.restored[1].membership[known:]] == later


def test_straggler_states_that_do_not_fit_are_refused_and_change_nothing():
    policy = GreedyStragglerPolicy(StragglerDetector(1.0, 3), 150_000)
    straggler_sim().run(policy, time=10.0)
    state = plain(policy.save_state())
    with pytest.raises(ValueError, match="'sync_switch_greedy', not 'sync_switch_elastic'"):
        ElasticStragglerPolicy(StragglerDetector(1.0, 3)).restore_state(state)
    with pytest.raises(ValueError, match="of 6 workers, this job has 4"):
        GreedyStragglerPolicy(StragglerDetector(1.0, 3)).restore_state(state, workers=4)
    other = GreedyStragglerPolicy(StragglerDetector(2.0, 3), 150_000, bsp=LBBSP())
    with pytest.raises(ValueError, match="windows are of 1.0 s, this one's of 2.0 s"):
        other.restore_state(state)
    with pytest.raises(ValueError, match="of protocol 'bsp', not 'lbbsp'"):
        GreedyStragglerPolicy(StragglerDetector(1.0, 3), bsp=LBBSP()).restore_state(
            {**state, "bsp": LBBSP().save_state() | {"protocol": "bsp"}})
    assert other.state == "bsp" and other.detector.origin is None and other.bsp_done == 0


# -- RLP ------------------------------------------------------------------------------------------
def q_network(seed: int = 0) -> QNetwork:
    rng = np.random.default_rng(seed)
    sizes = [HISTORY * FEATURES, 16, 3]
    return QNetwork([a for i in range(2) for a in (rng.normal(0, 1, (sizes[i], sizes[i + 1])),
                                                   rng.normal(0, 0.1, sizes[i + 1]))])


def test_rlp_decides_from_the_same_history_after_a_restart():
    from tfsync.sim.model import NumpyMLP
    d = np.load(os.path.join(os.path.dirname(__file__), "..", "tfsync", "datasets", "mnist_sample.npz"))

    def sim():
        model = NumpyMLP(d["x_train"][:1000], d["y_train"][:1000], d["x_test"][:100], d["y_test"][:100],
                         hidden=8, seed=1)
        return Simulator(4, SpeedModel(fixed=0.02, per_sample=0.0, factors=[1, 1.5, 2, 3], jitter=0.1, seed=3),
                         model=model)

    r = restart(lambda: RLP(q_network()), sim, dict(pushes=60), dict(pushes=60))
    assert len(r.state["tracker"]["rows"]) == HISTORY and min(r.state["counts"][:2]) > 0
    same_then_different(r)
    assert r.restored[1].counts == r.original[1].counts


def test_rlp_refuses_the_state_of_another_static_policy():
    ssp2 = RLP(teacher=teacher("ssp2"))
    lbbsp_sim().run(ssp2, pushes=20)
    with pytest.raises(ValueError, match="'ssp2', not 'bsp'"):
        RLP(teacher=teacher("bsp")).restore_state(plain(ssp2.save_state()))
    bad = plain(ssp2.save_state())
    bad["tracker"]["rows"] = bad["tracker"]["rows"][:4]
    with pytest.raises(ValueError, match="4 rows"):
        RLP(teacher=teacher("ssp2")).restore_state(bad)


# -- FluentPS / PSSP, ElasticBSP -------------------------------------------------------------------
def uneven_sim():
    return Simulator(4, SpeedModel(fixed=0.02, per_sample=0.0, factors=[1, 1.3, 2, 3.5], jitter=0.1, seed=5))


@pytest.mark.parametrize("make", [lambda: PSSP(staleness=1, probability=0.5, seed=7),
                                  lambda: FluentPS(staleness=2, probability="dynamic", execution="soft", seed=7)],
                         ids=["pssp", "fluentps_dynamic_soft"])
def test_pssp_draws_what_it_would_have_drawn_after_a_restart(make):
    r = restart(make, uneven_sim, dict(pushes=200), dict(pushes=200))
    assert r.state["delayed"] > 0
    same_then_different(r)
    assert r.restored[1].stats() == r.original[1].stats()


def test_elastic_bsp_plans_from_the_learned_intervals_after_a_restart():
    r = restart(lambda: ElasticBSP(lookahead=6, window=4), uneven_sim, dict(pushes=100), dict(pushes=100))
    assert set(r.state["intervals"]) == {"0", "1", "2", "3"} and r.state["workers"] == 4
    same_then_different(r)
    with pytest.raises(ValueError, match="of 4 workers, this job has 3"):
        ElasticBSP().restore_state(r.state, workers=3)
