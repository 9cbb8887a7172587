"""Issue-4 benchmark: LB-BSP's hardware and statistical efficiency (LB-BSP §5.2, Fig. 8).

Per-update time of BSP, LB-BSP and ASP at the heterogeneity levels Homo, Hetero-L2 and
Hetero-L3 on the local cluster: 2 workers + 1 PS, real Engine (tfsync.cli.jobrun.run_job
with a job config: LB-BSP is ``tfsync.policy.LBBSP`` with X = n * B and the learning
rate scaled like BSP's, n * eta; ASP runs eta on B). Worker i is pinned to CPU i; the
burners of ``tfsync.inject.level_plan`` are pinned to the slowed worker's CPU (the PS
and this coordinator are not pinned).

Per-update time: the time the cluster takes to process X = n * B samples in the steady
part of a run (after the first --skip share of its samples), i.e. one round of BSP or
LB-BSP, and n updates of B samples under ASP. Ideal: X / sum(v_i), with v_i worker i's
measured speed (samples / compute seconds, batch / (end - start)) in the same run; the
LB-BSP / ideal ratio uses the LB-BSP run's own speeds (target <= 1.10). BSP / LB-BSP at
Hetero-L3: target >= 1.8 (the paper's 2 workers at speeds 1 and 1/3 allow at most 2).
Statistical efficiency: training loss (batch-weighted minibatch loss) against samples
processed, BSP next to LB-BSP: with the same X per update and the weighted mean of
eq. 8 they should match to noise; ``final_loss`` is the mean over the last 20 % of samples.

Every protocol runs at every level in this one invocation, round-robin within each
repeat so load drifts hit them alike; medians over --repeats. Compare ratios, not
absolute times (the machine is shared). Writes <out>/bench_lbbsp.csv and .png.

    python experiments/bench_lbbsp.py --samples 60000 --repeats 3
    python experiments/bench_lbbsp.py --slow-by pause --levels homo,hetero-l3 --repeats 2
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_predictors import WorkerPinner, cpu_of, job_config, progress_printer, read_pushes  # noqa: E402

import numpy as np  # noqa: E402

LEVELS = ("homo", "hetero-l2", "hetero-l3")
LABELS = {"homo": "Homo", "hetero-l2": "Hetero-L2", "hetero-l3": "Hetero-L3"}
PROTOCOLS = ("BSP", "LB-BSP", "ASP")
COLORS = {"BSP": "#4878a8", "LB-BSP": "#c44e52", "ASP": "#55a868"}


def protocol_spec(label: str, predictor: str) -> dict:
    return {"BSP": {"name": "bsp"}, "LB-BSP": {"name": "lbbsp", "predictor": predictor},
            "ASP": {"name": "asp"}}[label]


def start_burners(level: str, workers: int) -> list:
    """The level's burners (LB-BSP §5.2), each pinned to its worker's CPU."""
    from tfsync.inject import CpuBurner, level_plan

    burners = []
    try:
        for w, spec in enumerate(level_plan(level, workers)):
            if spec.processes:
                burners.append(CpuBurner(spec.duty, cpus={cpu_of(w)}, processes=spec.processes).start())
    except BaseException:
        for b in burners:
            b.stop()
        raise
    return burners


def analyse(pushes: list[dict], X: int, skip: float) -> dict:
    """Per-update time, per-worker speeds, the ideal time and the final loss of one run."""
    pushes = sorted(pushes, key=lambda r: r["time"])
    total = sum(p["batch_size"] for p in pushes)
    done, steady = 0, []
    for p in pushes:
        done += p["batch_size"]
        if done > skip * total:
            steady.append(p)
    if len(steady) < 3:
        raise SystemExit(f"only {len(steady)} pushes after the first {skip:.0%} of samples: raise --samples")
    span = steady[-1]["time"] - steady[0]["time"]
    per_update = X * span / sum(p["batch_size"] for p in steady[1:])
    workers = sorted({p["worker"] for p in pushes})
    speed = {w: sum(p["batch_size"] for p in steady if p["worker"] == w)
             / sum(p["compute_s"] for p in steady if p["worker"] == w) for w in workers}
    batch = {w: statistics.fmean(p["batch_size"] for p in steady if p["worker"] == w) for w in workers}
    ideal = X / sum(speed.values())
    tail, seen = [], 0
    for p in pushes:
        seen += p["batch_size"]
        if seen > 0.8 * total:
            tail.append(p)
    final_loss = sum(p["loss"] * p["batch_size"] for p in tail) / sum(p["batch_size"] for p in tail)
    return {"per_update_s": per_update, "ideal_s": ideal, "speed": speed, "batch": batch,
            "final_loss": final_loss}


def run_one(args, level: str, label: str, rep: int) -> tuple[dict, list[dict]]:
    from tfsync.cli.jobrun import run_job

    run_dir = os.path.join(args.out, "bench_lbbsp_runs", f"{level}_{label.lower()}_{rep}")
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = job_config(f"lbbsp-{level}-{label}", run_dir, protocol_spec(label, args.predictor),
                     model=args.model, batch_size=args.batch_size, samples=args.samples, lr=args.lr,
                     workers=args.workers, seed=args.seed)
    if args.slow_by == "pause":  # the level's speed share, exactly: slowdown 1 / share
        import dataclasses

        from tfsync.job.schema import Inject
        from tfsync.inject import level_plan
        cfg = dataclasses.replace(cfg, inject=tuple(
            Inject(worker=w, slowdown=1.0 / spec.share, start_s=0.0, duration_s=1e6)
            for w, spec in enumerate(level_plan(level, args.workers)) if spec.share < 1.0))
    pinner = WorkerPinner().start()
    try:
        summary = run_job(cfg, progress=progress_printer(20.0), data_path=args.data)
    finally:
        pinner.stop()
    pushes = read_pushes(run_dir)
    X = args.workers * args.batch_size
    a = analyse(pushes, X, args.skip)
    workers = sorted(a["speed"])
    row = {"level": level, "protocol": label, "repeat": rep, "per_update_s": round(a["per_update_s"], 4),
           "ideal_s": round(a["ideal_s"], 4), "ratio_to_ideal": round(a["per_update_s"] / a["ideal_s"], 3),
           "slowest_over_fastest": round(min(a["speed"].values()) / max(a["speed"].values()), 3),
           **{f"speed_w{w}": round(a["speed"][w], 1) for w in workers},
           **{f"batch_w{w}": round(a["batch"][w], 1) for w in workers},
           "final_loss": round(a["final_loss"], 4), "test_accuracy": summary["test_accuracy"],
           "train_s": round(summary["wall_s"] - summary["init_s"], 1), "updates": summary["updates"]}
    print(f"  {LABELS[level]:9s} {label:6s} #{rep}: {row['per_update_s']:.3f} s per {X} samples "
          f"(ideal {row['ideal_s']:.3f}, x{row['ratio_to_ideal']}), speeds "
          f"{[row[f'speed_w{w}'] for w in workers]}, batches {[row[f'batch_w{w}'] for w in workers]}, "
          f"final loss {row['final_loss']}", flush=True)
    return row, pushes


def medians(rows: list[dict]) -> list[dict]:
    out = []
    for level in dict.fromkeys(r["level"] for r in rows):
        for label in PROTOCOLS:
            mine = [r for r in rows if r["level"] == level and r["protocol"] == label]
            if not mine:
                continue
            m = {k: (statistics.median(r[k] for r in mine) if isinstance(mine[0][k], (int, float))
                     and not isinstance(mine[0][k], bool) else mine[0][k]) for k in mine[0]}
            m["repeat"] = "median"
            m["min_per_update_s"] = min(r["per_update_s"] for r in mine)
            m["max_per_update_s"] = max(r["per_update_s"] for r in mine)
            out.append(m)
    return out


def loss_curve(pushes: list[dict], bins: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """Batch-weighted mean loss in equal bins of samples processed."""
    pushes = sorted(pushes, key=lambda r: r["time"])
    done = np.cumsum([p["batch_size"] for p in pushes])
    edges = np.linspace(0, done[-1], bins + 1)
    idx = np.clip(np.searchsorted(edges, done, side="left") - 1, 0, bins - 1)
    w = np.array([p["batch_size"] for p in pushes], float)
    loss = np.array([p["loss"] for p in pushes])
    num, den = np.bincount(idx, w * loss, bins), np.bincount(idx, w, bins)
    centers = (edges[:-1] + edges[1:]) / 2
    ok = den > 0
    return centers[ok], num[ok] / den[ok]


def plot(path: str, summary: list[dict], runs: dict, level: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.2))
    levels = list(dict.fromkeys(r["level"] for r in summary))
    width = 0.8 / len(PROTOCOLS)
    for j, label in enumerate(PROTOCOLS):
        rows = [next((r for r in summary if r["level"] == lv and r["protocol"] == label), None) for lv in levels]
        x = [i + (j - 1) * width for i in range(len(levels))]
        y = [r["per_update_s"] if r else 0 for r in rows]
        err = [[r["per_update_s"] - r["min_per_update_s"] if r else 0 for r in rows],
               [r["max_per_update_s"] - r["per_update_s"] if r else 0 for r in rows]]
        a1.bar(x, y, width, yerr=err, color=COLORS[label], label=label, capsize=3)
    ideal = [next((r["ideal_s"] for r in summary if r["level"] == lv and r["protocol"] == "LB-BSP"), np.nan)
             for lv in levels]
    a1.scatter(range(len(levels)), ideal, marker="_", s=900, color="black", zorder=3, label="ideal X/sum(v)")
    a1.set_xticks(range(len(levels)), [LABELS[lv] for lv in levels])
    a1.set_ylabel("seconds per X = n*B samples")
    a1.set_title("per-update time (median, min-max)")
    a1.legend(fontsize=8)
    lb = runs.get((level, "LB-BSP"))
    if lb:
        for w in sorted({p["worker"] for p in lb}):
            mine = sorted((p for p in lb if p["worker"] == w), key=lambda p: p["round"])
            a2.plot([p["round"] for p in mine], [p["batch_size"] for p in mine], label=f"worker {w}")
        a2.set_xlabel("round")
        a2.set_ylabel("batch size")
        a2.set_title(f"LB-BSP batch sizes, {LABELS[level]}")
        a2.legend(fontsize=8)
    for label in ("BSP", "LB-BSP"):
        if (level, label) in runs:
            x, y = loss_curve(runs[(level, label)])
            a3.plot(x, y, color=COLORS[label], label=label)
    a3.set_xlabel("samples processed")
    a3.set_ylabel("training loss (batch-weighted)")
    a3.set_title(f"statistical efficiency, {LABELS[level]}")
    a3.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=60000, help="workload per run (samples)")
    p.add_argument("--levels", default=",".join(LEVELS), help="comma-separated: " + ", ".join(LEVELS))
    p.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma-separated: " + ", ".join(PROTOCOLS))
    p.add_argument("--repeats", type=int, default=3, help="runs per (level, protocol); medians reported")
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp", "linear"))
    p.add_argument("--batch-size", type=int, default=512,
                   help="B per worker (X = n*B); large enough that compute dwarfs the ~30 ms per round "
                        "the coordinator and PS take")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.01, help="eta per worker (BSP and LB-BSP run n*eta)")
    p.add_argument("--predictor", default="ema", help="LB-BSP's speed predictor (tfsync.predict name)")
    p.add_argument("--skip", type=float, default=0.1, help="share of each run's samples left out as warm-up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="MNIST .npz (default: ../shared/data)")
    p.add_argument("--out", default="results", help="results folder")
    p.add_argument("--slow-by", choices=("burner", "pause"), default="burner",
                   help="burner: competing processes pinned to the slowed worker's CPU (LB-BSP §5.2); "
                        "pause: the worker's task stopped for part of every 100 ms (tfsync.inject.pause), "
                        "which slows it by the level's factor exactly even where the PS and coordinator "
                        "share its CPU")
    args = p.parse_args(argv)
    levels = [lv.strip().lower() for lv in args.levels.split(",")]
    labels = [x.strip() for x in args.protocols.split(",")]
    bad = [lv for lv in levels if lv not in LEVELS] + [x for x in labels if x not in PROTOCOLS]
    if bad:
        raise SystemExit(f"unknown level or protocol {bad[0]!r}; valid: {', '.join(LEVELS + PROTOCOLS)}")
    os.makedirs(args.out, exist_ok=True)
    X = args.workers * args.batch_size
    print(f"{args.model}, {args.workers} workers (CPUs {[cpu_of(w) for w in range(args.workers)]}) + 1 PS, "
          f"B={args.batch_size}, X={X}, {args.samples} samples per run, levels {levels}, "
          f"{args.repeats} repeat(s)", flush=True)
    rows, runs = [], {}
    for level in levels:
        burners = start_burners(level, args.workers) if args.slow_by == "burner" else []
        try:
            print(f"{LABELS[level]}: burners {[b.describe() for b in burners]}", flush=True)
            for rep in range(args.repeats):
                for label in labels:
                    row, pushes = run_one(args, level, label, rep)
                    rows.append(row)
                    runs.setdefault((level, label), pushes)
        finally:
            for b in burners:
                b.stop()
    summary = medians(rows)
    name = "bench_lbbsp" + ("_pause" if args.slow_by == "pause" else "")
    path = os.path.join(args.out, name + ".csv")
    fields = list(dict.fromkeys(k for r in summary + rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(summary + rows)
    print("\nmedians:")
    for r in summary:
        print(f"  {LABELS[r['level']]:9s} {r['protocol']:6s} {r['per_update_s']:.3f} s per update "
              f"(ideal {r['ideal_s']:.3f}, x{r['ratio_to_ideal']:.3f}), final loss {r['final_loss']:.4f}, "
              f"test accuracy {r['test_accuracy']}")
    get = {(r["level"], r["protocol"]): r for r in summary}
    for level in levels:
        lb, bsp = get.get((level, "LB-BSP")), get.get((level, "BSP"))
        if lb:
            print(f"{LABELS[level]}: LB-BSP / ideal = {lb['per_update_s'] / lb['ideal_s']:.3f} (target <= 1.10)"
                  + (f", BSP / LB-BSP = {bsp['per_update_s'] / lb['per_update_s']:.2f}"
                     + (" (target >= 1.8)" if level == "hetero-l3" else "") if bsp else ""))
    plot(os.path.join(args.out, name + ".png"), summary, runs, levels[-1])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
