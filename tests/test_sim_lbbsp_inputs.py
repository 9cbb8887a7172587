"""What LB-BSP sees in the simulator (issue 19): resource readings as the engine's monitor
reports them, predictors trained inline so one seed gives one schedule, and one name for
the batch size across protocols."""

import math
import random

import numpy as np
import pytest

from helpers import check_imports_no_tensorflow, round_sizes
from tfsync import policy as P
from tfsync.policy import BSP
from tfsync.policy.lbbsp import LBBSP
from tfsync.predict import default_trainer
from tfsync.sim import CpuTrace, Simulator, SpeedModel

pytestmark = pytest.mark.unit


def traces(n=2, seconds=400, seed=0):
    """Utilisation that changes every trace second, up to 99 % (above 1 - min_share)."""
    rng = random.Random(seed)
    return [CpuTrace(f"t{i}", np.arange(seconds, dtype=float), np.array([rng.uniform(0, 99) for _ in range(seconds)]),
                     step=1.0) for i in range(n)]


class Recorder(BSP):
    """BSP that keeps (push, the reading of the pushing worker) at every push."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_push(self, push, view):
        self.seen.append((push, view.resources.get(push.worker)))
        return super().on_push(push, view)


def test_readings_are_the_traces_share_at_push_time():
    tr = traces()
    speeds = SpeedModel(fixed=0.05, per_sample=0.0, traces=tr, jitter=0.3, seed=3)
    rec = Recorder()
    Simulator(2, speeds, monitor_interval=0).run(rec, pushes=400)
    assert len(rec.seen) == 399  # every push but the one that ends the run (as in the engine)
    for push, reading in rec.seen:
        share = max(1 - tr[push.worker].at(push.arrival) / 100, 0.05)  # trace time = sim time here
        assert reading == {"cpu": pytest.approx(100 * (1 - share), abs=1e-9), "time": push.arrival}
    assert len({round(r["cpu"], 6) for _, r in rec.seen}) > 50  # it moves with the trace


def test_readings_have_the_engine_monitors_delay():
    """Default: a sample every simulated second, the mean over the second before it; a
    view shows the last one (none in the first second), as ResourceMonitor(1.0)."""
    tr = traces()
    rec = Recorder()
    Simulator(2, SpeedModel(fixed=0.05, per_sample=0.0, traces=tr, seed=3)).run(rec, pushes=400)
    early = [r for p, r in rec.seen if p.arrival < 1.0]
    assert early and all(r is None for r in early)
    for push, reading in rec.seen:
        if push.arrival >= 1.0:
            k = math.floor(push.arrival)  # the trace holds util[k - 1] over [k - 1, k)
            assert reading["time"] == pytest.approx(k)
            assert reading["cpu"] == pytest.approx(min(tr[push.worker].util[k - 1], 95.0))


def test_without_traces_nothing_contends():
    rec = Recorder()
    Simulator(3, SpeedModel(straggle_p=0.5, straggle_mean=0.2), monitor_interval=0).run(rec, pushes=30)
    assert [r["cpu"] for _, r in rec.seen] == [0.0] * len(rec.seen)


def test_one_seed_gives_one_lbbsp_narx_schedule():
    """NARX trains inline on the simulator's own trainer (not the process-wide background
    one), with seeded initialisation and shuffling: two runs are identical."""
    before = default_trainer().fits
    runs = []
    for _ in range(2):
        speeds = SpeedModel(fixed=0.0, per_sample=0.001, factors=[1, 2], traces=traces(seed=5), jitter=0.1, seed=7)
        policy = LBBSP(batch_size=32, predictor={"name": "narx", "warmup": 40, "retrain_every": 40}, min_gain=0.0)
        sim = Simulator(2, speeds, monitor_interval=0.05)
        result = sim.run(policy, updates=130)
        assert sim.trainer.fits >= 6 and all(p.using_model for p in policy.sizer.predictors.values())
        runs.append((round_sizes(result), [p.end for p in result.log]))
    assert runs[0] == runs[1]
    assert len({tuple(sorted(r.items())) for r in runs[0][0]}) > 20  # sizes do move
    assert default_trainer().fits == before  # the shared background trainer was not used


def test_bsp_and_lbbsp_take_the_same_batch_size_option():
    for name in ("bsp", "asp", "ssp", "lbbsp"):
        assert P.get(name, batch_size=48).sizer.batch_size == 48
        assert P.get({"name": name, "batch_size": 16}).sizer.batch_size == 16
    with pytest.raises(ValueError, match="give batch_size or sizer, not both"):
        P.get("bsp", batch_size=48, sizer=P.BatchSizer(8))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        P.get("ssp", batch_size=0)


def test_the_simulator_traces_and_offline_scoring_import_no_tensorflow():
    check_imports_no_tensorflow("tfsync.sim", "tfsync.base.traces", "tfsync.predict.score", "tfsync.cli.predict")
