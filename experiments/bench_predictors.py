"""Issue-4 benchmark: LB-BSP Table 3 for tfsync's worker-speed predictors (§3.2.1, §5.4).

Records real per-worker speed series, then predicts them one step ahead with every
predictor and reports RMSE (samples/s) and the NARX / EMA ratio (target <= 0.6).

Recording: the local cluster (2 workers + 1 PS, real Engine via tfsync.cli.jobrun, BSP,
MNIST) trains for --seconds. Worker i's task process is pinned to CPU i (of this
process's CPUs) and a CpuBurner on worker 1's CPU replays a CPU trace (TraceDriver,
duty = util / 100, time-compressed --time-scale times so the load changes within the
run): a competing process that comes and goes, as in the paper's emulated production
cluster (§5.3). A ResourceMonitor samples the workers' CPU / memory alongside. Each
step gives speed = batch_size / (end - start) (metrics.jsonl) and the last monitor
reading taken before the step ended (what the next step starts with, eq. 4).
The series is saved as CSV; ``--series FILE`` re-runs only the evaluation, and
``tfsync predict score FILE`` scores it with the same loop (tfsync.predict.score).

Evaluation: one fresh predictor per worker fed the worker's series in order; before
each step its prediction is kept. RMSE counts steps from --skip on (default 500, the
NARX warm-up of §4.2, so every predictor is scored on the same steps). Paper
configurations: EMA alpha 0.2, ARIMA (2, 2, 1), SimpleRNN / LSTM / NARX look-back 2,
NARX warm-up 500 and early stopping 1e-4 x 4 epochs; learned models are trained inline
(deterministic). NARX is also scored with the monitor's other CPU figures (``proc_cpu``,
``set_cpu``) in place of its contention figure ``cpu`` (tfsync.engine.resources).
Writes <out>/bench_predictors.csv, bench_predictors.png and bench_predictors_series.csv.

    OPENBLAS_NUM_THREADS=1 python experiments/bench_predictors.py --seconds 480
    OPENBLAS_NUM_THREADS=1 python experiments/bench_predictors.py --series results/bench_predictors_series.csv
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import math
import os
import shutil
import sys
import threading
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import psutil  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))
from tfsync.base.taskcmd import task_of_name  # noqa: E402
from tfsync.engine.commands import Command, Controller  # noqa: E402
from tfsync.engine.resources import ResourceMonitor  # noqa: E402

TRACE = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "data", "traces", "alibaba2018",
                                      "machine_usage.csv"))
# (label, predictor name, options, configuration as in Table 3, cpu figure fed)
PREDICTORS = [
    ("Memoryless", "last", {}, "-", "cpu"),
    ("EMA", "ema", {"alpha": 0.2}, "alpha=0.2", "cpu"),
    ("ARIMA", "arima", {"order": (2, 2, 1)}, "(p,d,q)=(2,2,1)", "cpu"),
    ("SimpleRNN", "rnn", {}, "look-back=2", "cpu"),
    ("LSTM", "lstm", {}, "look-back=2", "cpu"),
    ("NARX", "narx", {"fit": "adam"}, "look-back=2, contention cpu %, Keras Adam fit", "cpu"),
    ("NARX (L-BFGS)", "narx", {"fit": "lbfgs"}, "look-back=2, contention cpu %, L-BFGS fit", "cpu"),
    ("NARX (proc_cpu)", "narx", {"fit": "adam"}, "look-back=2, process CPU %", "proc_cpu"),
    ("NARX (set_cpu)", "narx", {"fit": "adam"}, "look-back=2, busy % of its CPUs", "set_cpu"),
]
SERIES_FIELDS = ["worker", "step", "start", "end", "batch_size", "speed", "cpu", "mem", "proc_cpu",
                 "set_cpu", "burner_duty"]


# -- shared by the issue-4 cluster benchmarks ------------------------------------------------
def cpu_of(worker: int) -> int:
    """The CPU worker ``worker`` is pinned to: i % (CPUs this process may use)."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[worker % len(cpus)]


