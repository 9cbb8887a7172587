"""BSP, ASP and Sync-Switch across separate hosts with network latency (issue 17): a
``tfsync testbed`` of N task nodes plus the coordinator's, every connection through the
latency relay, each node's one-way latency 0, 10 and 30 ms (the Sync-Switch paper
emulates 10 and 30 ms, paper 003 Sec. VI-A).

For each latency, the same job (MNIST, a wide MLP so that a step's pull and push are
large against its compute) runs as BSP, ASP and Sync-Switch (BSP for the first
``--switch-at`` of the workload, then ASP), configurations alternating within a repeat.
Reported per run: training time, samples/s, final test accuracy, and the time to reach
the BSP run's final accuracy (from evaluations during the run). Writes
results/bench_testbed.csv and .png.

    sudo python experiments/bench_testbed.py --nodes 4 --workers 4 --repeats 1

The machine has 2 cores: all tasks share them, so compute is slowed by the number of
tasks; the network share of a step grows with latency. Say so when quoting.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfsync.testbed.bed import Testbed  # noqa: E402

PROTOCOLS = {
    "bsp": '[[protocol]]\nname = "bsp"\n',
    "asp": '[[protocol]]\nname = "asp"\n',
    "sync-switch": '[[protocol]]\nname = "bsp"\nuntil = {at}\n[[protocol]]\nname = "asp"\n'
                   '[switch]\nmethod = "hot"\npoint = "job"\n',
}


def job_text(run_dir: str, protocol: str, args, bed: Testbed) -> str:
    return textwrap.dedent(f"""
        [job]
        name = "bench-testbed"
        run_dir = "{run_dir}"
        seed = 0
        [data]
        name = "mnist"
        [model]
        fn = "{os.path.join(ROOT, 'experiments', 'wide_mlp.py')}:build"
        args = {{hidden = {args.hidden}}}
        [train]
        loss = "SparseCategoricalCrossentropy"
        loss_args = {{from_logits = true}}
        epochs = {args.epochs}
        batch_size = 64
        learning_rate = 0.01
        checkpoint_every = 0
        eval_every = {args.eval_every}
        eval_samples = 2000
        timeout_s = 600
        """) + PROTOCOLS[protocol].format(at=args.switch_at) + bed.cluster_toml() + f"workers = {args.workers}\n"


def run_one(bed: Testbed, protocol: str, args, work: str) -> dict:
    run_dir = os.path.join(work, f"run-{protocol}")
    job = os.path.join(work, f"{protocol}.toml")
    with open(job, "w") as f:
        f.write(job_text(run_dir, protocol, args, bed))
    t0 = time.time()
    r = subprocess.run(bed.command("c", [sys.executable, "-m", "tfsync.cli", "run", job, "--no-report"]),
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{protocol} failed ({r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    return {"protocol": protocol, "wall_s": round(time.time() - t0, 2), "train_s": round(s["train_s"], 2),
            "samples_per_s": round(s["samples_per_s"], 1), "test_accuracy": round(s["test_accuracy"], 4),
            "evals": [(e["time"] - s["init_s"], e["accuracy"]) for e in s.get("evals", []) if "accuracy" in e]}


def time_to(evals, target: float) -> float | None:
    return next((round(t, 2) for t, acc in evals if acc >= target), None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--latencies", default="0,10,30", help="one-way ms per node, comma-separated")
    p.add_argument("--rate", default=None, help="every node's bandwidth (tc rate), default unshaped")
    p.add_argument("--epochs", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=512, help="the MLP's hidden width (wider: more to send)")
    p.add_argument("--eval-every", type=int, default=40)
    p.add_argument("--switch-at", type=float, default=0.25)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench_testbed"))
    args = p.parse_args(argv)
    rows = []
    bed = Testbed.up("bench", nodes=args.nodes, rate=args.rate, log=print)
    try:
        with tempfile.TemporaryDirectory(dir="/tmp") as work:   # /tmp: no node sees it
            for latency in [float(x) for x in args.latencies.split(",")]:
                for node in bed.nodes:
                    bed.set(node, latency_ms=latency)
                for repeat in range(args.repeats):
                    results = {name: run_one(bed, name, args, work) for name in PROTOCOLS}
                    target = results["bsp"]["test_accuracy"] - 0.005
                    for name, r in results.items():
                        row = {"latency_ms": latency, "repeat": repeat, "workers": args.workers,
                               **{k: v for k, v in r.items() if k != "evals"},
                               "target_accuracy": round(target, 4), "time_to_target_s": time_to(r["evals"], target)}
                        rows.append(row)
                        print(row, flush=True)
    finally:
        bed.down()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(rows, args.out + ".png", args)
    print(f"wrote {args.out}.csv and .png")
    return 0


def plot(rows, path, args) -> None:
    from matplotlib.figure import Figure

    latencies = sorted({r["latency_ms"] for r in rows})
    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2)
    width = 0.25
    for k, name in enumerate(PROTOCOLS):
        for ax, key in zip(axes, ("samples_per_s", "time_to_target_s")):
            values = []
            for lat in latencies:
                got = [r[key] for r in rows if r["latency_ms"] == lat and r["protocol"] == name and r[key] is not None]
                values.append(sum(got) / len(got) if got else 0)
            ax.bar([i + (k - 1) * width for i in range(len(latencies))], values, width, label=name)
    for ax, title in zip(axes, ("samples/s (higher is better)", "seconds to BSP's accuracy (lower is better)")):
        ax.set_xticks(range(len(latencies)), [f"{lat:g} ms" for lat in latencies])
        ax.set_xlabel("one-way latency per node")
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"{args.workers} workers + 1 PS on {args.nodes} testbed nodes (2 CPU cores shared), MNIST MLP "
                 f"{args.hidden} wide")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
