"""Simulator scheduling throughput (issue benchmark 3): pushes per second of wall time
when ``tfsync.sim`` only schedules (no model, ``record=False``), for 10, 100 and 1000
workers under ASP, SSP(s=3), BSP, PSSP(s=3, c=0.5) and ElasticBSP (R=15).

The issue's target: 1000 workers x 100 000 pushes of scheduling in under 10 s. Every
run uses the same speed model (f_w ~ U(1, 2) from --seed, jitter 0.1, p = 0.3 stragglers
of N(0.1, 0.03) s); each (n, policy) is timed --repeats times with time.perf_counter,
round-robin over the configurations so load drifts hit them alike, and the median is
kept. ``pushes`` counts every push including the steps already granted when the limit
is reached (the drain), and pushes/s divides that count by the wall time. A policy whose
median at the largest n is more than --profile-ratio times the median of the others is
profiled once with cProfile (top functions printed and written next to the CSV).
Writes <out>/bench_sim_throughput.csv and .png.

    python experiments/bench_sim_throughput.py --pushes 100000 --repeats 3
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import io
import os
import pstats
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))
from tfsync import policy as policies  # noqa: E402
from tfsync.sim import Simulator, SpeedModel  # noqa: E402

POLICIES = {
    "asp": "asp",
    "ssp": {"name": "ssp", "staleness": 3},
    "bsp": "bsp",
    "pssp": {"name": "pssp", "staleness": 3, "probability": 0.5},
    "elastic_bsp": {"name": "elastic_bsp", "lookahead": 15},
}
LABELS = {"asp": "ASP", "ssp": "SSP s=3", "bsp": "BSP", "pssp": "PSSP s=3 c=0.5", "elastic_bsp": "ElasticBSP R=15"}


def speed_model(n: int, seed: int) -> SpeedModel:
    rng = random.Random(seed)
    factors = [rng.uniform(1.0, 2.0) for _ in range(n)]
    return SpeedModel(fixed=0.02, per_sample=0.001, jitter=0.1, straggle_p=0.3, straggle_mean=0.1,
                      straggle_std=0.03, factors=factors, seed=seed)


def make_policy(key: str, seed: int):
    spec = POLICIES[key]
    spec = dict(spec) if isinstance(spec, dict) else {"name": spec}
    return policies.get({**spec, "seed": seed})


def one_run(key: str, n: int, pushes: int, seed: int) -> dict:
    sim = Simulator(n, speed_model(n, seed), record=False)
    pol = make_policy(key, seed)
    t0 = time.perf_counter()
    res = sim.run(pol, pushes=pushes)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "pushes": res.pushes, "sim_time": res.time, "updates": res.updates}


def run(args):
    timings = {(n, k): [] for n in args.workers for k in args.policies}
    for rep in range(args.repeats):
        for n in args.workers:
            for k in args.policies:
                r = one_run(k, n, args.pushes, args.seed)
                timings[(n, k)].append(r)
                print(f"  repeat {rep + 1}/{args.repeats} n={n:5d} {LABELS[k]:16s} {r['wall_s']:7.3f} s "
                      f"{r['pushes'] / r['wall_s']:10.0f} pushes/s", flush=True)
    rows = []
    for (n, k), rs in timings.items():
        wall = statistics.median(r["wall_s"] for r in rs)
        pushes = rs[0]["pushes"]  # deterministic: the same every repeat
        scaled = wall * args.pushes / pushes  # wall time for exactly --pushes pushes
        rows.append({"n": n, "policy": k, "label": LABELS[k], "pushes": pushes, "repeats": len(rs),
                     "median_wall_s": wall, "min_wall_s": min(r["wall_s"] for r in rs),
                     "max_wall_s": max(r["wall_s"] for r in rs), "pushes_per_s": pushes / wall,
                     "us_per_push": 1e6 * wall / pushes, "wall_s_per_target_pushes": scaled,
                     "meets_target": scaled < args.target_s, "sim_time": rs[0]["sim_time"],
                     "updates": rs[0]["updates"]})
    return rows


def print_table(rows, args):
    print(f"\nScheduling only, {args.pushes} pushes per run, median of {args.repeats} "
          f"(target: {args.pushes} pushes in < {args.target_s:g} s at n = 1000)")
    head = ["n", "policy", "pushes", "median s", "min s", "max s", "pushes/s", "us/push", "s/100k", "< target"]
    widths = [6, 16, 8, 9, 8, 8, 10, 8, 8, 9]
    print(" ".join(f"{h:>{w}s}" if i != 1 else f"{h:<{w}s}" for i, (h, w) in enumerate(zip(head, widths))))
    for r in sorted(rows, key=lambda r: (r["n"], args.policies.index(r["policy"]))):
        cells = [r["n"], r["label"], r["pushes"], f"{r['median_wall_s']:.3f}", f"{r['min_wall_s']:.3f}",
                 f"{r['max_wall_s']:.3f}", f"{r['pushes_per_s']:.0f}", f"{r['us_per_push']:.1f}",
                 f"{r['wall_s_per_target_pushes']:.2f}", "yes" if r["meets_target"] else "NO"]
        print(" ".join(f"{c!s:>{w}s}" if i != 1 else f"{c!s:<{w}s}" for i, (c, w) in enumerate(zip(cells, widths))))
    print(f"s/100k: median wall time scaled to exactly {args.pushes} pushes (runs overshoot by the drain)")


def profile_slow(rows, args):
    """cProfile a policy whose time at the largest n is far above the others'."""
    n = max(args.workers)
    at_n = {r["policy"]: r["median_wall_s"] for r in rows if r["n"] == n}
    out = []
    for k, wall in at_n.items():
        others = [v for kk, v in at_n.items() if kk != k]
        if (args.profile_all or (others and wall > args.profile_ratio * statistics.median(others))):
            prof = cProfile.Profile()
            prof.enable()
            one_run(k, n, args.pushes, args.seed)
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
            text = buf.getvalue()
            path = os.path.join(args.out, f"bench_sim_throughput_profile_{k}.txt")
            with open(path, "w") as f:
                f.write(text)
            print(f"\nprofile of {LABELS[k]} at n={n} ({wall:.2f} s vs median of others "
                  f"{statistics.median(others) if others else float('nan'):.2f} s), by own time; wrote {path}")
            print("\n".join(line for line in text.splitlines() if line.strip())[:4000])
            out.append(k)
    if not out:
        print(f"\nno policy above {args.profile_ratio:g}x the others' median at n={n}: nothing profiled")
    return out


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


