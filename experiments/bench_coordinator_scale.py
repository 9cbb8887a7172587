"""Scale of the coordinator (issue 30): pushes per second the engine sustains against the
worker count, for a tiny model on loopback, next to native ``model.fit`` under the same
ParameterServerStrategy cluster (``steps_per_execution`` 1 and 32).

A tiny model (the linear MNIST model, batch 16) makes every step cost almost nothing, so
the rate is what the control path allows. For each worker count (2, 4, 8, 16 by
default), in one invocation, on fresh local clusters: native fit (steps/s of its second
epoch), then tfsync's configurations (``--protocols``: ASP, SSP, BSP and LB-BSP by
default; pushes/s of the steady part). Beside each tfsync rate,
the coordinator's own CPU: the CPU seconds this process (the coordinator: the engine's
loop, its fetch and drain threads, TF's client) used per push, and the cores it kept
busy. One core's worth of CPU time divided by the CPU per push is the rate at which the
coordinator alone would saturate a core (``coordinator_limit_pushes_per_s``); where the
measured rate is far below it, something else (the PS, the tasks' CPUs) is the limit.

On a machine with fewer cores than tasks every process shares them: the rates then fall
with the worker count for every configuration alike, and the coordinator's CPU per push
is the number that carries to a bigger machine. Each tfsync run also gives the tasks'
mean memory (proportional set size: the fork server's shared pages split among the
tasks). ``asp8`` is ASP at depth 8 alone (``queue_s = 0``), as it granted before
2026-11-29. Writes results/bench_coordinator_scale.csv and .png.

    python experiments/bench_coordinator_scale.py --workers 2,4,8,16 --steps 1500
    python experiments/bench_coordinator_scale.py --workers 32 --steps 1500 --protocols asp,bsp --out /tmp/w32
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from types import SimpleNamespace
from typing import NamedTuple

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from bench_engine import steady_window  # noqa: E402
from bench_user_models import native_fit  # noqa: E402
from testbed_bench import write_csv  # noqa: E402

MODEL, BATCH, LR = "linear", 16, 0.05


def linear_work(data) -> SimpleNamespace:
    """The tiny model, its data, loss and optimizer, as ``bench_user_models`` takes them."""
    import tf_keras as keras

    from tfsync.examples import images
    return SimpleNamespace(
        x_train=data.x_train, y_train=data.y_train, optimizer_fn=lambda: keras.optimizers.SGD(LR),
        model_fn=lambda: getattr(images, MODEL)(data.input_shape, data.num_classes),
        loss_fn=lambda y, logits: keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


def fit(data, workers: int, steps: int, per_execution: int) -> float:
    """Native fit's global steps/s (``bench_user_models.native_fit``). The images travel to
    each worker as uint8, four times smaller: a 16-worker run with float32 images ran out
    of a 24 GiB machine's memory."""
    import tensorflow as tf

    work = SimpleNamespace(**{**vars(linear_work(data)), "x_train": np.round(data.x_train * 255).astype(np.uint8)})
    return native_fit(work, BATCH, steps - steps % per_execution, workers, per_execution,
                      decode=lambda x, y: (tf.cast(x, tf.float32) / 255, y))


class Config(NamedTuple):
    protocol: str
    options: dict
    label: str
    style: str


# asp8: ASP's depth 8 alone (before queue_s)
PROTOCOLS = {"asp": Config("asp", {}, "tfsync ASP", "o-"),
             "asp8": Config("asp", {"queue_s": 0.0}, "tfsync ASP, depth 8 (before)", "o:"),
             "ssp": Config("ssp", {}, "tfsync SSP s=3", "^-"), "bsp": Config("bsp", {}, "tfsync BSP", "s-"),
             "lbbsp": Config("lbbsp", {}, "tfsync LB-BSP", "d-")}


def tfsync_run(data, workers: int, steps: int, protocol: str, out_dir: str) -> tuple[float, float, float, float]:
    """(pushes/s of the steady part, coordinator CPU seconds per push and coordinator
    cores busy over that same part, the tasks' largest mean memory in MB) of a run of
    ``steps`` pushes."""
    import threading

    from tfsync import policy as P
    from tfsync.engine.generation import TrainSetup
    from tfsync.engine.engine import Engine
    from tfsync.engine.phase import Phase

    work = linear_work(data)
    name, options = PROTOCOLS[protocol][:2]
    setup = TrainSetup(work.model_fn, work.optimizer_fn, work.loss_fn, work.x_train, work.y_train,
                       max_batch_size=BATCH * (4 if name == "lbbsp" else 1))   # (LB-BSP sizes up to 4x)
    shutil.rmtree(out_dir, ignore_errors=True)
    me, samples, memory, done = psutil.Process(), [], [], threading.Event()

    def sample():   # (Unix time, this process's CPU seconds), every 50 ms; the tasks' memory every 10 s
        while not done.wait(0.05):
            # (less this thread's own: reading the tasks' memory maps costs tens of ms)
            samples.append((time.time(), sum(me.cpu_times()[:2]) - time.thread_time()))
            if len(samples) % 200 == 100:   # (5 s in, then every 10 s)
                memory.append(task_pss_mb(me))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    engine = Engine(setup, workers=workers, run_dir=out_dir, tensorboard=False)
    try:
        policy = P.make(name, P.BatchSizer(BATCH), **options)
        summary = engine.run([Phase(policy)], total_samples=steps * BATCH)
    finally:
        done.set()
        sampler.join()
    first, last, pushes = steady_window(out_dir)
    t, c = np.array(samples).T
    base = summary["started_at"]
    used = np.interp(base + last, t, c) - np.interp(base + first, t, c)
    return pushes / (last - first), used / pushes, used / (last - first), max(memory, default=float("nan"))


