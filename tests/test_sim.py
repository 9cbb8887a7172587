"""The simulator: deterministic schedules, the engine's record format, speed models,
and training numbers that match a hand-computed reference. No TensorFlow."""

import json
import os

import numpy as np
import pytest

from tfsync import policy as P
from tfsync.policy.base import NOTHING, Policy, PolicyError, PushMode
from tfsync.sim import Simulator, SpeedModel, load_cpu_traces
from tfsync.sim.model import NumpyMLP

pytestmark = pytest.mark.unit

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "tfsync", "datasets", "mnist_sample.npz")
TRACES = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "traces")
STRAGGLY = dict(jitter=0.2, straggle_p=0.2, straggle_mean=0.1, straggle_std=0.03)


def schedule(result):
    return [(p.worker, p.step, p.start, p.arrival, p.version) for p in result.log]


def test_same_seed_same_schedule_other_seed_differs():
    runs = [Simulator(4, SpeedModel(seed=s, **STRAGGLY)).run(P.get("ssp", staleness=1), pushes=300)
            for s in (7, 7, 8)]
    assert schedule(runs[0]) == schedule(runs[1])
    assert schedule(runs[0]) != schedule(runs[2])


def test_worker_luck_does_not_depend_on_the_policy():
    """Worker w's k-th step takes as long under every policy (fair comparisons)."""
    durations = {}
    for name in ("bsp", "asp"):
        r = Simulator(3, SpeedModel(seed=3, **STRAGGLY)).run(P.get(name), pushes=60)
        durations[name] = {(p.worker, p.step): p.end - p.start for p in r.log}
    common = durations["bsp"].keys() & durations["asp"].keys()
    assert len(common) >= 45
    assert all(durations["bsp"][k] == pytest.approx(durations["asp"][k]) for k in common)


def test_records_in_engine_format(tmp_path):
    r = Simulator(2, SpeedModel(seed=1)).run(P.get("bsp"), pushes=10)  # nothing granted past the limit
    r.write(str(tmp_path))
    lines = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    assert len(lines) == r.pushes == 10
    assert set(lines[0]) == {  # the documented metrics.jsonl line, as the engine writes it
        "time", "pushes", "updates", "samples", "worker", "step", "protocol", "batch_size", "start",
        "end", "compute_s", "samples_per_s", "loss", "mode", "round", "dropped", "version",
        "staleness", "lr"}
    assert [x["updates"] for x in lines] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # barrier after
    assert lines[-1]["samples"] == 10 * 32 and lines[0]["protocol"] == "bsp"
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["updates"] == 5 and summary["policy"]["name"] == "bsp"


def test_bsp_rounds_read_the_same_weights():
    r = Simulator(4, SpeedModel(seed=2, **STRAGGLY)).run(P.get("bsp"), pushes=400)
    by_step = {}
    for p in r.log:
        by_step.setdefault(p.step, set()).add(p.version)
    assert all(v == {k - 1} for k, v in by_step.items())  # round k reads the k-1 updates before it
    assert r.updates == r.pushes // 4 == 100 and r.staleness()["max"] == 0


@pytest.mark.parametrize("s", [0, 2])
def test_ssp_bound_on_recorded_schedule(s):
    r = Simulator(4, SpeedModel(seed=5, factors=[1, 1, 1, 4], **STRAGGLY)).run(
        P.get("ssp", staleness=s), pushes=600)
    arrivals = {}
    for p in r.log:
        arrivals.setdefault(p.worker, []).append(p.arrival)
    for p in r.log:  # when step k started, every worker had finished step k - s - 1
        slowest = min(sum(a <= p.start for a in arrivals[w]) for w in arrivals)
        assert p.step <= slowest + s + 1
    assert max(p.step for p in r.log) - min(len(a) for a in arrivals.values()) <= s + 1


def test_speed_models():
    sm = SpeedModel(fixed=0.0, per_sample=0.01, factors=[1, 3])
    assert sm.step_time(0, 10, 0.0) == pytest.approx(0.1)
    assert sm.step_time(1, 10, 0.0) == pytest.approx(0.3)
    sm = SpeedModel(fixed=1.0, per_sample=0.0, straggle_p=0.3, straggle_mean=5.0, straggle_std=0.1, seed=4)
    slow = [sm.step_time(0, 1, 0.0) > 3.0 for _ in range(4000)]
    assert abs(np.mean(slow) - 0.3) < 4 * np.sqrt(0.3 * 0.7 / 4000)
    with pytest.raises(ValueError, match="straggle_p"):
        SpeedModel(straggle_p=1.5)


