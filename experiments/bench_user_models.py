"""tfsync next to native ``model.fit`` on models of the user's own (issue 16): the CIFAR-10
ResNet example (examples/cifar10_resnet, ResNet-20, SGD momentum, step decay) and a fast
small model (examples/regression, a tabular MLP with Adam: a step of a few milliseconds).

For each job file: plain tf_keras ``model.fit`` under ParameterServerStrategy (which is
ASP), tfsync ASP and tfsync BSP, with the job's own model, data, loss and optimizer
(tfsync.engine.workload), on fresh local clusters (2 workers + 1 PS), steps/s of the steady part;
and, for reference, fit with as many steps per execution as a tfsync closure runs.
Configurations alternate within each repeat, so drifting load hits all alike; the median
of the repeats is reported. Targets (issue 16): ASP >= 0.9x native, BSP >= 0.8x.
Writes results/bench_user_models.csv and .png.

    python experiments/bench_user_models.py --repeats 2
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_engine import steady_rate  # noqa: E402
from testbed_bench import read_csv, write_csv  # noqa: E402


# fit told to run 32 steps per dispatch (not the default), as every benchmark tunes it: shown
# beside the targets, which compare with fit as users run it
STEPS_PER_EXECUTION = 32
SPE = f"native fit, {STEPS_PER_EXECUTION} steps/execution"

CIFAR = os.path.join(ROOT, "..", "shared", "data", "cifar10_subset.npz")
MODELS = {  # name: (job file, --set overrides, steps per configuration)
    "resnet20 (CIFAR-10)": ("examples/cifar10_resnet/job.toml", [f"data.args={{path = \"{CIFAR}\", limit = 4000}}"], 80),
    "tabular MLP (regression)": ("examples/regression/job.toml", [], 2000),
}


def workload(job: str, overrides: list[str]):
    from tfsync.job.config import load_job
    from tfsync.engine.workload import Workload

    cfg = load_job(os.path.join(ROOT, job), overrides=overrides)
    return cfg, Workload.from_config(cfg)


def native_fit(work, batch: int, steps: int, workers: int, per_execution: int = 1, decode=None) -> float:
    """Plain model.fit under ParameterServerStrategy: steps/s of its 2nd epoch
    (``per_execution``: fit's ``steps_per_execution``, 1 by default; ``decode``: see
    ``fit_rate``)."""
    from tfsync.engine.cluster import LocalCluster, connect_strategy

    with LocalCluster(workers=workers, ps=1) as cluster:
        return fit_rate(connect_strategy(cluster), work, batch, steps, per_execution, decode)


def fit_dataset(work, batch: int, decode=None):
    """``model.fit``'s input under ParameterServerStrategy: ``work``'s training arrays,
    shuffled, repeated, in batches of ``batch`` on each worker. ``decode(x, y)``: mapped
    over each batch, where the arrays travel to the workers in a smaller form (uint8 images)."""
    import tensorflow as tf
    import tf_keras as keras

    x, y = work.x_train, work.y_train

    def dataset_fn(_):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y)).repeat()
        ds = ds.batch(batch, drop_remainder=True)
        return (ds.map(decode) if decode is not None else ds).prefetch(2)

    return keras.utils.experimental.DatasetCreator(dataset_fn)


def fit_rate(strategy, work, batch: int, steps: int, per_execution: int = 1, decode=None) -> float:
    """Steps/s of the 2nd epoch of ``model.fit`` with ``work``'s model, data, loss and
    optimizer on ``strategy`` (a ParameterServerStrategy), input as ``fit_dataset``."""
    import tf_keras as keras

    with strategy.scope():
        model = work.model_fn()
        model.compile(work.optimizer_fn(), lambda t, p: work.loss_fn(t, p), steps_per_execution=per_execution)
    times = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            times.append(time.time())

    model.fit(fit_dataset(work, batch, decode), epochs=2, steps_per_epoch=steps,
              callbacks=[Clock()], verbose=0)
    return steps / (times[1] - times[0])


def tfsync_rate(work, protocol: str, batch: int, steps: int, workers: int, out_dir: str, policy=None) -> float:
    """Steps/s of the steady part of a tfsync run of ``protocol`` (or ``policy``, a
    Policy already made) with ``work``'s model, data, loss and optimizer."""
    from tfsync import policy as P
    from tfsync.engine.generation import TrainSetup
    from tfsync.engine.engine import Engine
    from tfsync.engine.phase import Phase

    setup = TrainSetup(work.model_fn, work.optimizer_fn, work.loss_fn, work.x_train, work.y_train,
                       max_batch_size=batch)
    shutil.rmtree(out_dir, ignore_errors=True)
    engine = Engine(setup, workers=workers, run_dir=out_dir, tensorboard=False)
    policy = policy if policy is not None else P.get(protocol, sizer=P.BatchSizer(batch))
    engine.run([Phase(policy)], total_samples=steps * batch)
    return steady_rate(out_dir)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every model's step count")
    p.add_argument("--models", default=None, help=f"comma-separated model names (default all: {', '.join(MODELS)}); "
                   "the others keep their rows in OUT's CSV")
    p.add_argument("--out", default=os.path.join(ROOT, "results"))
    args = p.parse_args(argv)
    runs = os.path.join(args.out, "bench_user_models_runs")
    rows = []
    names = list(MODELS) if args.models is None else [m.strip() for m in args.models.split(",")]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown model {unknown[0]!r}; valid: {', '.join(MODELS)}")
    chosen = {m: MODELS[m] for m in names}
    for name, (job, overrides, steps) in chosen.items():
        cfg, work = workload(job, overrides)
        batch, steps = cfg.train.batch_size, int(steps * args.scale)
        print(f"{name}: {job}, batch {batch} per worker, {steps} steps per configuration", flush=True)
        rates: dict[str, list[float]] = {"native fit": [], "tfsync ASP": [], "tfsync BSP": [], SPE: []}
        for rep in range(args.repeats):
            rates["native fit"].append(native_fit(work, batch, steps, args.workers))
            rates[SPE].append(native_fit(work, batch, steps, args.workers, per_execution=STEPS_PER_EXECUTION))
            for protocol in ("asp", "bsp"):
                rates[f"tfsync {protocol.upper()}"].append(
                    tfsync_rate(work, protocol, batch, steps, args.workers, os.path.join(runs, protocol)))
            print(f"  repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()), flush=True)
        native = float(np.median(rates["native fit"]))
        for config, values in rates.items():
            rate = float(np.median(values))
            rows.append({"model": name, "configuration": config, "steps_per_s": round(rate, 3),
                         "samples_per_s": round(rate * batch, 1), "ratio_to_native": round(rate / native, 3),
                         "runs": " ".join(f"{v:.2f}" for v in values)})
            print(f"  {config:<12} {rate:8.2f} steps/s  {rate * batch:9.0f} samples/s  {rate / native:5.2f}x native")
    shutil.rmtree(runs, ignore_errors=True)
    path = os.path.join(args.out, "bench_user_models.csv")
    if os.path.exists(path):   # the models not run this time keep their rows (--models)
        rows = [r for r in read_csv(path) if r["model"] not in chosen] + rows
    write_csv(path, rows)
    plot(rows, os.path.join(args.out, "bench_user_models.png"))
    print(f"wrote {path}")
    return 0


def plot(rows, path: str) -> None:
    from matplotlib.figure import Figure

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig = Figure(figsize=(9, 3.2), layout="constrained")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, m in zip(axes, models):
        mine = [r for r in rows if r["model"] == m]
        bars = ax.bar([r["configuration"].replace(", ", ",\n") for r in mine], [r["ratio_to_native"] for r in mine],
                      color=["#9a9a9a", "#e08040", "#4878a8", "#c8c8c8"])
        for b, r in zip(bars, mine):
            ax.annotate(f"{r['ratio_to_native']:.2f}x\n{r['samples_per_s']:,.0f}/s", (b.get_x() + b.get_width() / 2,
                        b.get_height()), ha="center", va="bottom", fontsize=8)
        ax.axhline(0.9, color="#e08040", ls=":", lw=1)
        ax.axhline(0.8, color="#4878a8", ls=":", lw=1)
        ax.set_ylim(0, max(1.35, 1.25 * max(r["ratio_to_native"] for r in mine)))
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(m)
        ax.set_ylabel("steps/s relative to model.fit")
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
