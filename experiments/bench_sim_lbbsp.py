"""Issue-19 benchmark: LB-BSP vs BSP vs ideal in the simulator, with resource readings.

What: seconds per round (one update of X = n * B samples) of BSP, LB-BSP with each of
its speed predictors (last value, EMA, NARX given the simulator's readings, NARX with the
readings withheld) and ASP, on n simulated workers whose speed follows real CPU traces,
next to the ideal X / sum_i v_i(t) (LB-BSP §5.2; targets: LB-BSP <= 1.10 x ideal and
>= 1.5 x faster than BSP).

Why: the simulator now fills ``view.resources`` from its speed model as the engine's
monitor would (tfsync.sim.monitor), so NARX gets its exogenous CPU input there; this
measures what that input is worth in time per round, not only in RMSE
(tfsync.predict.score, results/issue19/).

How: ``tfsync.sim.Simulator`` with a ``SpeedModel`` on CPU traces, one trace machine per
worker (``tfsync.sim.load_cpu_traces``):
- ``alibaba``: ../shared/data/traces/alibaba2018/machine_usage.csv, 8 machines (60 s
  median spacing); loaded with ``gaps="hold"`` (3 gaps of 620 s in m_1932 are over the
  600 s max_gap; the sample before a gap holds across it, as results/issue19 scores).
  At 16 workers, workers 8-15 reuse the 8 machines one trace hour later (SpeedModel).
- ``bitbrains``: ../shared/data/traces/bitbrains_rnd_2013-07/, the first n VMs in file
  order (5-minute samples; ``gaps="hold"``, the same policy; the windows used hold no
  gap). Most of these VMs are nearly idle: a check that LB-BSP costs nothing there.
Worker w's step takes ``(fixed + per_sample * batch) / share_w(t)`` times log-normal
jitter (sigma --jitter, 0.05 as ``tfsync predict score``), share_w(t) = max(1 - util /
100, 0.05) at the step's start; ``--time-scale`` trace seconds per simulated second (60:
one Alibaba sample per simulated second, so the load changes every ~5 rounds; a 600 s
run covers 10 trace hours). Readings: the simulator's monitor, a sample every
--monitor-interval simulated seconds (1.0, the engine's), so at push time NARX has the
mean contention of the last whole second, never the next step's load.

Protocols, each on the same traces and seed (worker w's k-th jitter draw is the same in
every run) for the same --seconds of simulated time: BSP (B per worker), LB-BSP
(``tfsync.policy.LBBSP``, X = n * B, CPU rule, blocking, default hysteresis) with
predictor ``last``, ``ema`` (alpha 0.2), ``narx`` (readings given, the default) and
``narx`` with readings withheld (``LBBSPReadings(withhold=True)`` below: the policy sees
each view with ``resources={}``, so NARX's CPU input is 0 throughout; no library change),
and ASP (B per push). NARX trains inline on the simulator's trainer (deterministic), with
the paper's warm-up of 500 steps and the library's refit every 50 steps on the last 1000
(--narx-warmup, --narx-retrain-every) and the library's default fit (--narx-fit; recorded
in the CSV: "lbfgs" is milliseconds a fit, "adam", the paper's tf_keras fit, about a
second, which would need a shorter warm-up and rarer refits to stay within minutes).
--repeats R: repeat r uses jitter seed --seed + r and the trace window starting
r * seconds * time-scale trace seconds in (non-overlapping windows of the same machines).

Measured over simulated time [--skip, --seconds] (the first --skip seconds hold NARX's
warm-up): a round is the pushes of one barrier; its time is last arrival - first start
(rounds are back to back). Ideal per round: X / sum_i v_i(t_r), t_r the round's start,
v_i = B / ((fixed + per_sample * B) / share_i(t_r)) the worker's true speed there
(``SpeedModel.share``, no jitter); the mean over the same rounds. ASP has no rounds:
its time per X samples is (window length) * X / samples pushed in the window, against
the time-averaged ideal X * (window) / integral of sum_i v_i (``ideal_time_avg_s``, the
same for every protocol of a set, n and repeat; from ``SpeedModel.contention``).
BSP's own ratio to ideal bounds any speed-up over BSP (ASP, at ~1.00x ideal, shows it).
Wall seconds per run include NARX's fits. Writes <out>/bench_sim_lbbsp.csv (a row per
repeat, then a ``repeat=mean`` row with the standard deviations across repeats) and .png.

    OPENBLAS_NUM_THREADS=1 python experiments/bench_sim_lbbsp.py
    OPENBLAS_NUM_THREADS=1 python experiments/bench_sim_lbbsp.py --sets alibaba:4,8 --repeats 1 \
        --seconds 200 --skip 60 --narx-warmup 150

Runs in about 4 minutes on a 2-core machine with the L-BFGS fit (results/bench_sim_lbbsp.csv).
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import os
import statistics
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))
from tfsync import policy as policies  # noqa: E402
from tfsync.policy import LBBSP  # noqa: E402
from tfsync.sim import CpuTrace, Simulator, SpeedModel, load_cpu_traces  # noqa: E402

DATA = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "data", "traces"))
SETS = {"alibaba": os.path.join(DATA, "alibaba2018", "machine_usage.csv"),
        "bitbrains": os.path.join(DATA, "bitbrains_rnd_2013-07")}
# (label, policy name, predictor or None, readings withheld)
PROTOCOLS = [
    ("BSP", "bsp", None, False),
    ("LB-BSP last", "lbbsp", "last", False),
    ("LB-BSP EMA", "lbbsp", "ema", False),
    ("LB-BSP NARX", "lbbsp", "narx", False),
    ("LB-BSP NARX no readings", "lbbsp", "narx", True),
    ("ASP", "asp", None, False),
]
COLORS = {"BSP": "#4878a8", "LB-BSP last": "#bbbbbb", "LB-BSP EMA": "#8172b2", "LB-BSP NARX": "#c44e52",
          "LB-BSP NARX no readings": "#e8a0a2", "ASP": "#55a868"}
TARGET_IDEAL, TARGET_BSP = 1.10, 1.5  # LB-BSP: LB-BSP within 10 % of ideal, >= 1.5x BSP
MEASURES = ["mean_round_s", "ideal_s", "ratio_to_ideal", "bsp_over_protocol", "ideal_time_avg_s", "wall_s"]
FIELDS = ["trace_set", "workers", "protocol", "repeat", "predictor", "readings", "rounds", *MEASURES,
          "ratio_to_ideal_sd", "bsp_over_protocol_sd", "narx_fits", "narx_fit", "readings_seen_pct", "traces",
          "trace_start_s", "sim_seconds", "skip_seconds", "time_scale", "gaps", "jitter", "fixed", "per_sample",
          "batch_size", "monitor_interval", "narx_warmup", "narx_retrain_every", "seed"]


class LBBSPReadings(LBBSP):
    """LB-BSP that, with ``withhold=True``, shows the policy every view with
    ``resources={}`` (a monitor-less cluster: NARX's CPU input is then 0 throughout), and
    counts the pushes whose worker had a reading in the view the policy saw
    (``readings_seen_pct``: under 100 only for the pushes before the monitor's first sample)."""

    def __init__(self, *args, withhold: bool = False, **options):
        super().__init__(*args, **options)
        self.withhold = withhold
        self.pushes_seen = self.with_reading = 0

    def on_push(self, push, view):
        if self.withhold:
            view = dataclasses.replace(view, resources={})
        self.pushes_seen += 1
        self.with_reading += push.worker in (view.resources or {})
        return super().on_push(push, view)


def make_policy(name: str, predictor, withhold: bool, args):
    if name != "lbbsp":
        return policies.get(name, batch_size=args.batch_size)
    spec = predictor
    if predictor == "narx":
        spec = {"name": "narx", "warmup": args.narx_warmup, "retrain_every": args.narx_retrain_every}
        if args.narx_fit:
            spec["fit"] = args.narx_fit
    return LBBSPReadings(batch_size=args.batch_size, predictor=spec, withhold=withhold)


def shifted(trace: CpuTrace, start: float) -> CpuTrace:
    """``trace`` from trace time ``start`` on, re-timed to start at 0."""
    if start <= 0:
        return trace
    i = int(np.searchsorted(trace.times, start, side="right")) - 1
    if i >= len(trace.times) - 1:
        raise SystemExit(f"trace {trace.name} ends at {trace.end:g} s, before the window at {start:g} s: "
                         "fewer --repeats or a shorter --seconds")
    times = trace.times[i:].copy()
    times[0] = start  # the sample holding at `start` holds from there
    return CpuTrace(trace.name, times, trace.util[i:].copy(), trace.step, trace.wrap)


def true_speed(speeds: SpeedModel, worker: int, t: float, batch: int) -> float:
    """Worker ``worker``'s speed (samples/s) at simulated time ``t``, without jitter."""
    return batch * speeds.share(worker, t) / ((speeds.fixed + speeds.per_sample * batch) * speeds.factor(worker))


def time_avg_ideal(speeds: SpeedModel, n: int, batch: int, t0: float, t1: float) -> float:
    """X * (t1 - t0) / integral over [t0, t1] of sum_i v_i (shares from SpeedModel.contention)."""
    total = 0.0
    for w in range(n):
        share = 1.0 - speeds.contention(w, t0, t1) / 100.0  # mean share over [t0, t1]
        total += batch * share / ((speeds.fixed + speeds.per_sample * batch) * speeds.factor(w)) * (t1 - t0)
    return n * batch * (t1 - t0) / total


def measure(result, speeds: SpeedModel, n: int, args, aggregating: bool) -> dict:
    """Mean time per X samples over [skip, seconds] and the per-round ideal (see docstring)."""
    X, lo, hi = n * args.batch_size, args.skip, args.seconds
    if not aggregating:  # ASP: samples pushed in the window
        done = sum(p.batch_size for p in result.log if lo <= p.arrival <= hi and not p.dropped)
        return {"rounds": "", "mean_round_s": (hi - lo) * X / done, "ideal_s": "", "series": None}
    rounds = collections.defaultdict(list)
    for p in result.log:
        if not p.dropped:
            rounds[p.round].append(p)
    series = []  # (start, duration, ideal) of the rounds inside the window
    for r in sorted(rounds):
        ps = rounds[r]
        start, end = min(p.start for p in ps), max(p.arrival for p in ps)
        if start >= lo and end <= hi:
            if sum(p.batch_size for p in ps) != X or len({p.worker for p in ps}) != n:
                raise SystemExit(f"round {r} holds {sum(p.batch_size for p in ps)} samples from "
                                 f"{len(ps)} pushes, expected X = {X} from {n} workers")
            ideal = X / sum(true_speed(speeds, w, start, args.batch_size) for w in range(n))
            series.append((start, end - start, ideal))
    if not series:
        raise SystemExit(f"no complete round in [{lo}, {hi}] s: raise --seconds")
    return {"rounds": len(series), "mean_round_s": statistics.fmean(d for _, d, _ in series),
            "ideal_s": statistics.fmean(i for _, _, i in series), "series": series}


def run_set(set_name: str, n: int, repeat: int, args) -> tuple[list[dict], dict]:
    start = repeat * args.seconds * args.time_scale
    traces = [shifted(t, start) for t in load_cpu_traces(SETS[set_name], n, gaps=args.gaps)]
    seed = args.seed + repeat
    rows, series = [], {}
    for label, name, predictor, withhold in PROTOCOLS:
        if args.protocols and label not in args.protocols:
            continue
        speeds = SpeedModel(fixed=args.fixed, per_sample=args.per_sample, traces=traces,
                            trace_scale=args.time_scale, jitter=args.jitter, seed=seed)
        sim = Simulator(n, speeds, monitor_interval=args.monitor_interval)
        pol = make_policy(name, predictor, withhold, args)
        t0 = time.perf_counter()
        result = sim.run(pol, time=args.seconds)
        wall = time.perf_counter() - t0
        m = measure(result, speeds, n, args, name != "asp")
        series[label] = m.pop("series")
        fits = fit = ""
        if predictor == "narx":
            preds = list(pol.sizer.predictors.values())
            fits = sum(p.fits for p in preds)
            fit = preds[0].describe().get("fit", "adam")
            if not all(p.using_model for p in preds):
                print("    warning: some NARX predictors still in warm-up at the end (raise --seconds)")
        seen = ""
        if isinstance(pol, LBBSPReadings) and pol.pushes_seen:
            seen = round(100.0 * pol.with_reading / pol.pushes_seen, 1)
        rows.append({
            "trace_set": set_name, "workers": n, "protocol": label, "repeat": repeat, "predictor": predictor or "",
            "readings": ("withheld" if withhold else "given") if name == "lbbsp" else "", **m,
            "wall_s": wall, "narx_fits": fits, "narx_fit": fit, "readings_seen_pct": seen,
            "traces": " ".join(t.name for t in traces), "trace_start_s": start, "sim_seconds": args.seconds,
            "skip_seconds": args.skip, "time_scale": args.time_scale, "gaps": args.gaps, "jitter": args.jitter,
            "fixed": args.fixed, "per_sample": args.per_sample, "batch_size": args.batch_size,
            "monitor_interval": args.monitor_interval, "narx_warmup": args.narx_warmup,
            "narx_retrain_every": args.narx_retrain_every, "seed": seed})
    ideal_avg = time_avg_ideal(speeds, n, args.batch_size, args.skip, args.seconds)
    bsp = next((r["mean_round_s"] for r in rows if r["protocol"] == "BSP"), None)
    for r in rows:
        r["ideal_time_avg_s"] = ideal_avg
        r["ratio_to_ideal"] = r["mean_round_s"] / (r["ideal_s"] if r["ideal_s"] != "" else ideal_avg)
        r["bsp_over_protocol"] = bsp / r["mean_round_s"] if bsp else ""
        print(f"  {set_name:9s} n={n:2d} r{repeat} {r['protocol']:24s} {r['mean_round_s']:.4f} s/round  "
              f"{r['ratio_to_ideal']:.3f}x ideal  BSP/this {r['bsp_over_protocol'] or 0:.3f}  "
              f"wall {r['wall_s']:5.1f} s  fits {r['narx_fits']!s:>5s}", flush=True)
    return rows, series


def mean_rows(rows: list[dict]) -> list[dict]:
    """One ``repeat=mean`` row per (set, n, protocol): means, and SDs of the two ratios."""
    out = []
    keys = list(dict.fromkeys((r["trace_set"], r["workers"], r["protocol"]) for r in rows))
    for key in keys:
        rs = [r for r in rows if (r["trace_set"], r["workers"], r["protocol"]) == key]
        m = {**rs[0], "repeat": "mean", "seed": "", "trace_start_s": "",
             "rounds": sum(r["rounds"] for r in rs) if rs[0]["rounds"] != "" else "",
             "narx_fits": sum(r["narx_fits"] for r in rs) if rs[0]["narx_fits"] != "" else ""}
        for k in MEASURES:
            vals = [r[k] for r in rs if r[k] != ""]
            m[k] = statistics.fmean(vals) if vals else ""
        for k in ("ratio_to_ideal", "bsp_over_protocol"):
            vals = [r[k] for r in rs if r[k] != ""]
            m[k + "_sd"] = statistics.stdev(vals) if len(vals) > 1 else ""
        out.append(m)
    return out


def plot(path: str, rows: list[dict], series: dict, focus: tuple[str, int], args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    groups = list(dict.fromkeys((r["trace_set"], r["workers"]) for r in rows))
    labels = [p[0] for p in PROTOCOLS if any(r["protocol"] == p[0] for r in rows)]
    fig = Figure(figsize=(14, 9.5), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.25, 1])
    a1, a2 = top.subplots(1, 2)
    width = 0.84 / len(labels)
    for k, label in enumerate(labels):
        for ax, key in ((a1, "ratio_to_ideal"), (a2, "bsp_over_protocol")):
            xs, ys, es = [], [], []
            for g, (s, n) in enumerate(groups):
                r = next((r for r in rows if (r["trace_set"], r["workers"], r["protocol"]) == (s, n, label)), None)
                if r is not None and r[key] != "":
                    xs.append(g + (k - (len(labels) - 1) / 2) * width)
                    ys.append(r[key])
                    es.append(r[key + "_sd"] or 0.0)
            ax.bar(xs, ys, width, yerr=es if any(es) else None, error_kw={"lw": 0.7, "capsize": 1.5},
                   color=COLORS[label], label=label, edgecolor="white", linewidth=0.4)
            for x, y, e in zip(xs, ys, es):
                ax.text(x, y + e, f" {y:.2f}", rotation=90, ha="center", va="bottom", fontsize=6.5)
    a1.axhline(1.0, color="black", lw=0.8)
    a1.axhline(TARGET_IDEAL, color="#c44e52", lw=1, ls="--", label=f"target <= {TARGET_IDEAL:.2f}x ideal")
    a1.set_ylim(0.95, max(r["ratio_to_ideal"] + (r["ratio_to_ideal_sd"] or 0) for r in rows) * 1.07)
    a1.set_title("time per X samples / ideal X / sum v_i(t)   (lower is better)", fontsize=10)
    a2.axhline(1.0, color="black", lw=0.8)
    a2.axhline(TARGET_BSP, color="#c44e52", lw=1, ls=":", label=f"target >= {TARGET_BSP:.1f}x BSP")
    a2.set_ylim(0.8, max(TARGET_BSP, max(r["bsp_over_protocol"] + (r["bsp_over_protocol_sd"] or 0)
                                         for r in rows)) * 1.07)
    a2.set_title("speed-up over BSP: BSP time / protocol time   (higher is better)", fontsize=10)
    for ax in (a1, a2):
        ax.set_xticks(range(len(groups)), [f"{s}\nn={n}" for s, n in groups])
        ax.grid(axis="y", alpha=0.3)
    handles, names = a1.get_legend_handles_labels()
    h2, n2 = a2.get_legend_handles_labels()
    handles.append(h2[n2.index(f"target >= {TARGET_BSP:.1f}x BSP")])
    names.append(f"target >= {TARGET_BSP:.1f}x BSP")
    top.legend(handles, names, loc="outside lower center", ncol=len(names), fontsize=8, frameon=False)
    b1 = bottom.subplots(1, 1)
    s, n = focus
    t_lo, t_hi = args.skip, args.skip + args.plot_window
    for label in ("BSP", "LB-BSP EMA", "LB-BSP NARX"):
        pts = [(t, d) for t, d, _ in series.get((label, s, n)) or [] if t_lo <= t <= t_hi]
        if pts:
            b1.plot([t for t, _ in pts], [d for _, d in pts], color=COLORS[label], lw=1, label=label)
    ref = next((label for label in ("LB-BSP NARX", "BSP") if series.get((label, s, n))), None)
    if ref:
        pts = [(t, i) for t, _, i in series[(ref, s, n)] if t_lo <= t <= t_hi]
        b1.plot([t for t, _ in pts], [i for _, i in pts], color="black", lw=1.3, ls=":",
                label=f"ideal X / sum v_i(t) at the {ref} run's round starts")
    b1.set_xlabel(f"simulated seconds (1 s = {args.time_scale:g} trace s; a reading every "
                  f"{args.monitor_interval:g} s)")
    b1.set_ylabel("seconds per round (X samples)")
    b1.set_title(f"round by round: {s}, n={n}, repeat 0, the first {args.plot_window:g} s of the measured window",
                 fontsize=10)
    b1.legend(fontsize=8, loc="upper right", ncol=4)
    b1.grid(alpha=0.3)
    reps = f"mean of {args.repeats} trace windows (bars: SD)" if args.repeats > 1 else "one trace window"
    fig.suptitle(f"LB-BSP vs BSP vs ideal in tfsync.sim on real CPU traces, {reps}: B={args.batch_size}, X=n*B, "
                 f"jitter {args.jitter:g}, measured {args.skip:g}-{args.seconds:g} simulated s; NARX warm-up "
                 f"{args.narx_warmup}, refit every {args.narx_retrain_every} steps", fontsize=10)
    fig.savefig(path, dpi=110)


def parse_sets(items: list[str]) -> list[tuple[str, int]]:
    out = []
    for item in items:
        name, _, ns = item.partition(":")
        if name not in SETS or not ns:
            raise SystemExit(f"--sets: {item!r} is not SET:N[,N...] with SET one of {', '.join(SETS)}")
        out += [(name, int(n)) for n in ns.split(",")]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sets", nargs="+", default=["alibaba:4,8,16", "bitbrains:4,8,16"],
                   help="trace sets and worker counts, SET:N,N... (default alibaba:4,8,16 bitbrains:4,8,16)")
    p.add_argument("--repeats", type=int, default=3, help="trace windows (and jitter seeds) per configuration (3)")
    p.add_argument("--seconds", type=float, default=600.0, help="simulated seconds per run (600)")
    p.add_argument("--skip", type=float, default=150.0,
                   help="simulated seconds not measured (150: NARX's 500-step warm-up is over by then)")
    p.add_argument("--time-scale", type=float, default=60.0, help="trace seconds per simulated second (60)")
    p.add_argument("--gaps", default="hold", choices=("hold", "interpolate", "skip", "refuse"),
                   help="trace gap policy (tfsync.base.traces; default hold)")
    p.add_argument("--batch-size", type=int, default=32, help="B per worker; X = n * B per round (32)")
    p.add_argument("--fixed", type=float, default=0.0, help="fixed seconds per step (0)")
    p.add_argument("--per-sample", type=float, default=0.004, help="seconds per sample at full CPU share (0.004)")
    p.add_argument("--jitter", type=float, default=0.05, help="log-normal sigma on every step (0.05)")
    p.add_argument("--monitor-interval", type=float, default=1.0, help="simulated seconds between readings (1.0)")
    p.add_argument("--narx-warmup", type=int, default=500, help="steps before NARX's model is used (500, §4.2)")
    p.add_argument("--narx-retrain-every", type=int, default=50, help="steps between NARX refits (50)")
    p.add_argument("--narx-fit", default=None, help="NARX fit (lbfgs, adam; default the library's)")
    p.add_argument("--seed", type=int, default=0, help="jitter seed of repeat 0 (repeat r: seed + r)")
    p.add_argument("--protocols", default=None, help="comma-separated labels to run (default all)")
    p.add_argument("--plot-window", type=float, default=30.0, help="simulated seconds in the round-time plot")
    p.add_argument("--out", default="results", help="results folder")
    args = p.parse_args(argv)
    args.protocols = args.protocols.split(",") if args.protocols else None
    if not 0 <= args.skip < args.seconds or args.repeats < 1:
        raise SystemExit("need 0 <= --skip < --seconds and --repeats >= 1")

    t0 = time.perf_counter()
    runs, series = [], {}
    plan = parse_sets(args.sets)
    for s, n in plan:
        for rep in range(args.repeats):
            got, ser = run_set(s, n, rep, args)
            runs += got
            if rep == 0:
                series.update({(label, s, n): v for label, v in ser.items()})
    total = time.perf_counter() - t0
    means = mean_rows(runs)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_sim_lbbsp.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in runs + means:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    focus = next(((s, n) for s, n in plan if (s, n) == ("alibaba", 8)), plan[0])
    plot(os.path.join(args.out, "bench_sim_lbbsp.png"), means, series, focus, args)
    print(f"{'set':9s} {'n':>2s} {'protocol':24s} {'s/round':>8s} {'x ideal':>8s} {'BSP/this':>8s} {'wall s':>7s}")
    for r in means:
        print(f"{r['trace_set']:9s} {r['workers']:2d} {r['protocol']:24s} {r['mean_round_s']:8.4f} "
              f"{r['ratio_to_ideal']:8.3f} {r['bsp_over_protocol'] or 0:8.3f} {r['wall_s']:7.1f}")
    print(f"wrote {path} and bench_sim_lbbsp.png")
    parts = []
    for s, n in plan:
        pick = {r["protocol"]: r for r in means if (r["trace_set"], r["workers"]) == (s, n)}
        r, bsp = pick.get("LB-BSP NARX"), pick.get("BSP")
        if r is None or bsp is None:
            continue
        met = r["ratio_to_ideal"] <= TARGET_IDEAL and r["bsp_over_protocol"] >= TARGET_BSP
        parts.append(f"{s} n={n}: {r['ratio_to_ideal']:.2f}x ideal, {r['bsp_over_protocol']:.2f}x BSP "
                     f"(BSP itself {bsp['ratio_to_ideal']:.2f}x ideal) {'met' if met else 'NOT met'}")
    print(f"LB-BSP NARX vs targets <= {TARGET_IDEAL:.2f}x ideal and >= {TARGET_BSP:.1f}x BSP: " + "; ".join(parts)
          + f"; wall {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
