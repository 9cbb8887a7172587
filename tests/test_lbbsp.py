"""LB-BSP as a policy (LB-BSP): on the simulator, with no TensorFlow."""

import json

import numpy as np
import pytest

from helpers import DATA, check_imports_no_tensorflow, round_sizes
from quota import QuotaSpeeds
from tfsync.batching import GpuProfile
from tfsync.batching.guard import MIN_BASELINE, WARMUP
from tfsync.policy import BSP, ClusterView, FixedSizer, Push, PushMode
from tfsync.policy.lbbsp import LBBSP, LBBSPSizer, resource_reading
from tfsync.predict import NarxTrainer, Predictor
from tfsync.sim import Simulator, SpeedModel
from tfsync.sim.model import NumpyMLP

pytestmark = pytest.mark.unit


def test_fast_worker_gets_three_times_the_batch_and_rounds_get_faster():
    speeds = dict(fixed=0.0, per_sample=0.001, factors=[1, 3], jitter=0.05, seed=1)
    lb = Simulator(2, SpeedModel(**speeds)).run(LBBSP(batch_size=32), updates=60)
    bsp = Simulator(2, SpeedModel(**speeds)).run(BSP(), updates=60)
    rounds = round_sizes(lb)
    first = WARMUP + MIN_BASELINE   # BSP's equal split first: the guard's baseline, after a warm-up
    assert rounds[:first] == [{0: 32, 1: 32}] * first
    assert all(sum(r.values()) == 64 for r in rounds)  # X = n * batch_size every round
    ratios = [r[0] / r[1] for r in rounds[first:]]
    assert all(2.5 <= q <= 3.6 for q in ratios), ratios
    assert lb.samples == 64 * lb.updates == bsp.samples  # same progress per update as BSP
    assert lb.time / lb.updates < 0.6 * bsp.time / bsp.updates  # ideal: 48/96 of BSP's round


def test_the_affine_model_reaches_equal_times_where_part_of_a_step_does_not_shrink_with_the_batch():
    """Step time (0.01 + 0.001 x) * factor: worker 1's fixed part is 3x worker 0's. Equal
    times need x = (53, 11); the proportional rule (t = x / v) over-predicts what a smaller
    batch saves, so it creeps towards them and stops short inside its hysteresis."""
    speeds = dict(fixed=0.01, per_sample=0.001, factors=[1, 3])
    runs = {m: Simulator(2, SpeedModel(**speeds)).run(LBBSP(batch_size=32, model=m), updates=40)
            for m in ("proportional", "affine")}
    affine, proportional = (round_sizes(runs[m]) for m in ("affine", "proportional"))
    assert affine[-10:] == [{0: 53, 1: 11}] * 10
    assert all(r[1] >= 12 for r in proportional[-10:])
    assert runs["affine"].time < 0.97 * runs["proportional"].time
    with pytest.raises(ValueError, match="LB-BSP model 'cubic': give one of proportional, affine"):
        LBBSP(model="cubic")
    with pytest.raises(ValueError, match="model 'affine' is for the CPU rule"):
        LBBSP(model="affine", profiles=[GpuProfile(0.01, 0.001)] * 2)


def test_same_sizes_give_the_same_model_as_bsp_weighted_aggregation():
    """LB-BSP is BSP with other sizes: once it picks (48, 16), training is identical to
    BSP run with FixedSizer([48, 16]), weighted mean included (LB-BSP eq. 8)."""
    d = np.load(DATA)

    def model():
        return NumpyMLP(d["x_train"][:2000], d["y_train"][:2000], d["x_test"][:200], d["y_test"][:200],
                        hidden=16, seed=3)

    speeds = dict(fixed=0.0, per_sample=0.001, factors=[1, 3])
    lb = LBBSP(batch_size=32, guard=False)   # (the guard would run 3 rounds at the even split first)
    view = ClusterView(2, (0, 0), (0, 0))
    for w, speed in ((0, 3000.0), (1, 1000.0)):  # prime the predictors: worker 0 is 3x faster
        lb.sizer.observe(Push(w, 1, 30, 0.0, 30 / speed, 0.0, 0.0, PushMode.AGGREGATE), view)
    m_lb, m_bsp = model(), model()
    r_lb = Simulator(2, SpeedModel(**speeds), model=m_lb).run(lb, updates=20)
    r_bsp = Simulator(2, SpeedModel(**speeds), model=m_bsp).run(BSP(FixedSizer([48, 16])), updates=20)
    assert r_lb.samples == r_bsp.samples == 64 * r_lb.updates
    assert all(r == {0: 48, 1: 16} for r in round_sizes(r_lb))
    for a, b in zip(m_lb.params, m_bsp.params):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(m_lb.params[0], model().params[0])  # it did train


