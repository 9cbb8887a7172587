"""What the background evaluation costs the workers: the same job (MNIST CNN, 2 workers,
BSP then ASP) with train.eval_every off and on, alternating, through `tfsync run --json`.
The engine's loop never waits for an evaluation; on a machine whose cores the workers
already fill, the evaluation's own CPU time is what slows them. Prints samples/s of
both and their ratio; writes results/bench_eval_overhead.csv.

    python experiments/bench_eval_overhead.py --repeats 2   # ~6 min here
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = """[job]
name = "evalcost"
run_dir = "{run_dir}"
[model]
name = "cnn"
[train]
epochs = {epochs}
eval_every = {every}
eval_samples = {samples}
checkpoint_every = 0
"""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data", "mnist.npz"))
    p.add_argument("--out", default=os.path.join(HERE, "..", "results"))
    p.add_argument("--work", default="/tmp/bench_eval_overhead")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--every", type=int, default=75, help="steps between evaluations (~25 per epoch)")
    p.add_argument("--eval-samples", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for r in range(a.repeats):
        for every in (0, a.every):
            path = os.path.join(a.work, f"job_{every}.toml")
            with open(path, "w") as f:
                f.write(JOB.format(run_dir=os.path.join(a.work, f"run_{every}"), epochs=a.epochs, every=every,
                                   samples=a.eval_samples))
            out = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", path, "--json", "--no-manager",
                                  "--data", os.path.abspath(a.data)], capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(out.stderr.strip().splitlines()[-1])
            s = json.loads(out.stdout)
            train = s["wall_s"] - s["init_s"]
            rows.append({"repeat": r, "eval_every": every, "evals": len(s["evals"]), "train_s": round(train, 3),
                         "samples_per_s": round(s["samples"] / train, 1), "skipped": s["evals_skipped"]})
            print(rows[-1], flush=True)
    off = statistics.fmean(x["samples_per_s"] for x in rows if x["eval_every"] == 0)
    on = statistics.fmean(x["samples_per_s"] for x in rows if x["eval_every"])
    print(f"samples/s without evaluation {off:.0f}, with {on:.0f}: the evaluation costs {100 * (1 - on / off):.1f} %")
    path = os.path.join(a.out, "bench_eval_overhead.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("wrote", path)


if __name__ == "__main__":
    main()
