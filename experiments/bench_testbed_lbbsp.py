"""LB-BSP across separate hosts (issue 17): BSP, LB-BSP (the paper's proportional rule
without a floor, and tfsync's default: the affine rule with a floor of a quarter of the even
split, issue 54), ASP and ``auto`` per update on a ``tfsync testbed`` whose
worker nodes differ, against the ideal X / sum(v) (LB-BSP Sec. 5.2; the same analysis
as bench_lbbsp.py, which runs on one host).

The PS runs on n1, worker 0 on n2, worker 1 on n3. Heterogeneity, one kind per run:
- ``cpu``: each worker node is a one-CPU machine (``--cpu``: the testbed's per-node CPU
  share, a cgroup quota over the hook and the tasks it starts), and n3 gets
  ``--slow-cpu`` of one CPU (1/3 by default: the paper's Hetero-L3 level);
- ``bandwidth``: n3's link is shaped to ``--slow-rate`` (tbf, both directions): worker 1's
  pull and push take longer, its compute does not.
LB-BSP sizes each worker's batch from its predicted speed (``--predictor``); per update
is the time for X = n * B samples in the steady part of a run (one round of BSP or
LB-BSP, n updates of ASP). The PS and the coordinator are not pinned. Targets: LB-BSP
<= 1.10x ideal, >= 1.5x faster than BSP.

Beside them, native ``model.fit`` under ParameterServerStrategy (asynchronous, as ASP),
with 1 and 32 steps per execution (``--fits``), on task servers started from TF_CONFIG
on the same nodes, in the same CPU shares and behind the same links
(``testbed_bench.run_fit``): its per-update time is X over its samples/s. It trains
whole epochs of FIT_EPOCH steps (each joins every worker at its end), so more samples
than tfsync's runs: its accuracy is not comparable, its rate is.

    sudo python experiments/bench_testbed_lbbsp.py --batch-size 2048 --samples 120000 --repeats 2

The machine has 2 cores: the PS, the coordinator and the relay share them with the
workers, so compute is slowed by contention. Compare ratios within one run, not times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from bench_lbbsp import analyse  # noqa: E402
from bench_predictors import read_pushes  # noqa: E402
import testbed_bench  # noqa: E402
from testbed_bench import FITS, fit_dir, run_fit, run_on_testbed, write_csv  # noqa: E402

from tfsync.testbed.bed import Testbed  # noqa: E402

PROTOCOLS = {"BSP": '[[protocol]]\nname = "bsp"\n',
             "LB-BSP paper": '[[protocol]]\nname = "lbbsp"\npredictor = "{p}"\nmodel = "proportional"\nfloor = 0.0\n',
             "LB-BSP": '[[protocol]]\nname = "lbbsp"\npredictor = "{p}"\n',   # affine, floor 0.25 (issue 54)
             "ASP": '[[protocol]]\nname = "asp"\n', "auto": '[[protocol]]\nname = "auto"\n'}
COLORS = {"BSP": "#4878a8", "LB-BSP paper": "#c44e52", "LB-BSP": "#dd8452", "ASP": "#55a868", "auto": "#8172b2",
          "fit": "#9a9a9a", "fit 32/exec": "#5a5a5a"}


def job_text(run_dir: str, label: str, args, bed: Testbed) -> str:
    return textwrap.dedent(f"""
        [job]
        name = "bench-testbed-lbbsp"
        run_dir = "{run_dir}"
        seed = 0
        [data]
        name = "mnist"
        [model]
        name = "{args.model}"
        [train]
        epochs = {args.samples / 60000}
        batch_size = {args.batch_size}
        learning_rate = {args.lr}
        checkpoint_every = 0
        timeout_s = 600
        """) + PROTOCOLS[label].format(p=args.predictor) + bed.cluster_toml() + "workers = 2\n"


def run_one(bed: Testbed, label: str, args, work: str) -> dict:
    name = label.lower().replace(" ", "-")
    run_dir = os.path.join(work, f"run-{name}")
    summary = run_on_testbed(bed, os.path.join(work, f"{name}.toml"), job_text(run_dir, label, args, bed),
                             run_dir)
    a = analyse(read_pushes(run_dir), 2 * args.batch_size, args.skip)
    return {"protocol": label, "per_update_s": round(a["per_update_s"], 4), "ideal_s": round(a["ideal_s"], 4),
            "ratio_to_ideal": round(a["per_update_s"] / a["ideal_s"], 3),
            **{f"speed_w{w}": round(v, 1) for w, v in sorted(a["speed"].items())},
            **{f"batch_w{w}": round(v, 1) for w, v in sorted(a["batch"].items())},
            "final_loss": round(a["final_loss"], 4), "test_accuracy": summary["test_accuracy"],
            "train_s": round(summary["train_s"], 1)}


def run_native(bed: Testbed, name: str, args, work: str) -> dict:
    """Native fit (``FITS[name]`` steps per execution) of the same job, per update as X / its rate."""
    run_dir = fit_dir(work, name)
    r = run_fit(bed, job_text(run_dir, "ASP", args, bed), run_dir, 2, FITS[name])
    return {"protocol": name, "per_update_s": round(2 * args.batch_size / r["samples_per_s"], 4),
            "test_accuracy": r["test_accuracy"], "train_s": r["train_s"], "samples": r["samples"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slow-by", default="cpu,bandwidth", help="comma-separated: cpu, bandwidth")
    p.add_argument("--slow-rate", default="10mbit", help="n3's link under --slow-by bandwidth (tc rate)")
    p.add_argument("--cpu", type=float, default=1.0, help="each worker node's CPU share, in CPUs")
    p.add_argument("--slow-cpu", type=float, default=1 / 3, help="n3's CPU share under --slow-by cpu, in CPUs")
    p.add_argument("--samples", type=int, default=30000, help="workload per run (samples)")
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp", "linear"))
    p.add_argument("--batch-size", type=int, default=512, help="B per worker; X = 2 * B per update")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--predictor", default="ema")
    p.add_argument("--skip", type=float, default=0.1, help="share of each run's samples left out as warm-up")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "results", "bench_testbed_lbbsp"))
    p.add_argument("--keep", default=None, metavar="DIR", help="keep each run's directory in DIR")
    p.add_argument("--fits", default=",".join(FITS), help="native fits beside tfsync, comma-separated ('' for none)")
    p.add_argument("--summarise", action="store_true",
                   help="only write the page's table (results/bench_testbed_lbbsp_links.md) from the CSV")
    args = p.parse_args(argv)
    if args.summarise:   # experiments/tables.py: the table, the command that made the CSV, its date
        import tables
        tables.write(tables.of_script("bench_testbed_lbbsp.py"))
        return 0
    rows = []
    bed = testbed_bench.up("benchlb", nodes=3, log=print, cpu=args.cpu)
    try:
        with testbed_bench.work_dir(args.keep) as work:
            for slow in args.slow_by.split(","):
                if slow == "cpu":
                    bed.set("n3", cpu=args.slow_cpu)
                if slow == "bandwidth":
                    bed.set("n3", rate=args.slow_rate)
                try:
                    for repeat in range(args.repeats):
                        runs = [(label, run_one) for label in PROTOCOLS]
                        runs += [(name, run_native) for name in args.fits.split(",") if name]
                        for label, run in runs:
                            row = {"slow_by": slow, "repeat": repeat, **run(bed, label, args, work)}
                            rows.append(row)
                            print(row, flush=True)
                finally:
                    bed.set("n3", rate="none", cpu=args.cpu)
    finally:
        bed.down()
    write_csv(args.out + ".csv", rows)
    plot(rows, args.out + ".png", args)
    for slow in dict.fromkeys(r["slow_by"] for r in rows):
        med = {label: statistics.median(r["per_update_s"] for r in rows if r["slow_by"] == slow
                                        and r["protocol"] == label) for label in labels(rows)}
        lb = ", ".join(f"{label} {med[label]:.3f} s (x{ideal(rows, slow, label) :.2f} ideal, BSP / it "
                       f"{med['BSP'] / med[label]:.2f})" for label in PROTOCOLS if label.startswith("LB-BSP"))
        native = "".join(f", {name} {med[name]:.3f} s" for name in FITS if name in med)
        print(f"{slow}: per update BSP {med['BSP']:.3f} s, {lb}, ASP {med['ASP']:.3f} s{native}")
    print(f"wrote {args.out}.csv and .png")
    return 0


def labels(rows) -> list[str]:
    """tfsync's protocols, then the native fits, as they ran."""
    return list(dict.fromkeys(r["protocol"] for r in rows))