def test_non_blocking_lags_one_round():
    speeds = SpeedModel(fixed=0.0, factors=[1, 3])
    blocking = round_sizes(Simulator(2, speeds).run(LBBSP(batch_size=32, guard=False), updates=4))
    lagged = round_sizes(Simulator(2, speeds).run(LBBSP(batch_size=32, blocking=False, guard=False), updates=4))
    assert blocking[:3] == [{0: 32, 1: 32}, {0: 48, 1: 16}, {0: 48, 1: 16}]
    assert lagged[:3] == [{0: 32, 1: 32}, {0: 32, 1: 32}, {0: 48, 1: 16}]


def fake_push(worker, batch, seconds):
    return Push(worker, 1, batch, 0.0, seconds, seconds, 0.0, PushMode.AGGREGATE)


def test_background_plan_is_used_when_ready_and_never_waited_for():
    sizer = LBBSPSizer(32, blocking=False, background=True, guard=False)
    view = ClusterView(2, (1, 1), (1, 1))
    try:
        for w, t in ((0, 0.01), (1, 0.03)):
            sizer.observe(fake_push(w, 32, t), view)
        assert sizer.sizes(view) == {0: 32, 1: 32}  # the first round: equal split
        sizer.settle(timeout=10)
        assert sizer.sizes(view) == {0: 48, 1: 16}  # the plan made in the background
    finally:
        sizer.close()


def test_gpu_profiles_size_by_the_linear_program_and_estimate_comm():
    # step time (0.01 + 0.001 x) * factor + comm: profiles m = 0.001 f, b = 0.01 f
    profiles = [GpuProfile(0.001, 0.01, 1, None), GpuProfile(0.003, 0.03, 1, None)]
    policy = LBBSP(batch_size=32, profiles=profiles, guard=False)   # (the rule from the first barrier on)
    sim = Simulator(2, SpeedModel(fixed=0.01, per_sample=0.001, factors=[1, 3]), comm=0.05)
    r = sim.run(policy, updates=10)
    assert round_sizes(r)[1:] and all(s == {0: 53, 1: 11} for s in round_sizes(r)[1:])
    assert policy.sizer.comm[0].predict() == pytest.approx(0.05, abs=1e-6)
    with pytest.raises(ValueError, match="not for \\[2\\]"):
        Simulator(3, SpeedModel()).run(LBBSP(profiles=profiles), updates=3)


class Recorder(Predictor):
    name = "recorder"

    def __init__(self):
        super().__init__()
        self.calls = []

    def _update(self, speed, cpu, mem):
        self.calls.append((speed, cpu, mem))

    def _predict(self):
        return self.calls[-1][0]


def test_observations_carry_speed_and_resources_to_the_predictors():
    sizer = LBBSPSizer(16, Recorder)

    class Usage:  # the hook's NodeUsage names
        cpu_percent, memory_percent = 75.0, 40.0

    view = ClusterView(3, (1, 1, 1), (1, 1, 1), resources={0: {"cpu": 50, "mem": 20}, 1: Usage()})
    for w in range(3):
        sizer.observe(fake_push(w, 16, 0.5), view)
    assert sizer.predictors[0].calls == [(32.0, 50.0, 20.0)]
    assert sizer.predictors[1].calls == [(32.0, 75.0, 40.0)]
    assert sizer.predictors[2].calls == [(32.0, None, None)]
    sizer.observe(fake_push(0, 16, 0.0), view)  # no compute time: no speed, not recorded
    assert len(sizer.predictors[0].calls) == 1
    # a step that began late (ready at 10.0, on the worker 0.5 s, arrived at 12.0): its turnaround counts
    sizer.observe(Push(1, 2, 16, 11.5, 12.0, 12.0, 0.0, PushMode.AGGREGATE, ready_at=10.0), view)
    assert sizer.predictors[1].calls[-1] == (8.0, 75.0, 40.0)
    assert resource_reading(None) == (None, None)