def test_trace_driven_speed_follows_cpu_load():
    path = os.path.join(TRACES, "alibaba2018", "machine_usage.csv")
    if not os.path.exists(path):
        pytest.skip("needs ../shared/data/traces")
    traces = load_cpu_traces(path, gaps="hold")  # holes of up to 7 h: held, as before
    assert len(traces) == 8 and all(np.all(np.diff(t.times) >= 0) for t in traces)
    sm = SpeedModel(fixed=1.0, per_sample=0.0, traces=traces[:1])
    times = np.linspace(0, traces[0].times[-1], 500)
    util = np.array([traces[0].at(t) for t in times])
    step = np.array([sm.step_time(0, 1, t) for t in times])
    assert np.allclose(step, 1.0 / np.maximum(1 - util / 100, 0.05))
    busy, calm = util > np.quantile(util, 0.75), util < np.quantile(util, 0.25)
    assert step[busy].min() > step[calm].max()
    bitbrains = load_cpu_traces(os.path.join(TRACES, "bitbrains_rnd_2013-07"), limit=3, gaps="hold")
    assert len(bitbrains) == 3 and all(len(t.times) > 100 for t in bitbrains)


def test_a_policy_that_idles_everyone_is_an_error():
    class Stuck(Policy):
        name = "stuck"

        def on_push(self, push, view):
            return NOTHING

    with pytest.raises(PolicyError, match="left every worker idle"):
        Simulator(2).run(Stuck(), pushes=10)


def test_thousand_workers_schedule():
    r = Simulator(1000, SpeedModel(seed=1, jitter=0.1), record=False).run(P.get("ssp", staleness=2),
                                                                         pushes=20_000)
    assert r.pushes >= 20_000 and r.updates == r.pushes and not r.log


def _mlp(seed=0):
    d = np.load(SAMPLE)
    return NumpyMLP(d["x_train"], d["y_train"], d["x_test"], d["y_test"], hidden=32, seed=seed)