class WorkerPinner:
    """Pins each worker task process this process starts (named ``tfsync-worker<i>``) to ``cpu_of(i)`` as soon as it appears, every thread of it
    (``os.sched_setaffinity`` sets one thread; threads started later inherit it), and
    calls ``on_pids({worker: pid})`` when the set of live workers changes."""

    def __init__(self, on_pids=None, poll: float = 0.05):
        self.on_pids, self.poll = on_pids, poll
        self.pids: dict[int, int] = {}
        self._seen: dict[int, float] = {}  # pid -> monotonic time first pinned
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "WorkerPinner":
        self._thread = threading.Thread(target=self._loop, name="bench-pinner", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _loop(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.poll):
            live = {}
            for child in me.children(recursive=True):   # forked by a fork server, or not
                try:
                    task = task_of_name(child.name())
                except psutil.Error:
                    continue
                if task is None or task[0] != "worker":
                    continue  # a burner, a fork server, or a task not yet named
                i = task[1]
                live[i] = child.pid
                first = self._seen.setdefault(child.pid, time.monotonic())
                if time.monotonic() - first < 5.0:  # again for 5 s: threads started meanwhile
                    pin_process(child.pid, {cpu_of(i)})
            if live != self.pids:
                self.pids = live
                if self.on_pids is not None:
                    self.on_pids(dict(live))


def pin_process(pid: int, cpus: set[int]) -> None:
    """``os.sched_setaffinity`` on every thread of ``pid`` (threads may come and go)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            if os.sched_getaffinity(int(tid)) != cpus:
                os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread ended meanwhile
            pass


class Deadline(Controller):
    """Stops the run ``seconds`` after its first push (and calls ``on_first`` then)."""

    def __init__(self, seconds: float, on_first=None):
        self.seconds, self.on_first = float(seconds), on_first
        self.end: float | None = None
        self.sent = False

    def record(self, record: dict) -> None:
        if self.end is None:
            self.end = time.monotonic() + self.seconds
            if self.on_first is not None:
                self.on_first()

    def commands(self) -> list[Command]:
        if self.end is not None and not self.sent and time.monotonic() >= self.end:
            self.sent = True
            return [Command("deadline", "stop", save=False)]
        return []


def job_config(name: str, run_dir: str, protocol: dict, *, model: str, batch_size: int, samples: float,
               lr: float, workers: int = 2, seed: int = 0):
    """A JobConfig for tfsync.cli.jobrun.run_job (its model, data and lr rules are reused)."""
    from tfsync.job.config import JobConfig

    return JobConfig.from_dict({
        "job": {"name": name, "run_dir": run_dir, "seed": seed}, "cluster": {"workers": workers},
        "model": {"name": model},
        "train": {"batch_size": batch_size, "learning_rate": lr, "epochs": samples / 60000.0,
                  "checkpoint_every": 0},
        "protocol": [protocol]})


def read_pushes(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "worker" in r]


def progress_printer(every: float = 10.0, extra=lambda: ""):
    """A run_job progress callback printing pushes and samples/s every ``every`` s."""
    state = {"next": time.monotonic() + every}

    def progress(engine, policy, total):
        if time.monotonic() >= state["next"]:
            state["next"] = time.monotonic() + every
            s = engine.ledger
            print(f"    {policy.name}: {s.pushes} pushes, {s.samples} samples {extra()}", flush=True)
    return progress


# -- recording ---------------------------------------------------------------------------------
def record(args, run_dir: str) -> list[dict]:
    from tfsync.inject import CpuBurner, TraceDriver, load_trace_csv
    from tfsync.cli.jobrun import run_job

    trace = load_trace_csv(args.trace, args.trace_index, gaps="hold", wrap=True)  # as before issue 19
    driver = TraceDriver(CpuBurner(0.0, cpus={cpu_of(1)}, processes=args.burners), trace,
                         time_scale=args.time_scale)
    readings: list[tuple[int, dict]] = []
    monitor = ResourceMonitor(interval=args.monitor_interval,
                              on_sample=lambda r: readings.extend(r.items()))
    pinner = WorkerPinner(on_pids=monitor.set_pids)
    started = {}

    def first_push():  # the trace starts with training, not with the cluster's start-up
        started["wall"] = time.time()
        driver.start()

    cfg = job_config("bench_predictors", run_dir, {"name": "bsp"}, model=args.model,
                     batch_size=args.batch_size, samples=1e9, lr=args.lr)
    print(f"recording {args.seconds:.0f} s: {args.model}, 2 workers (CPUs {cpu_of(0)}, {cpu_of(1)}) + 1 PS, "
          f"BSP, B={args.batch_size}; {args.burners} burner(s) on CPU {cpu_of(1)} replaying {trace.name} "
          f"x{args.time_scale:g}", flush=True)
    try:
        pinner.start()
        monitor.start()
        summary = run_job(cfg, progress=progress_printer(extra=lambda: f"(burner duty {driver.burner.duty:.2f})"),
                          data_path=args.data, controller=Deadline(args.seconds, first_push))
    finally:
        driver.stop()
        monitor.stop()
        pinner.stop()
    print(f"  {summary['pushes']} pushes in {summary['wall_s']:.0f} s (start-up {summary['init_s']:.0f} s)")
    t0 = started.get("wall", 0.0)
    duty_t = [t0 + e for e, _ in driver.history]
    duty_v = [d for _, d in driver.history]
    by_worker: dict[int, list[dict]] = {}
    for w, r in readings:
        by_worker.setdefault(w, []).append(r)
    times = {w: [r["time"] for r in rs] for w, rs in by_worker.items()}
    rows = []
    for p in read_pushes(run_dir):
        if p["end"] <= p["start"] or p["batch_size"] <= 0:
            continue
        i = bisect.bisect_right(times.get(p["worker"], []), p["end"]) - 1  # last reading before the end
        r = by_worker[p["worker"]][i] if i >= 0 else {}
        j = bisect.bisect_right(duty_t, p["end"]) - 1
        rows.append({"worker": p["worker"], "step": p["step"], "start": p["start"], "end": p["end"],
                     "batch_size": p["batch_size"], "speed": p["batch_size"] / (p["end"] - p["start"]),
                     **{k: r.get(k, "") for k in ("cpu", "mem", "proc_cpu", "set_cpu")},
                     "burner_duty": duty_v[j] if j >= 0 else 0.0})
    return rows


def write_series(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SERIES_FIELDS)
        w.writeheader()
        w.writerows(rows)


def load_series(path: str) -> list[dict]:
    """This script's series, or any series ``tfsync predict score`` reads (a header with
    ``speed``; worker, step, cpu, mem optional): absent columns read as empty."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "speed" not in rows[0]:
        raise SystemExit(f"{path}: not a series (no rows, or no 'speed' column)")
    num = lambda v: float(v) if v not in ("", None) else None  # noqa: E731
    out = []
    for i, r in enumerate(rows):
        d = {k: num(r.get(k)) for k in SERIES_FIELDS}
        d["worker"] = int(d["worker"] or 0)
        d["step"] = int(d["step"]) if d["step"] is not None else i
        out.append(d)
    return out