def test_each_worker_is_predicted_at_its_own_push_so_the_barrier_predicts_nothing():
    class Counting(Recorder):
        predicts = 0

        def _predict(self):
            Counting.predicts += 1
            return super()._predict()

    sizer = LBBSPSizer(16, Counting, min_gain=0, max_change=0, guard=False)
    view = ClusterView(3, (1, 1, 1), (1, 1, 1))
    for w, t in ((0, 0.5), (1, 0.25), (2, 1.0)):
        sizer.observe(fake_push(w, 16, t), view)
    assert Counting.predicts == 3  # one per push, made when it was observed
    assert sizer.sizes(view) == {0: 14, 1: 27, 2: 7}  # 48 split as speeds 32 : 64 : 16
    assert Counting.predicts == 3  # the barrier only ran the rule


def test_stats_report_sizing_time_and_errors_are_clear():
    policy = LBBSP(batch_size=8)
    Simulator(4, SpeedModel(factors=[1, 2, 3, 4])).run(policy, updates=20)
    s = policy.stats()
    assert s["decisions"] == 21 and 0 < s["sizing_ms_mean"] <= s["sizing_ms_max"]
    assert 0 < s["share"] <= 1 and sum(s["sizes"].values()) == 32
    assert policy.describe()["sizer"]["predictor"] == "ema"
    narx = LBBSP(predictor={"name": "narx", "trainer": NarxTrainer(threads=0)})
    assert json.loads(json.dumps(narx.describe()))["sizer"]["predictor"] == {"name": "narx",
                                                                            "trainer": "NarxTrainer"}
    with pytest.raises(ValueError, match="LBBSP needs an LBBSPSizer"):
        LBBSP(sizer=FixedSizer([1, 2]))
    with pytest.raises(ValueError, match="unknown predictor 'magic'"):
        LBBSP(predictor="magic")


def test_policy_predictors_and_sizing_import_no_tensorflow():
    check_imports_no_tensorflow("tfsync.policy.lbbsp", "tfsync.predict", "tfsync.batching", "tfsync.inject")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_worker_slowed_for_a_while_is_never_starved_and_gets_its_share_back(seed):
    """Issue 54: steps with a fixed part (3.5 ms, the pull and push) and 0.04 ms a sample,
    15 % noise; worker 1 three times slower for 100 rounds, then as fast as the others. A
    small batch looks slow per sample there, and LB-BSP used to keep a worker it had
    shrunk at 1 long after it was fast again. Now: never below a quarter of the even
    split, back to within 10 % of it within 80 rounds of the slowdown's end (under a
    second of these steps), and within 15 % on average after (the floor off: starved at
    1, as before)."""
    def run(**options):
        noise = dict(fixed=0.0035, per_sample=0.00004, jitter=0.15, seed=seed)
        sim, policy = Simulator(3, SpeedModel(factors=[1, 3, 1], **noise)), LBBSP(batch_size=32, **options)
        sim.run(policy, updates=100)
        sim.speeds = SpeedModel(factors=[1, 1, 1], **noise)
        return round_sizes(sim.run(policy, updates=200))

    rounds = run()
    assert min(r[w] for r in rounds for w in r) >= 8 and all(sum(r.values()) == 96 for r in rounds)
    assert any(r[1] >= 0.9 * 32 for r in rounds[100:180])
    for w in range(3):
        assert abs(np.mean([r[w] for r in rounds[180:]]) / 32 - 1) < 0.15
    assert min(r[1] for r in run(floor=0.0)) == 1   # the trap the floor keeps it out of


@pytest.mark.parametrize("seed", [1, 2])
def test_sizes_that_make_rounds_slower_than_the_even_split_are_dropped(seed):
    """Issue 54: four alike workers under a CPU quota, 15 % step noise. The noise looks like
    speed, and LB-BSP's sizes put a worker over the quota's cliff: every round 2.7x BSP's.
    The guard measures each trial's rounds against the even split's, drops the sizes and
    tries again ever later: within 10 % of BSP over 400 rounds. Where a worker really is 3x
    slower, the sizes pay and are kept."""
    noise = dict(fixed=0.0035, per_sample=0.0004, jitter=0.15, seed=seed)
    bsp = Simulator(4, QuotaSpeeds(**noise)).run(BSP(FixedSizer([64] * 4)), updates=400)
    guarded, policy = Simulator(4, QuotaSpeeds(**noise)), LBBSP(batch_size=64)
    guarded = guarded.run(policy, updates=400)
    blind = Simulator(4, QuotaSpeeds(**noise)).run(LBBSP(batch_size=64, guard=False), updates=400)
    assert blind.time > 2 * bsp.time   # the trap
    assert guarded.time < 1.1 * bsp.time
    checks = policy.stats()["guard_checks"]
    assert checks and not any(c["kept"] for c in checks)
    assert [c["round"] for c in checks] == sorted(c["round"] for c in checks)
    gaps = np.diff([c["round"] for c in checks])
    assert all(b > a for a, b in zip(gaps, gaps[1:]))   # ever later: the hold doubles
    uneven = dict(noise, factors=[1, 3, 1, 1])
    slow = Simulator(4, SpeedModel(**uneven)).run(BSP(FixedSizer([64] * 4)), updates=400)
    policy = LBBSP(batch_size=64)
    balanced = Simulator(4, SpeedModel(**uneven)).run(policy, updates=400)
    assert balanced.time < 0.6 * slow.time
    assert policy.stats()["guard_checks"] and all(c["kept"] for c in policy.stats()["guard_checks"])


