"""Simulated-cluster protocol benchmark (issue benchmark 2): BSP, ASP, SSP, PSSP
(constant and dynamic, lazy and soft), FluentPS SSP (lazy vs soft) and ElasticBSP train
the same NumPy MLP on MNIST in ``tfsync.sim`` with heterogeneous workers and transient
stragglers, plus a scheduling-only DPR table next to FluentPS' Fig. 9 trend.

Cluster (RLP §4): every worker w takes ``(fixed + per_sample * batch) * f_w``
seconds per step, f_w ~ U(1, 2) drawn once from --seed, times log-normal jitter, and
with probability p = 0.3 it sleeps an extra N(0.1, 0.03) s. Every protocol gets the same
SpeedModel parameters and seed (draws are per worker and step, so the luck is shared),
the same MLP initialisation and the same per-worker data streams. Base learning rate
--lr for protocols that apply pushes on arrival (ASP, SSP, PSSP, FluentPS, ElasticBSP);
BSP applies the batch-weighted mean of n gradients once per round and uses the
Sync-Switch rule eta_BSP = n * eta (Sync-Switch §IV-C); if that diverges (final accuracy
< 0.5 or non-finite weights) BSP is run again at min(n * eta, --bsp-lr-cap) and both rows
are kept. Each run stops after --epochs epochs of samples (then drains the steps
already granted).

DPR table (FluentPS §IV, Fig. 9: PSSP(s, c) and SSP(s' = s + 1/c - 1) share a regret
bound; the paper reports fewer DPRs for PSSP): for every s in --dpr-s and c in --dpr-c,
PSSP(s, c) and FluentPS SSP(s') with lazy execution and with the soft barrier,
scheduling only (no model), --dpr-workers workers, --dpr-pushes pushes, under the
training's heterogeneous speeds and under homogeneous ones (--dpr-speeds).

Writes <out>/bench_sim_protocols.csv, bench_sim_protocols_curves.csv,
bench_sim_protocols.png and bench_sim_dpr.csv.

    python experiments/bench_sim_protocols.py --workers 16,64 --epochs 5
    python experiments/bench_sim_protocols.py --workers 64 --lr 0.02 --skip-dpr --tag _n64_lr0.02
    python experiments/bench_sim_protocols.py --skip-training --dpr-s 3 --dpr-c 0.5,0.3333333333333333,0.2,0.1 --tag _fig9
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))
from tfsync import policy as policies  # noqa: E402
from tfsync.policy import BatchSizer  # noqa: E402
from tfsync.sim import Simulator, SpeedModel  # noqa: E402
from tfsync.sim.model import NumpyMLP  # noqa: E402

DATA = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "data", "mnist.npz"))
SAMPLE = os.path.join(HERE, "..", "tfsync", "datasets", "mnist_sample.npz")

# (label, policy spec); BSP's learning rate is set per n, see module docstring.
PROTOCOLS = [
    ("BSP", "bsp"),
    ("ASP", "asp"),
    ("SSP s=3", {"name": "ssp", "staleness": 3}),
    ("PSSP s=3 c=0.3 lazy", {"name": "pssp", "staleness": 3, "probability": 0.3, "execution": "lazy"}),
    ("PSSP s=3 c=0.5 lazy", {"name": "pssp", "staleness": 3, "probability": 0.5, "execution": "lazy"}),
    ("PSSP s=3 dyn lazy", {"name": "pssp", "staleness": 3, "probability": "dynamic", "execution": "lazy"}),
    ("FluentPS SSP s=3 lazy", {"name": "fluentps", "staleness": 3, "probability": 1.0, "execution": "lazy"}),
    ("FluentPS SSP s=3 soft", {"name": "fluentps", "staleness": 3, "probability": 1.0, "execution": "soft"}),
    ("PSSP s=3 c=0.5 soft", {"name": "pssp", "staleness": 3, "probability": 0.5, "execution": "soft"}),
    ("ElasticBSP R=15", {"name": "elastic_bsp", "lookahead": 15}),
]

FIELDS = ["n", "protocol", "lr", "time_to_90", "time_to_95", "final_acc", "best_acc", "diverged",
          "sim_time", "pushes", "updates", "samples", "dropped", "pushes_per_sim_s",
          "staleness_mean", "staleness_p99", "staleness_max", "dpr_per_100_it", "delayed_pulls",
          "mean_barrier_wait", "barriers", "wall_s"]


def load_mnist(path: str):
    if os.path.exists(path):
        src = path
    else:
        src = os.path.normpath(SAMPLE)
        print(f"NOTE: {path} not found; using the bundled sample {src} (6000 train / 1000 test)")
    d = np.load(src)
    prep = lambda x: (np.asarray(x).reshape(len(x), -1) / 255.0).astype(np.float32)  # noqa: E731
    return src, prep(d["x_train"]), d["y_train"], prep(d["x_test"]), d["y_test"]


def speed_factors(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(1.0, 2.0) for _ in range(n)]


def speed_model(n: int, args, hetero: bool = True) -> SpeedModel:
    """A fresh model every run (it holds the per-worker random streams). ``hetero``:
    per-worker factors f_w ~ U(1, 2); otherwise f_w = 1 (jitter and stragglers only)."""
    return SpeedModel(fixed=args.fixed, per_sample=args.per_sample, jitter=0.1, straggle_p=0.3,
                      straggle_mean=0.1, straggle_std=0.03,
                      factors=speed_factors(max(n, 1024), args.seed)[:n] if hetero else None, seed=args.seed)


def make_policy(spec, seed: int, batch: int):
    spec = dict(spec) if isinstance(spec, dict) else {"name": spec}
    return policies.get({**spec, "seed": seed, "sizer": BatchSizer(batch)})


def train_run(label, spec, n, lr, data, args) -> tuple[dict, list]:
    _, xtr, ytr, xte, yte = data
    model = NumpyMLP(xtr, ytr, xte, yte, hidden=args.hidden, seed=args.seed, eval_size=args.eval_size)
    pol = make_policy(spec, args.seed, args.batch)
    per_update = args.batch * (n if pol.name == "bsp" else 1)  # samples one update stands for
    eval_every = max(1, round(args.eval_samples / per_update))
    sim = Simulator(n, speed_model(n, args), model=model, lr=lr, eval_every=eval_every)
    t0 = time.perf_counter()
    res = sim.run(pol, samples=int(args.epochs * len(ytr)))
    wall = time.perf_counter() - t0
    if not res.accuracy or res.accuracy[-1][1] != res.updates:  # final point
        res.accuracy.append((res.time, res.updates, model.accuracy()))
    finite = all(np.isfinite(p).all() for p in model.params)
    accs = [a for _, _, a in res.accuracy]
    st, ps = res.staleness(), res.stats
    row = {"n": n, "protocol": label, "lr": lr, "time_to_90": res.time_to_accuracy(0.90),
           "time_to_95": res.time_to_accuracy(args.target), "final_acc": accs[-1],
           "best_acc": max(accs), "diverged": (not finite) or accs[-1] < 0.5,
           "sim_time": res.time, "pushes": res.pushes, "updates": res.updates,
           "samples": res.samples, "dropped": res.dropped,
           "pushes_per_sim_s": res.pushes / res.time if res.time else 0.0,
           "staleness_mean": st["mean"], "staleness_p99": st["p99"], "staleness_max": st["max"],
           "dpr_per_100_it": ps.get("dpr_per_100_iterations"), "delayed_pulls": ps.get("delayed_pulls"),
           "mean_barrier_wait": ps.get("mean_barrier_wait"), "barriers": ps.get("barriers"),
           "wall_s": wall}
    curve = [{"n": n, "protocol": label, "time": t, "updates": u, "accuracy": a} for t, u, a in res.accuracy]
    return row, curve


def fmt(v, spec=".3g", none="-"):
    if v is None:
        return none
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) and math.isnan(v):
        return none
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def run_training(args, data):
    rows, curves = [], []
    for n in args.workers:
        for label, spec in PROTOCOLS:
            if label == "BSP":
                lrs = [(n * args.lr, f"BSP lr=n*eta={n * args.lr:g}")]
            else:
                lrs = [(args.lr, label)]
            for lr, name in lrs:
                row, curve = train_run(name, spec, n, lr, data, args)
                rows.append(row)
                curves += curve
                print(f"  n={n:3d} {name:26s} acc {row['final_acc']:.4f}  t90 {fmt(row['time_to_90'], '.2f'):>6s} "
                      f"t{args.target:g} {fmt(row['time_to_95'], '.2f'):>6s}  sim {row['sim_time']:7.2f} s  "
                      f"wall {row['wall_s']:5.1f} s", flush=True)
                if label == "BSP" and row["diverged"] and n * args.lr > args.bsp_lr_cap:
                    capped = min(n * args.lr, args.bsp_lr_cap)
                    print(f"  n={n:3d} BSP at n*eta = {n * args.lr:g} diverged (final acc "
                          f"{row['final_acc']:.3f}); rerunning at min(n*eta, cap) = {capped:g}", flush=True)
                    lrs.append((capped, f"BSP lr=capped={capped:g}"))
    return rows, curves


def print_training(rows, target):
    head = ["n", "protocol", "lr", "t->0.90", f"t->{target:g}", "final", "updates", "push/s",
            "stale mean", "p99", "max", "DPR/100it", "barrier wait", "wall s"]
    widths = [4, 26, 6, 8, 8, 7, 8, 8, 10, 5, 5, 10, 12, 7]
    print("\nTraining to a fixed number of samples (simulated seconds; '-' = target not reached)")
    print(" ".join(f"{h:>{w}s}" if i != 1 else f"{h:<{w}s}" for i, (h, w) in enumerate(zip(head, widths))))
    for r in rows:
        cells = [r["n"], r["protocol"], fmt(r["lr"], "g"), fmt(r["time_to_90"], ".2f"),
                 fmt(r["time_to_95"], ".2f"), f"{r['final_acc']:.4f}" + ("!" if r["diverged"] else ""),
                 r["updates"], fmt(r["pushes_per_sim_s"], ".1f"), fmt(r["staleness_mean"], ".1f"),
                 r["staleness_p99"], r["staleness_max"], fmt(r["dpr_per_100_it"], ".1f"),
                 fmt(r["mean_barrier_wait"], ".3f"), fmt(r["wall_s"], ".1f")]
        print(" ".join(f"{c!s:>{w}s}" if i != 1 else f"{c!s:<{w}s}" for i, (c, w) in enumerate(zip(cells, widths))))
    print("final: accuracy on the eval set after the last update; '!' = diverged (< 0.5 or non-finite)")


# -- DPR table (Fig. 9 trend) ------------------------------------------------------------
def dpr_run(spec, n, pushes, args, hetero) -> dict:
    sim = Simulator(n, speed_model(n, args, hetero), record=True)
    pol = make_policy(spec, args.seed, args.batch)
    t0 = time.perf_counter()
    res = sim.run(pol, pushes=pushes)
    st = res.staleness()
    return {"dpr": res.stats["dpr_per_100_iterations"], "delayed": res.stats["delayed_pulls"],
            "sim_time": res.time, "pushes": res.pushes, "staleness_mean": st["mean"],
            "staleness_max": st["max"], "wall_s": time.perf_counter() - t0}


def dpr_pairs(args):
    """(s, c, s') for every s and c whose s' = s + 1/c - 1 is an integer."""
    for s in args.dpr_s:
        for c in args.dpr_c:
            s2 = s + 1.0 / c - 1.0
            if abs(s2 - round(s2)) > 1e-9:
                print(f"  skip s={s} c={c}: s' = {s2:g} is not an integer")
                continue
            yield s, c, int(round(s2))


def run_dpr(args):
    cache, rows = {}, []

    def get(spec, speed):
        key = (tuple(sorted(spec.items())), speed)
        if key not in cache:  # SSP(s') is shared by several (s, c) pairs
            cache[key] = dpr_run(spec, args.dpr_workers, args.dpr_pushes, args, speed == "hetero")
        return cache[key]

    for speed in args.dpr_speeds:
        for s, c, s2 in dpr_pairs(args):
            for execution in ("lazy", "soft"):
                p = get({"name": "pssp", "staleness": s, "probability": c, "execution": execution}, speed)
                q = get({"name": "fluentps", "staleness": s2, "probability": 1.0, "execution": execution}, speed)
                rows.append({"speed": speed, "s": s, "c": c, "s_prime": s2, "execution": execution,
                             "pssp_dpr_per_100_it": p["dpr"], "ssp_dpr_per_100_it": q["dpr"],
                             "pssp_delayed": p["delayed"], "ssp_delayed": q["delayed"],
                             "pssp_sim_time": p["sim_time"], "ssp_sim_time": q["sim_time"],
                             "pssp_staleness_mean": p["staleness_mean"], "ssp_staleness_mean": q["staleness_mean"],
                             "pssp_staleness_max": p["staleness_max"], "ssp_staleness_max": q["staleness_max"],
                             "pssp_fewer_dprs": p["dpr"] < q["dpr"], "pssp_faster": p["sim_time"] < q["sim_time"]})
                print(f"  {speed:6s} s={s} c={c:<4g} vs s'={s2} {execution}: PSSP {p['dpr']:7.1f} DPR/100it "
                      f"{p['sim_time']:7.2f} s | SSP(s') {q['dpr']:7.1f} DPR/100it {q['sim_time']:7.2f} s", flush=True)
    return rows


def print_dpr(rows, args):
    print(f"\nDPR table: n={args.dpr_workers}, {args.dpr_pushes} pushes, scheduling only; "
          f"PSSP(s, c) vs FluentPS SSP(s' = s + 1/c - 1) (FluentPS Fig. 9)")
    print("speed hetero: f_w ~ U(1, 2) as in training; homog: f_w = 1 (jitter + stragglers only)")
    head = ["speed", "s", "c", "s'", "exec", "PSSP DPR/100", "SSP' DPR/100", "PSSP/SSP'", "PSSP sim s",
            "SSP' sim s", "PSSP stale", "SSP' stale", "PSSP<SSP'"]
    print(" ".join(f"{h:>12s}" for h in head))
    for r in rows:
        ratio = r["pssp_dpr_per_100_it"] / r["ssp_dpr_per_100_it"] if r["ssp_dpr_per_100_it"] else float("nan")
        cells = [r["speed"], r["s"], f"{r['c']:g}", r["s_prime"], r["execution"], f"{r['pssp_dpr_per_100_it']:.1f}",
                 f"{r['ssp_dpr_per_100_it']:.1f}", f"{ratio:.2f}", f"{r['pssp_sim_time']:.2f}",
                 f"{r['ssp_sim_time']:.2f}", f"{r['pssp_staleness_mean']:.1f}", f"{r['ssp_staleness_mean']:.1f}",
                 "yes" if r["pssp_fewer_dprs"] else "NO"]
        print(" ".join(f"{c!s:>12s}" for c in cells))
    for speed in args.dpr_speeds:
        for execution in ("lazy", "soft"):
            sub = [r for r in rows if r["execution"] == execution and r["speed"] == speed]
            if sub:
                print(f"{speed} {execution}: PSSP(s, c) has fewer DPRs than SSP(s') in "
                      f"{sum(r['pssp_fewer_dprs'] for r in sub)}/{len(sub)} pairs (paper: every pair); "
                      f"shorter simulated time in {sum(r['pssp_faster'] for r in sub)}/{len(sub)}")
        lazy = {(r["s"], r["c"]): r for r in rows if r["execution"] == "lazy" and r["speed"] == speed}
        soft = {(r["s"], r["c"]): r for r in rows if r["execution"] == "soft" and r["speed"] == speed}
        both = [k for k in lazy if k in soft]
        if both:
            fewer = sum(lazy[k]["ssp_dpr_per_100_it"] < soft[k]["ssp_dpr_per_100_it"] for k in both)
            print(f"{speed}: lazy SSP(s') has fewer DPRs than soft SSP(s') in {fewer}/{len(both)} "
                  f"(paper: lazy saves up to 97.1%)")


# -- output ------------------------------------------------------------------------------
def write_csv(rows, path, fields):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


def plot(rows, curves, dpr_rows, workers, target, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ncol = max(len(workers), 1)
    fig = plt.figure(figsize=(max(6 * ncol, 16), 10))
    cols = math.lcm(ncol, 3)  # top: one panel per n; bottom: DPR bars (1/3) and the Fig. 9 table (2/3)
    gs = fig.add_gridspec(2, cols)
    labels = list(dict.fromkeys(r["protocol"] for r in rows))
    color = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}
    style = {lab: ("--" if "capped" in lab or "soft" in lab else "-") for lab in labels}
    for i, n in enumerate(workers):
        ax = fig.add_subplot(gs[0, i * cols // ncol:(i + 1) * cols // ncol])
        for lab in labels:
            pts = [(c["time"], c["accuracy"]) for c in curves if c["n"] == n and c["protocol"] == lab]
            if pts:
                bad = any(r["diverged"] for r in rows if r["n"] == n and r["protocol"] == lab)
                ax.plot(*zip(*pts), style[lab], color=color[lab], label=lab + (" (diverged)" if bad else ""), lw=1.2)
        ax.axhline(target, color="k", lw=0.6, ls=":")
        ax.axhline(0.90, color="k", lw=0.6, ls=":")
        ax.set(xlabel="simulated time (s)", ylabel="test accuracy", title=f"n = {n} workers", ylim=(0.5, 1.0))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    ax = fig.add_subplot(gs[1, :cols // 3])
    dl = [lab for lab in labels if any(r["protocol"] == lab and r["dpr_per_100_it"] is not None for r in rows)]
    width = 0.8 / ncol
    for i, n in enumerate(workers):
        vals = [next((r["dpr_per_100_it"] for r in rows if r["n"] == n and r["protocol"] == lab), 0) or 0
                for lab in dl]
        ax.bar(np.arange(len(dl)) + i * width, vals, width, label=f"n = {n}")
    ax.set_xticks(np.arange(len(dl)) + width * (ncol - 1) / 2)
    ax.set_xticklabels(dl, rotation=30, ha="right", fontsize=7)
    ax.set(ylabel="DPRs per 100 iterations", title="delayed pull requests (training runs)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    if dpr_rows:
        ax = fig.add_subplot(gs[1, cols // 3:])
        x = np.arange(len(dpr_rows))
        ax.bar(x - 0.2, [r["pssp_dpr_per_100_it"] for r in dpr_rows], 0.4, color="C0", label="PSSP(s, c)")
        ax.bar(x + 0.2, [r["ssp_dpr_per_100_it"] for r in dpr_rows], 0.4, color="C1", label="SSP(s' = s + 1/c - 1)")
        ax.set_xticks(x)
        ax.set_xticklabels([f"{r['speed'][:2]} {r['execution'][0].upper()} s={r['s']},c={r['c']:g}|s'={r['s_prime']}"
                            for r in dpr_rows], rotation=60, ha="right", fontsize=6)
        ax.set(ylabel="DPRs per 100 iterations", yscale="log",
               title="Fig. 9 trend (scheduling only): he/ho = hetero/homog speeds, L/S = lazy/soft")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def ints(s):
    return [int(x) for x in s.split(",") if x]


def floats(s):
    return [float(x) for x in s.split(",") if x]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--workers", type=ints, default=[16, 64], help="worker counts, comma-separated (16,64)")
    ap.add_argument("--epochs", type=float, default=5.0,
                    help="stop each training run after this many epochs of samples (5)")
    ap.add_argument("--target", type=float, default=0.95, help="accuracy target for time-to-accuracy (0.95; "
                    "0.90 is always reported too)")
    ap.add_argument("--lr", type=float, default=0.05, help="base learning rate eta (0.05)")
    ap.add_argument("--bsp-lr-cap", type=float, default=0.5,
                    help="BSP learning rate if n*eta diverges: min(n*eta, cap) (0.5)")
    ap.add_argument("--batch", type=int, default=32, help="per-worker batch size (32)")
    ap.add_argument("--hidden", type=int, default=64, help="MLP hidden units (64)")
    ap.add_argument("--fixed", type=float, default=0.02, help="step time: fixed seconds (0.02)")
    ap.add_argument("--per-sample", type=float, default=0.001, help="step time: seconds per example (0.001)")
    ap.add_argument("--eval-samples", type=int, default=3200,
                    help="measure accuracy about every this many trained examples (3200)")
    ap.add_argument("--eval-size", type=int, default=2000, help="test examples per accuracy measure (2000)")
    ap.add_argument("--dpr-workers", type=int, default=32, help="workers in the DPR table (32)")
    ap.add_argument("--dpr-pushes", type=int, default=20000, help="pushes per DPR-table run (20000)")
    ap.add_argument("--dpr-s", type=ints, default=[2, 3, 4], help="PSSP staleness values s (2,3,4)")
    ap.add_argument("--dpr-c", type=floats, default=[0.5, 0.25], help="PSSP probabilities c (0.5,0.25)")
    ap.add_argument("--dpr-speeds", type=lambda v: [x for x in v.split(",") if x], default=["hetero", "homog"],
                    help="speed models for the DPR table: hetero (f_w ~ U(1, 2), as training), homog (f_w = 1)")
    ap.add_argument("--skip-training", action="store_true", help="only the DPR table")
    ap.add_argument("--skip-dpr", action="store_true", help="only the training runs")
    ap.add_argument("--data", default=DATA, help="MNIST .npz (x_train, y_train, x_test, y_test)")
    ap.add_argument("--seed", type=int, default=0, help="speed, model, data-order and policy seed (0)")
    ap.add_argument("--out", default="results/", help="output folder (results/)")
    ap.add_argument("--tag", default="", help="suffix for output file names, e.g. _lr0.02")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()
    rows, curves, dpr_rows = [], [], []
    if not args.skip_training:
        data = load_mnist(args.data)
        print(f"data: {data[0]} ({len(data[2])} train, {min(len(data[4]), args.eval_size)} eval)")
        base = (args.fixed + args.per_sample * args.batch)
        print(f"speed: step = {base * 1000:.0f} ms x f_w, f_w ~ U(1, 2) (seed {args.seed}), jitter 0.1, "
              f"p=0.3 straggle + N(0.1, 0.03) s; lr {args.lr:g}, BSP n*eta (cap {args.bsp_lr_cap:g} if it "
              f"diverges); {args.epochs:g} epochs per run")
        rows, curves = run_training(args, data)
        print_training(rows, args.target)
        write_csv(rows, os.path.join(args.out, f"bench_sim_protocols{args.tag}.csv"), FIELDS)
        write_csv(curves, os.path.join(args.out, f"bench_sim_protocols_curves{args.tag}.csv"),
                  ["n", "protocol", "time", "updates", "accuracy"])
    if not args.skip_dpr:
        print(f"\nDPR table runs (n={args.dpr_workers}, {args.dpr_pushes} pushes each)")
        dpr_rows = run_dpr(args)
        print_dpr(dpr_rows, args)
        write_csv(dpr_rows, os.path.join(args.out, f"bench_sim_dpr{args.tag}.csv"), list(dpr_rows[0]) if dpr_rows else ["s"])
    if rows:
        plot(rows, curves, dpr_rows, args.workers, args.target, os.path.join(args.out, f"bench_sim_protocols{args.tag}.png"))
    print(f"total wall time {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
