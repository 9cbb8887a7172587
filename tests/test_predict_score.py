"""`tfsync predict score` (issue 19): offline one-step-ahead RMSE on a recorded series equals
what LB-BSP's predictors scored online; traces score deterministically; bad input is one
line and exit 2."""

import csv
import math
import random
import signal

import numpy as np
import pytest

from tfsync.cli import main
from tfsync.policy.lbbsp import LBBSP
from tfsync.predict import NarxTrainer, Predictor, get
from tfsync.sim import CpuTrace, Simulator, SpeedModel

pytestmark = pytest.mark.unit


def tfsync(*argv) -> int:
    """``tfsync ARGV`` in this process, through the command line's one error handler."""
    saved = signal.getsignal(signal.SIGTERM)
    try:
        return main(list(argv))
    finally:
        signal.signal(signal.SIGTERM, saved)


class Recording(Predictor):
    """Wraps a predictor; keeps (speed, cpu, mem, its prediction made before this step)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.log = inner, []

    def update(self, speed, cpu=None, mem=None):
        before = self.inner.predict() if self.inner.count else math.nan
        self.log.append((speed, cpu, mem, before))
        self.inner.update(speed, cpu, mem)
        self.count = self.inner.count

    def predict(self):
        return self.inner.predict()


def record_online(name: str, options: dict, updates: int = 120):
    """An LB-BSP run in the simulator under CPU traces: {worker: Recording}."""
    rng = random.Random(1)
    traces = [CpuTrace(f"t{i}", np.arange(300.0), np.array([rng.uniform(0, 90) for _ in range(300)]), step=1.0)
              for i in range(2)]
    speeds = SpeedModel(fixed=0.0, per_sample=0.002, factors=[1, 2], traces=traces, jitter=0.1, seed=2)
    policy = LBBSP(batch_size=32, predictor=lambda: Recording(get(name, **options)))
    Simulator(2, speeds, monitor_interval=0.1).run(policy, updates=updates)
    return policy.sizer.predictors


@pytest.mark.parametrize("spec, options, cli", [
    ("ema", {"alpha": 0.2}, []),
    ("arima", {"order": (2, 2, 1)}, []),
    ("narx", {"warmup": 30}, ["--warmup", "30"]),
])
def test_offline_scoring_of_a_recorded_series_reproduces_the_online_rmse(tmp_path, spec, options, cli):
    skip = 40
    online = record_online(spec, options)
    path, out = tmp_path / "series.csv", tmp_path / "score.csv"
    with open(path, "w", newline="") as f:  # the documented series: worker, step, speed, cpu, mem
        w = csv.writer(f)
        w.writerow(["worker", "step", "speed", "cpu", "mem"])
        for worker, rec in sorted(online.items()):
            for k, (speed, cpu, mem, _) in enumerate(rec.log):
                w.writerow([worker, k, repr(speed), "" if cpu is None else repr(cpu), "" if mem is None else repr(mem)])
    errors = {w: np.array([p - s for s, _, _, p in rec.log[skip:]]) for w, rec in online.items()}
    cpus = [c for rec in online.values() for _, c, _, _ in rec.log if c is not None]
    assert len(set(cpus)) > 20 and max(cpus) > 50  # the simulator's readings reached the predictors

    assert tfsync("predict", "score", str(path), "--predictors", spec, "--skip", str(skip), "--csv", str(out),
                  *cli) == 0
    rows = {r["worker"]: r for r in csv.DictReader(open(out))}
    for w, e in errors.items():
        assert float(rows[str(w)]["rmse"]) == pytest.approx(np.sqrt(np.mean(e ** 2)), rel=1e-5)
        assert int(rows[str(w)]["steps"]) == len(e)
    pooled = np.concatenate(list(errors.values()))
    assert float(rows["all"]["rmse"]) == pytest.approx(np.sqrt(np.mean(pooled ** 2)), rel=1e-5)
    if spec == "narx":
        assert all(rec.inner.fits >= 2 for rec in online.values())
        assert int(rows["all"]["fits"]) == sum(rec.inner.fits for rec in online.values())


def test_a_trace_scores_the_same_every_time(tmp_path, capsys):
    trace = tmp_path / "trace.csv"
    rng = random.Random(3)
    trace.write_text("time,util\n" + "".join(f"{10 * k},{rng.uniform(0, 95):.1f}\n" for k in range(400)))
    outs = []
    for i in range(2):
        out = tmp_path / f"score{i}.csv"
        assert tfsync("predict", "score", str(trace), "--predictors", "last", "ema", "--skip", "50",
                      "--csv", str(out)) == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1]
    rows = list(csv.DictReader(outs[0].splitlines()))
    assert [r["predictor"] for r in rows] == ["last", "last", "ema", "ema"] and rows[1]["steps"] == "350"
    assert float(rows[3]["ratio_to_ema"]) == 1.0 and float(rows[1]["ratio_to_ema"]) > 1.0
    assert "ema" in capsys.readouterr().out


@pytest.mark.parametrize("text, args, message", [
    ("worker,speed\n0,10\n0,abc\n", [], ":3: speed 'abc' is not a number"),
    ("host,load\nx,1\n", [], ":1: the header names none of the trace formats' columns"),
    ("time,util\n0,10\n10,20\n20,20\n500,30\n", [], ":5: trace 'bad.csv' has no sample for 480 s"),
    ("speed\n1\n2\n", ["--predictors", "narks"], "unknown predictor 'narks'; valid:"),
    ("speed\n1\n2\n", ["--skip", "5"], "worker(s) [0] have 2 steps or fewer, nothing to score from step 5"),
])
def test_a_bad_file_is_one_line_and_exit_2(tmp_path, capsys, text, args, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    assert tfsync("predict", "score", str(path), *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfsync: error: ") and message in err and err.count("\n") == 1, err
    assert tfsync("predict", "score", str(tmp_path / "missing.csv")) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_plot_is_written(tmp_path, capsys):
    path, png = tmp_path / "s.csv", tmp_path / "s.png"
    path.write_text("speed\n" + "".join(f"{100 + k % 7}\n" for k in range(30)))
    assert tfsync("predict", "score", str(path), "--predictors", "ema", "--skip", "5", "--plot", str(png)) == 0
    assert png.stat().st_size > 1000 and f"wrote {png}" in capsys.readouterr().out


def test_narx_study_options_longer_look_back_and_the_residual_over_ema():
    """Issue 19's candidates: ``lookback`` L (3L + 2 inputs) and ``baseline="ema"`` (the network
    learns what EMA misses; before its first fit, and with zero output, it is EMA)."""
    rng = np.random.default_rng(4)
    cpu = np.repeat(rng.uniform(0, 90, 40), 5)
    speed = 1000 * (1 - cpu / 100) * np.exp(rng.normal(0, 0.02, len(cpu)))
    trainer = NarxTrainer(threads=0, epochs=40, min_epochs=5)
    p = get("narx", lookback=4, baseline="ema", warmup=100, retrain_every=1000, trainer=trainer)
    for k in range(120):
        p.update(speed[k], cpu[k], None)
    assert p.using_model and p.fits == 1 and len(p.weights["x_mean"]) == 3 * 4 + 2 + 1
    assert p.describe()["baseline"] == "ema" and p.describe()["lookback"] == 4
    zero = {**p.weights, "weights": [w * 0 for w in p.weights["weights"]], "y_mean": 0.0}
    same = get("narx", lookback=4, baseline="ema", weights=zero, min_train=1000, window=1000)
    for k in range(10):
        same.update(speed[k], cpu[k], None)
    assert same.using_model and same.predict() == pytest.approx(same.ema.predict())
    with pytest.raises(ValueError, match="baseline 'ema' and 15 inputs, this one has baseline 'last' and 8"):
        get("narx", weights=p.weights)
    with pytest.raises(ValueError, match="baseline must be 'last'"):
        get("narx", baseline="mean")
    with pytest.raises(ValueError, match="lookback must be >= 1"):
        get("narx", lookback=0)
