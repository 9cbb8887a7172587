"""Issue-6 benchmark 4: FluentPS (PSSP, lazy and soft) and ElasticBSP run real jobs to
completion on the local cluster (real TF task processes), next to BSP, ASP and SSP.

Worker 1 gets a larger batch (``--sizes 64,192``: 3x the work per step), so the workers
are uneven for real. Each protocol trains the same model for the same number of samples
on fresh clusters, one after another in this one invocation; compare the columns, not
absolute figures (the machine is shared). Writes results/bench_engine_protocols.csv/.png.

    python experiments/bench_engine_protocols.py --epochs 1 --model cnn
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

PROTOCOLS = [
    ("BSP", "bsp", {}),
    ("ASP", "asp", {}),
    ("SSP s=3", "ssp", {"staleness": 3}),
    ("PSSP s=3 c=0.5 lazy", "pssp", {"staleness": 3, "probability": 0.5, "execution": "lazy"}),
    ("PSSP s=3 c=0.5 soft", "pssp", {"staleness": 3, "probability": 0.5, "execution": "soft"}),
    ("PSSP s=3 dynamic", "pssp", {"staleness": 3, "probability": "dynamic"}),
    ("ElasticBSP R=15", "elastic_bsp", {"lookahead": 15}),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=float, default=1.0, help="workload per protocol, in passes over the data")
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp", "linear"))
    p.add_argument("--sizes", default="64,192", help="batch size per worker (comma-separated)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--data", default=None, help="MNIST .npz (default: ../shared/data or the bundled sample)")
    p.add_argument("--only", default=None, help="comma-separated protocol labels to run (default: all)")
    p.add_argument("--out", default="results", help="results folder")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tf_keras as keras

    from tfsync import policy as P
    from tfsync.base.data import load
    from tfsync.engine.generation import TrainSetup
    from tfsync.examples import images
    from tfsync.engine.engine import Engine
    from tfsync.engine.phase import Phase

    data = load("mnist", args.data)
    sizes = [int(s) for s in args.sizes.split(",")]
    setup = TrainSetup(
        lambda: getattr(images, args.model)(data.input_shape, data.num_classes),
        lambda: keras.optimizers.SGD(args.lr, momentum=0.9),
        lambda y, logits: keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True),
        data.x_train, data.y_train, max_batch_size=max(sizes), x_test=data.x_test, y_test=data.y_test)
    total = int(args.epochs * len(data.y_train))
    chosen = PROTOCOLS if not args.only else [c for c in PROTOCOLS if c[0] in args.only.split(",")]
    print(f"{args.model}, {len(sizes)} workers + 1 PS, batch sizes {sizes}, {total} samples per protocol")
    rows = []
    for label, name, opts in chosen:
        out = os.path.join(args.out, "bench_engine_protocols_runs", name + "_" + "_".join(
            f"{v}" for v in opts.values()))
        shutil.rmtree(out, ignore_errors=True)
        policy = P.get(name, sizer=P.FixedSizer(sizes), seed=0, **opts)
        engine = Engine(setup, workers=len(sizes), run_dir=out, tensorboard=False)
        s = engine.run([Phase(policy)], total_samples=total)
        stats = s["timeline"][0]["stats"]
        train_s = s["wall_s"] - s.get("init_s", 0.0)
        row = {"protocol": label, "wall_s": round(s["wall_s"], 2), "train_s": round(train_s, 2),
               "samples_per_s": round(s["samples"] / train_s, 1), "updates": s["updates"],
               "test_accuracy": s["test_accuracy"],
               "dpr_per_100_iterations": round(stats.get("dpr_per_100_iterations", 0.0), 1),
               "barriers": stats.get("barriers", ""),
               "mean_barrier_wait_s": round(stats["mean_barrier_wait"], 4) if "mean_barrier_wait" in stats else ""}
        rows.append(row)
        print("  " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_engine_protocols.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    labels = [r["protocol"] for r in rows]
    a1.barh(labels, [r["samples_per_s"] for r in rows], color="#4878a8")
    a1.set_xlabel("samples/s (training)")
    a2.barh(labels, [r["test_accuracy"] or 0 for r in rows], color="#55a868")
    a2.set_xlim(min(r["test_accuracy"] or 0 for r in rows) - 0.02, 1.0)
    a2.set_xlabel("test accuracy")
    a2.set_yticklabels([])
    fig.suptitle(f"{args.model}, batch sizes {sizes}, {total} samples each")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "bench_engine_protocols.png"), dpi=120)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