def plot(rows, args, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, k in enumerate(args.policies):
        pts = sorted((r["n"], r["pushes_per_s"], r["wall_s_per_target_pushes"]) for r in rows if r["policy"] == k)
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=f"C{i}", label=LABELS[k])
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], "o-", color=f"C{i}", label=LABELS[k])
    axes[0].set(xscale="log", xlabel="workers n", ylabel="pushes per wall second", title="scheduling throughput")
    axes[1].axhline(args.target_s, color="k", ls="--", lw=0.8, label=f"target {args.target_s:g} s")
    axes[1].set(xscale="log", xlabel="workers n", ylabel=f"wall s per {args.pushes} pushes",
                title="time for the target's push count", ylim=(0, None))
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",") if x], default=[10, 100, 1000],
                    help="worker counts, comma-separated (10,100,1000)")
    ap.add_argument("--policies", type=lambda s: [x for x in s.split(",") if x], default=list(POLICIES),
                    help=f"comma-separated subset of {','.join(POLICIES)}")
    ap.add_argument("--pushes", type=int, default=100_000, help="pushes per run (100000)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per configuration; median kept (3)")
    ap.add_argument("--target-s", type=float, default=10.0, help="the issue's wall-time target in seconds (10)")
    ap.add_argument("--profile-ratio", type=float, default=2.0,
                    help="profile a policy slower than this times the others' median at the largest n (2)")
    ap.add_argument("--profile-all", action="store_true", help="profile every policy at the largest n")
    ap.add_argument("--seed", type=int, default=0, help="speed model and policy seed (0)")
    ap.add_argument("--out", default="results/", help="output folder (results/)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.policies) - set(POLICIES))
    if unknown:
        ap.error(f"unknown policies {unknown}; valid: {', '.join(POLICIES)}")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    rows = run(args)
    print_table(rows, args)
    write_csv(rows, os.path.join(args.out, "bench_sim_throughput.csv"))
    plot(rows, args, os.path.join(args.out, "bench_sim_throughput.png"))
    profile_slow(rows, args)
    print(f"total wall time {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