def ideal(rows, slow: str, label: str) -> float:
    """The median of ``label``'s runs' per-update time over their own ideal X / sum(v): the
    speeds are each run's own (under a fixed per-step cost a worker's speed depends on its
    batch, so the ideal does too)."""
    return statistics.median(r["ratio_to_ideal"] for r in rows if r["slow_by"] == slow and r["protocol"] == label)


def plot(rows, path, args) -> None:
    from matplotlib.figure import Figure

    kinds = list(dict.fromkeys(r["slow_by"] for r in rows))
    names = labels(rows)
    fig = Figure(figsize=(9, 4.2))
    ax = fig.subplots()
    width = 0.8 / len(names)
    for j, label in enumerate(names):
        values = [statistics.median(r["per_update_s"] for r in rows if r["slow_by"] == k and r["protocol"] == label)
                  for k in kinds]
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(kinds))]
        ax.bar(xs, values, width, color=COLORS[label],
               label=f"native {label}" if label in FITS else f"tfsync {label}")
        if label.startswith("LB-BSP"):   # its own ideal, from its runs' speeds
            ideals = [statistics.median(r["ideal_s"] for r in rows if r["slow_by"] == k and r["protocol"] == label)
                      for k in kinds]
            ax.scatter(xs, ideals, marker="_", s=200, color="black", zorder=3,
                       label="ideal X/sum(v)" if j == 1 else None)
    ax.set_xticks(range(len(kinds)), [f"slow worker by {k}" + (f" ({args.slow_rate})" if k == "bandwidth" else
                                                                f" ({args.slow_cpu:.2g} CPU)") for k in kinds])
    ax.set_ylabel(f"seconds per X = 2 x {args.batch_size} samples")
    ax.set_title(f"LB-BSP on the testbed: 2 workers on 2 nodes of {args.cpu:g} CPU, PS on a third ({args.model}, "
                 f"median of {args.repeats})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