# -- evaluation (tfsync.predict.score: the same loop `tfsync predict score` runs) ----------------
from tfsync.predict.score import one_step_ahead  # noqa: E402


def evaluate(series: list[dict], skip: int, warmup: int = 500, only=None):
    from tfsync.predict import NarxTrainer, get

    workers = sorted({r["worker"] for r in series})
    data = {w: sorted((r for r in series if r["worker"] == w), key=lambda r: r["step"]) for w in workers}
    results, preds = [], {}
    chosen = [p for p in PREDICTORS if not only or p[0] in only or p[1] in only]
    for label, name, opts, conf, cpu_key in chosen:
        errors, t0 = [], time.perf_counter()
        for w in workers:
            rows = data[w]
            speeds = [r["speed"] for r in rows]
            # learned predictors: seeded init and shuffling (tfsync.predict.nets), as online
            learned = {"trainer": NarxTrainer(threads=0), "warmup": warmup} if name in ("narx", "rnn", "lstm") else {}
            p = get(name, **opts, **learned)
            pred = one_step_ahead(p, speeds, [r[cpu_key] for r in rows], [r["mem"] for r in rows])
            preds[(label, w)] = pred
            e = (pred - np.array(speeds))[skip:]
            errors.append(e)
            results.append(row_of(label, conf, w, e, speeds[skip:]))
        e = np.concatenate(errors)
        speeds_all = [r["speed"] for w in workers for r in data[w][skip:]]
        results.append(row_of(label, conf, "all", e, speeds_all, time.perf_counter() - t0))
        print(f"  {label:16s} RMSE {results[-1]['rmse']:8.2f} samples/s "
              f"({results[-1]['nrmse_pct']:.2f} % of the mean) in {results[-1]['eval_s']:.0f} s", flush=True)
    ema = {r["worker"]: r["rmse"] for r in results if r["predictor"] == "EMA"}
    for r in results:
        r["ratio_to_ema"] = round(r["rmse"] / ema[r["worker"]], 3) if ema.get(r["worker"]) else ""
    return results, preds, data


def row_of(label, conf, worker, e, speeds, seconds=None) -> dict:
    rmse = float(np.sqrt(np.mean(e ** 2))) if len(e) else math.nan
    mean = float(np.mean(speeds)) if len(speeds) else math.nan
    return {"predictor": label, "configuration": conf, "worker": worker, "steps": int(len(e)),
            "rmse": round(rmse, 3), "nrmse_pct": round(100 * rmse / mean, 3), "mean_speed": round(mean, 2),
            "eval_s": round(seconds, 1) if seconds is not None else ""}