def task_pss_mb(me) -> float:
    """The tasks' mean proportional set size (MB): each shared page counted once, split
    among the processes that share it (the fork server's pages: tfsync.engine.launcher)."""
    sizes = []
    for child in me.children(recursive=True):
        try:
            sizes.append(child.memory_full_info().pss / 2 ** 20)
        except psutil.Error:
            pass
    return float(np.mean(sizes)) if sizes else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="2,4,8,16", help="worker counts, comma-separated")
    p.add_argument("--steps", type=int, default=400, help="pushes (fit: steps per epoch) per configuration")
    p.add_argument("--data", default=None, help="MNIST .npz (default: ../shared/data or the bundled sample)")
    p.add_argument("--out", default="results", help="results folder")
    p.add_argument("--protocols", default="asp,ssp,bsp,lbbsp",
                   help=f"tfsync's configurations, comma-separated, of {', '.join(PROTOCOLS)}")
    args = p.parse_args(argv)
    protocols = args.protocols.split(",")
    if not set(protocols) <= set(PROTOCOLS):
        p.error(f"--protocols: comma-separated, of {', '.join(PROTOCOLS)}; got {args.protocols!r}")
    try:
        counts = [int(w) for w in args.workers.split(",")]
        if not counts or min(counts) < 1:
            raise ValueError
    except ValueError:
        p.error(f"--workers: comma-separated worker counts >= 1, got {args.workers!r}")
    if args.steps < 64:
        p.error(f"--steps: at least 64, got {args.steps}")
    from tfsync.base.data import load

    data = load("mnist", args.data)
    os.makedirs(args.out, exist_ok=True)
    runs = os.path.join(args.out, "bench_coordinator_scale_runs")
    rows = []
    print(f"{MODEL} model, batch {BATCH}, {args.steps} steps per configuration, {os.cpu_count()} cores here")
    for w in counts:
        row = {"workers": w, "fit": fit(data, w, args.steps, 1), "fit_32": fit(data, w, args.steps, 32)}
        for protocol in protocols:
            rate, per_push, cores, mb = tfsync_run(data, w, args.steps, protocol, os.path.join(runs, f"{protocol}{w}"))
            row.update({protocol: rate, f"{protocol}_coordinator_ms_per_push": 1000 * per_push,
                        f"{protocol}_coordinator_cores": cores,
                        f"{protocol}_coordinator_limit_pushes_per_s": 1.0 / per_push, f"{protocol}_task_pss_mb": mb})
        rows.append(row)
        print(f"  {w:>2} workers, steps/s: fit {row['fit']:6.1f}, fit x32 {row['fit_32']:6.1f}; " + ", ".join(
            f"{PROTOCOLS[q].label} {row[q]:6.1f} ({row[f'{q}_coordinator_ms_per_push']:.2f} ms coordinator CPU a push, "
            f"{row[f'{q}_coordinator_cores']:.2f} cores)" for q in protocols)
            + f"; {row[f'{protocols[0]}_task_pss_mb']:.0f} MB a task", flush=True)
    shutil.rmtree(runs, ignore_errors=True)
    csv_path = os.path.join(args.out, "bench_coordinator_scale.csv")
    write_csv(csv_path, [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in rows])
    _plot(rows, protocols, os.path.join(args.out, "bench_coordinator_scale.png"))
    print(f"wrote {csv_path}")
    return 0


def _plot(rows, protocols, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ws = [r["workers"] for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.6))
    for key, label, style in (("fit", "native fit", "o--"), ("fit_32", "native fit, 32 steps/execution", "s--"),
                              *((q, PROTOCOLS[q].label, PROTOCOLS[q].style) for q in protocols)):
        a1.plot(ws, [r[key] for r in rows], style, label=label)
    a1.set_xscale("log", base=2)
    a1.set_xticks(ws, [str(w) for w in ws])
    a1.set_xlabel("workers")
    a1.set_ylabel("steps (pushes) / s, whole cluster")
    a1.set_title(f"tiny model on loopback, {os.cpu_count()} cores")
    a1.set_ylim(bottom=0)
    a1.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    for q in protocols:
        a2.plot(ws, [r[f"{q}_coordinator_ms_per_push"] for r in rows], PROTOCOLS[q].style, label=PROTOCOLS[q].label)
    a2.set_xscale("log", base=2)
    a2.set_xticks(ws, [str(w) for w in ws])
    a2.set_xlabel("workers")
    a2.set_ylabel("coordinator CPU ms per push")
    a2.axhline(0.2, color="grey", lw=0.8, ls="--")   # issue 55's targets: 0.2 ms (ASP), 0.1 ms (BSP)
    a2.axhline(0.1, color="grey", lw=0.8, ls=":")
    a2.set_ylim(bottom=0)
    a2.set_title("the coordinator's cost of a push")
    a2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
