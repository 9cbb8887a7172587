"""Benchmark: the per-step overhead of the coordinator-side training hook (issue 3).

Runs the example job (MNIST CNN, 2 workers + 1 PS on this machine) with the embedded
manager attached, and reports the time the engine's loop spent handing records to the
manager link and polling it for commands, per push and as a share of the step time
(LB-BSP reports 1.1 % for its own hook; our target is < 0.5 %). Writes
results/bench_control_overhead.csv.

    python experiments/bench_control_overhead.py [--epochs 0.5]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", default="jobs/mnist.toml")
    p.add_argument("--epochs", type=float, default=0.5)
    p.add_argument("--out", default="results")
    args = p.parse_args(argv)
    from tfsync.job.config import load_job
    from tfsync.cli.jobrun import run_job
    from tfsync.manager import embedded

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("TFSYNC_HOME", os.path.join(tmp, "home"))
        cfg = load_job(args.job)
        cfg = dataclasses.replace(cfg, job=dataclasses.replace(cfg.job, run_dir=os.path.join(tmp, "run")),
                                  train=dataclasses.replace(cfg.train, epochs=args.epochs))
        manager = embedded.start(cfg.job.run_dir, cfg.job.name, dataclasses.asdict(cfg), cfg.cluster.workers,
                                 cfg.protocol[0].name)
        try:
            summary = run_job(cfg, controller=manager.link)
        finally:
            manager.finish("done")
        from tfsync.manager.store import Store
        with Store(os.path.join(os.environ["TFSYNC_HOME"], "jobs.db")) as store:
            stored = len(store.steps(manager.run_id))
        steps = [json.loads(line) for line in open(os.path.join(cfg.job.run_dir, "metrics.jsonl"))]
        compute = statistics.fmean(r["compute_s"] for r in steps if "worker" in r)
    per_push = summary["control_s"] / summary["pushes"]
    row = {"pushes": summary["pushes"], "wall_s": summary["wall_s"], "control_s": summary["control_s"],
           "control_us_per_push": round(per_push * 1e6, 2), "mean_step_s": round(compute, 5),
           "overhead_pct_of_step": round(100 * per_push / compute, 4),
           "overhead_pct_of_wall": round(100 * summary["control_s"] / summary["wall_s"], 4),
           "records_in_store": stored, "records_dropped": manager.link.dropped}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_control_overhead.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    print(f"{row['pushes']} pushes: the training hook took {row['control_us_per_push']} us per push = "
          f"{row['overhead_pct_of_step']} % of a step ({row['mean_step_s'] * 1e3:.1f} ms), "
          f"{row['overhead_pct_of_wall']} % of the run; {stored} step records reached the job store, "
          f"{row['records_dropped']} dropped (target < 0.5 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