def plot(path: str, results, preds, data, skip: int, window: int = 300) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    w = 1 if 1 in data else min(data)  # worker 1 shares its CPU with the trace-driven burner
    rows = data[w]
    lo, hi = skip, min(len(rows), skip + window)
    x = np.arange(lo, hi)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 7), gridspec_kw={"height_ratios": [3, 2]})
    a1.plot(x, [r["speed"] for r in rows[lo:hi]], color="black", lw=1.2, label="actual")
    for label, color in (("Memoryless", "#aaaaaa"), ("EMA", "#4878a8"), ("NARX", "#c44e52")):
        if (label, w) in preds:
            a1.plot(x, preds[(label, w)][lo:hi], color=color, lw=1, label=label)
    a1.set_ylabel("samples/s")
    a1.set_xlabel(f"step of worker {w}")
    ax = a1.twinx()
    ax.plot(x, [r["cpu"] if r["cpu"] is not None else np.nan for r in rows[lo:hi]], color="#55a868",
            lw=0.8, ls=":", label="contention cpu %")
    ax.set_ylabel("contention (cpu %)", color="#55a868")
    a1.legend(loc="upper left", fontsize=8, ncol=4)
    a1.set_title(f"one-step-ahead prediction, worker {w}, steps {lo}-{hi - 1}")
    pooled = [r for r in results if r["worker"] == "all"]
    a2.barh([r["predictor"] for r in pooled], [r["rmse"] for r in pooled],
            color=["#c44e52" if r["predictor"].startswith("NARX") else "#4878a8" for r in pooled])
    a2.invert_yaxis()
    a2.set_xlabel(f"RMSE (samples/s), steps >= {skip}, both workers")
    ratio = next((r["ratio_to_ema"] for r in pooled if r["predictor"] == "NARX"), "")
    a2.set_title(f"NARX / EMA = {ratio} (target <= 0.6)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=480, help="recording length (training time)")
    p.add_argument("--series", default=None, help="evaluate this recorded series CSV (no cluster)")
    p.add_argument("--out", default="results", help="results folder")
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp", "linear"))
    p.add_argument("--batch-size", type=int, default=256, help="per worker (BSP)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--data", default=None, help="MNIST .npz (default: ../shared/data)")
    p.add_argument("--trace", default=TRACE, help="CPU trace (formats of tfsync.inject.load_trace_csv)")
    p.add_argument("--trace-index", type=int, default=3,
                   help="which trace of the file (3: Alibaba m_1935, whose CPU moves most per sample)")
    p.add_argument("--time-scale", type=float, default=20.0, help="trace seconds per real second")
    p.add_argument("--burners", type=int, default=2, help="burner processes on worker 1's CPU")
    p.add_argument("--monitor-interval", type=float, default=0.5, help="ResourceMonitor interval (s)")
    p.add_argument("--warmup", type=int, default=500,
                   help="steps before the learned predictors use their model (paper §4.2: 500)")
    p.add_argument("--skip", type=int, default=None, help="score steps from this index on (default: --warmup)")
    p.add_argument("--only", default=None, help="comma-separated predictor labels or names to evaluate")
    args = p.parse_args(argv)

    args.skip = args.warmup if args.skip is None else args.skip
    os.makedirs(args.out, exist_ok=True)
    series_path = os.path.join(args.out, "bench_predictors_series.csv")
    if args.series:
        series = load_series(args.series)
    else:
        run_dir = os.path.join(args.out, "bench_predictors_run")
        shutil.rmtree(run_dir, ignore_errors=True)
        series = record(args, run_dir)
        write_series(series_path, series)
        print(f"wrote {series_path}")
    steps = {w: sum(1 for r in series if r["worker"] == w) for w in sorted({r["worker"] for r in series})}
    print(f"evaluating on {steps} steps per worker, scoring from step {args.skip}", flush=True)
    if min(steps.values()) <= args.skip + 10:
        raise SystemExit(f"too few steps ({steps}) for --skip {args.skip}: record longer or lower --skip")
    results, preds, data = evaluate(series, args.skip, args.warmup, args.only.split(",") if args.only else None)
    path = os.path.join(args.out, "bench_predictors.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(results[0]))
        w.writeheader()
        w.writerows(results)
    plot(os.path.join(args.out, "bench_predictors.png"), results, preds, data, args.skip)
    ratio = next((r["ratio_to_ema"] for r in results if r["predictor"] == "NARX" and r["worker"] == "all"), None)
    if ratio is not None:
        print(f"NARX / EMA RMSE = {ratio} (target <= 0.6)")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
