"""Engine benchmark: steps/s of tfsync BSP, ASP and SSP next to plain tf_keras
``model.fit`` (which is ASP) on the same ParameterServerStrategy cluster shape and model,
and the restart and hot switch overheads as a share of a 10-minute run.

Every configuration runs in this one invocation, one after another, on fresh local
clusters (2 workers + 1 PS by default): compare the ratios, not absolute numbers, since
the machine is shared. Writes results/bench_engine.csv and .png.

    python experiments/bench_engine.py --steps 300 --model cnn
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402


def steady_window(run_dir: str, skip: float = 0.15) -> tuple[float, float, int]:
    """(first push time, last push time, pushes between) after skipping the first ``skip``
    share of a run's pushes: its steady part."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        t = [r["time"] for r in map(json.loads, f) if "worker" in r]
    t = t[int(len(t) * skip):]
    return t[0], t[-1], len(t) - 1


def steady_rate(run_dir: str, skip: float = 0.15) -> float:
    """Pushes/s between the first and last push, after skipping the first ``skip`` share."""
    first, last, pushes = steady_window(run_dir, skip)
    return pushes / (last - first)


def native_fit(data, model_name, workers, batch, steps, lr):
    """Plain tf_keras model.fit under ParameterServerStrategy: steps/s of the 2nd epoch."""
    import tensorflow as tf
    import tf_keras as keras

    from tfsync.engine.cluster import LocalCluster, connect_strategy
    from tfsync.examples import images

    with LocalCluster(workers=workers, ps=1) as cluster:
        strategy = connect_strategy(cluster)
        x = np.round(data.x_train * 255).astype(np.uint8)
        y = data.y_train

        def dataset_fn(_):
            ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y)).repeat()
            return ds.batch(batch, drop_remainder=True).map(
                lambda a, b: (tf.cast(a, tf.float32) / 255, b)).prefetch(2)

        with strategy.scope():
            model = getattr(images, model_name)(data.input_shape, data.num_classes)
            model.compile(keras.optimizers.SGD(lr, momentum=0.9),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          steps_per_execution=1)
        times = []

        class Clock(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                times.append(time.time())

        model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=2,
                  steps_per_epoch=steps, callbacks=[Clock()], verbose=0)
        return steps / (times[1] - times[0])


def tfsync_run(data, model_name, workers, batch, steps, lr, phases_spec, out_dir):
    import tf_keras as keras

    from tfsync import policy as P
    from tfsync.engine.generation import TrainSetup
    from tfsync.examples import images
    from tfsync.engine.engine import Engine
    from tfsync.engine.phase import Phase

    setup = TrainSetup(
        lambda: getattr(images, model_name)(data.input_shape, data.num_classes),
        lambda: keras.optimizers.SGD(lr, momentum=0.9),
        lambda y, l: keras.losses.sparse_categorical_crossentropy(y, l, from_logits=True),
        data.x_train, data.y_train, max_batch_size=batch)
    phases = [Phase(P.get(name, sizer=P.BatchSizer(batch), **opts), until=until, switch=switch)
              for name, opts, until, switch in phases_spec]
    shutil.rmtree(out_dir, ignore_errors=True)  # metrics.jsonl appends: start each run clean
    engine = Engine(setup, workers=workers, run_dir=out_dir, tensorboard=False)
    summary = engine.run(phases, total_samples=steps * batch)
    return steady_rate(out_dir), summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="steps (pushes) per configuration")
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp", "linear"))
    p.add_argument("--switch-steps", type=int, default=1200,
                   help="steps of each switch run (BSP for half, then ASP); the new tasks of a "
                        "restart start with the BSP phase, which must outlast TF's process start-up")
    p.add_argument("--repeats", type=int, default=2, help="alternating repeats of the speed runs (median)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--data", default=None, help="MNIST .npz (default: ../shared/data or the bundled sample)")
    p.add_argument("--out", default="results", help="results folder")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tfsync.base.data import load

    data = load("mnist", args.data)
    os.makedirs(args.out, exist_ok=True)
    runs = os.path.join(args.out, "bench_engine_runs")
    w, b, s, m, lr = args.workers, args.batch, args.steps, args.model, args.lr
    rows = []

    print(f"model {m}, {w} workers + 1 PS, batch {b}, {s} steps per configuration, "
          f"median of {args.repeats} alternating repeats")
    configs = [("tfsync ASP", [("asp", {}, 1.0, "hot")]),
               ("tfsync BSP", [("bsp", {}, 1.0, "hot")]),
               ("tfsync SSP s=3", [("ssp", {"staleness": 3}, 1.0, "hot")])]
    rates: dict[str, list[float]] = {"native fit (ASP)": []}
    for rep in range(args.repeats):  # alternate, so drifting machine load hits all alike
        rates["native fit (ASP)"].append(native_fit(data, m, w, b, s, lr))
        for name, spec in configs:
            rate, _ = tfsync_run(data, m, w, b, s, lr, spec, os.path.join(runs, name.split()[1].lower()))
            rates.setdefault(name, []).append(rate)
        print(f"  repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()))
    native = float(np.median(rates["native fit (ASP)"]))
    for name, values in rates.items():
        rate = float(np.median(values))
        rows.append((name, rate, rate / native, " ".join(f"{v:.1f}" for v in values)))
        print(f"  {name:<20}  {rate:7.1f} steps/s   {rate / native:5.2f}x native   (runs: {rows[-1][3]})")
    for method in ("hot", "restart"):
        spec = [("bsp", {}, 0.5, "hot"), ("asp", {}, 1.0, method)]
        _, summary = tfsync_run(data, m, w, b, args.switch_steps, lr, spec, os.path.join(runs, f"switch_{method}"))
        sw = summary["switches"][0]
        share = sw["overhead_s"] / 600
        parts = ", ".join(f"{k[:-2]} {v:.3f} s" for k, v in sw.items()
                          if k.endswith("_s") and k not in ("overhead_s", "switch_s", "start_new_s"))
        rows.append((f"{method} switch BSP->ASP", sw["overhead_s"], share, parts))
        print(f"  {method:>7} switch        {sw['overhead_s']:7.3f} s       {share:6.3%} of a 10-minute run  ({parts})")

    csv_path = os.path.join(args.out, "bench_engine.csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["configuration", "value", "ratio_or_share", "note"])
        writer.writerows(rows)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    speed = rows[:4]
    a1.bar([r[0].replace("tfsync ", "") for r in speed], [r[1] for r in speed], color="#4878a8")
    a1.set_ylabel("steps/s")
    a1.set_title(f"{m}, {w} workers + 1 PS, batch {b}")
    sw = rows[4:]
    a2.bar([r[0].split()[0] for r in sw], [r[1] for r in sw], color="#c0504d")
    a2.axhline(6.0, ls="--", c="gray", lw=1)
    a2.text(0.5, 6.0, "1 % of 10 min", va="bottom", ha="center", fontsize=8)
    a2.set_ylabel("switch overhead (s)")
    a2.set_title("BSP -> ASP switch")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "bench_engine.png"), dpi=120)
    print(f"wrote {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