def test_bsp_training_matches_a_single_process_reference():
    """Two workers with batch sizes 16 and 48 under BSP: each round applies the
    batch-size-weighted mean gradient (LB-BSP eq. 8), as one process computes it."""
    sim_model, ref = _mlp(), _mlp()
    sim = Simulator(2, SpeedModel(seed=1, **STRAGGLY), model=sim_model, lr=0.1)
    rounds = sim.run(P.BSP(P.FixedSizer([16, 48])), pushes=20).updates
    assert rounds == 10  # the limit: the push that reaches it is not shown to the policy, as in the engine
    for _ in range(rounds):
        (g0, _), (g1, _) = ref.gradient(0, 16), ref.gradient(1, 48)
        ref.apply([(16 * a + 48 * b) / 64 for a, b in zip(g0, g1)], 0.1)
    for a, b in zip(sim_model.params, ref.params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_asp_training_learns_and_sees_staleness():
    sim = Simulator(4, SpeedModel(seed=1, **STRAGGLY), model=_mlp(), lr=0.05, eval_every=100)
    r = sim.run(P.get("asp"), pushes=1500)
    assert r.accuracy[0][2] < 0.3 and r.accuracy[-1][2] > 0.8
    assert r.staleness()["mean"] > 1 and all(p.mode is PushMode.APPLY for p in r.log)
    assert r.time_to_accuracy(0.8) is not None


def test_a_second_run_switches_protocol_and_continues():
    """ASP then BSP: the steps ASP granted ahead (its depth) run at the switch, as the
    engine runs them (tfsync.policy.ledger's drain rule), and nothing more."""
    sim = Simulator(3, SpeedModel(seed=1, **STRAGGLY))
    asp = P.get("asp")
    first = sim.run(asp, pushes=30)
    assert 30 < first.pushes <= 30 + asp.depth * 3 and sim.granted == sim.clocks
    second = sim.run(P.get("bsp"), pushes=60)
    assert second.pushes >= first.pushes + 60 and second.time > first.time
    steps = {w: [p.step for p in second.log if p.worker == w] for w in range(3)}
    assert all(s == list(range(1, len(s) + 1)) for s in steps.values())  # clocks continue
    modes = [p.mode for p in second.log]
    switch = modes.index(PushMode.AGGREGATE)
    assert switch == first.pushes
    assert set(modes[:switch]) == {PushMode.APPLY} and set(modes[switch:]) == {PushMode.AGGREGATE}
    assert second.updates == first.updates + (second.pushes - first.pushes) // 3


def test_removed_worker_finishes_its_step_outside_the_membership():
    """The slow worker 2 is removed while its first step runs (its push is then dropped:
    the round closed without it) and restored at round 5; rounds in between hold the
    members only."""
    class Shrink(P.BSP):
        def on_push(self, push, view):
            if view.pushes == 1:
                return P.Decision(remove={2})
            d = super().on_push(push, view)
            if d.barrier and view.round == 4:
                return P.Decision(self.grants_for([0, 1, 2], view), barrier=True, restore={2})
            return d

    r = Simulator(3, SpeedModel(seed=1, factors=[1, 1, 3])).run(Shrink(), pushes=40)
    rounds = {}
    for p in r.log:
        if not p.dropped:
            rounds.setdefault(p.round, []).append(p.worker)
    assert [p.worker for p in r.log if p.dropped] == [2]
    assert all(sorted(rounds[k]) == [0, 1] for k in range(0, 5))
    assert all(sorted(rounds[k]) == [0, 1, 2] for k in range(5, max(rounds)))


@pytest.mark.parametrize("hidden", [(), (7,), (6, 5, 4)])
def test_mlp_gradients_match_finite_differences(hidden):
    """Back-propagation through 0, 1 and 3 hidden layers (RLP §4 draws 0-3)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 9)).astype(np.float32), rng.integers(0, 4, 40)
    m = NumpyMLP(x, y, x, y, hidden=hidden, seed=1)
    m.params = [p.astype(np.float64) for p in m.params]
    m.x = m.x.astype(np.float64)
    m._batch = lambda worker, size: np.arange(size)  # every batch: examples 0..7
    grads, loss = m.gradient(0, 8)
    assert len(grads) == len(m.params) == 2 * (len(hidden) + 1)
    for k, (p, g) in enumerate(zip(m.params, grads)):
        idx = tuple(rng.integers(0, s) for s in p.shape)
        old = p[idx]
        p[idx] = old + 1e-5
        up = m.gradient(0, 8)[1]
        p[idx] = old - 1e-5
        down = m.gradient(0, 8)[1]
        p[idx] = old
        assert g[idx] == pytest.approx((up - down) / 2e-5, rel=1e-3, abs=1e-6), f"param {k}"


def test_a_coordinator_that_spends_time_on_each_push_caps_the_push_rate_at_its_own():
    """``coordinator_s``: the coordinator decides one push at a time, so 8 ASP workers of
    10 ms steps (800 pushes/s of demand) push at its rate, 1 / coordinator_s, where that
    is lower, and at their own where it is not; coordinator-closed BSP rounds wait for it
    too. Simulated
    time: nothing here depends on this machine."""
    def rate(protocol, coordinator_s, workers=8):
        speeds = SpeedModel(fixed=0.01, per_sample=0.0)
        r = Simulator(workers, speeds, coordinator_s=coordinator_s).run(P.get(protocol), pushes=4000)
        return r.pushes / r.time

    free = rate("asp", 0.0)
    assert free == pytest.approx(800, rel=0.02)
    assert rate("asp", 1 / 200) == pytest.approx(200, rel=0.05)   # the coordinator's rate
    assert rate("asp", 1 / 4000) == pytest.approx(free, rel=0.03)   # it keeps up
    # BSP on the coordinator: a round's barrier waits for its decisions on every push of the
    # round, and the next round's steps for the barrier: 8 pushes per 8 x 5 ms + 10 ms
    assert rate("bsp", 1 / 200) == pytest.approx(8 / (8 / 200 + 0.01), rel=0.02)
    assert rate("bsp", 0.0) == pytest.approx(800, rel=0.02)
    with pytest.raises(ValueError, match="coordinator_s"):
        Simulator(2, coordinator_s=-1.0)