@pytest.mark.parametrize("seed", [1, 2])
def test_sizes_kept_are_checked_again_and_dropped_once_they_no_longer_pay(seed):
    """A worker 3x slower: the sizes pay (half BSP's time) and are kept. Then the workers are
    alike under a CPU quota's cliff, and noise keeps LB-BSP's sizes uneven (2.7x BSP's
    rounds without the guard). A probe of the even split, due a doubling number of rounds
    after the sizes were last kept (or at once, where they moved far from those kept), finds
    it faster: the even split holds, within 20 % of BSP (each check spans a second of rounds
    at least)."""
    noise = dict(fixed=0.0035, per_sample=0.0004, jitter=0.15, seed=seed)
    times = {}
    for name, policy in (("bsp", BSP(FixedSizer([64] * 4))), ("guarded", LBBSP(batch_size=64)),
                         ("blind", LBBSP(batch_size=64, guard=False))):
        sim = Simulator(4, SpeedModel(factors=[1, 3, 1, 1], **noise))
        sim.run(policy, updates=200)
        slow = sim.now
        sim.speeds = QuotaSpeeds(**noise)
        sim.run(policy, updates=600)
        times[name] = (slow, sim.now - slow)
        if name == "guarded":
            checks = policy.stats()["guard_checks"]
    assert times["guarded"][0] < 0.6 * times["bsp"][0]
    assert times["blind"][1] > 2 * times["bsp"][1] and times["guarded"][1] < 1.2 * times["bsp"][1], times
    first_drop = next(i for i, c in enumerate(checks) if not c["kept"])
    assert checks[0]["kind"] == "trial" and all(c["kind"] == "probe" for c in checks[1:first_drop + 1])
    assert checks[first_drop]["round"] > 200   # kept while the worker was slow, dropped after


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_alike_workers_keep_the_even_split(seed):
    """Issue 54: four alike workers, 15 % step noise. LB-BSP's predictions differ by noise
    and its sizes leave the even split; the guard keeps none of them (a gain must beat the
    noise between the two means, not only a fixed margin: seed 2 kept a 3.6 % "gain"), and
    failed trials take few rounds: at least 95 % of them have every batch within 15 % of
    the even split."""
    noise = dict(fixed=0.0035, per_sample=0.0004, jitter=0.15, seed=seed)
    policy = LBBSP(batch_size=64)
    rounds = round_sizes(Simulator(4, SpeedModel(factors=[1, 1, 1, 1], **noise)).run(policy, updates=1000))
    checks = policy.stats()["guard_checks"]
    assert checks and not any(c["kept"] for c in checks)
    even = [all(abs(r[w] / 64 - 1) <= 0.15 for w in r) for r in rounds]
    assert np.mean(even) >= 0.95


def test_no_batch_above_twice_the_even_one_unless_asked():
    """Every step's input holds ``hi`` rows (the step takes the first ``batch``), so the
    input pipeline's work grows with it: by default, with the CPU rule, no batch above
    twice the even one (8 workers of 64 read 505 rows a step before, and LB-BSP ran 1.35x
    BSP's time per update on the testbed at the even split). A worker four times faster
    than the other three would take 2.3x: it is capped, the rounds still total X; with
    ``hi`` set higher it gets its share."""
    speeds = dict(fixed=0.0, per_sample=0.001, factors=[1, 4, 4, 4], jitter=0.02, seed=1)
    capped = round_sizes(Simulator(4, SpeedModel(**speeds)).run(LBBSP(batch_size=32, guard=False), updates=40))
    assert max(r[0] for r in capped) == 64 and all(sum(r.values()) == 128 for r in capped)
    assert LBBSP(batch_size=32).max_batch(8) == 64
    free = round_sizes(Simulator(4, SpeedModel(**speeds)).run(LBBSP(batch_size=32, hi=96, guard=False), updates=40))
    assert max(r[0] for r in free[-10:]) > 64
