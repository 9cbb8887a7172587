"""What the testbed benchmarks share (bench_testbed*.py): the wide-MLP job that makes a
step's pull and push large against its compute, running a job file on the coordinator's
node, native ``model.fit`` on the same nodes (``run_fit``), and writing their rows as CSV.

``python testbed_bench.py --fit-chief JOB --spe N``: the chief of ``run_fit`` (on node c)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def up(*args, **kwargs):
    """``Testbed.up``, with SIGTERM (a bench stopped by kill or timeout) raising SystemExit
    as Ctrl-C raises KeyboardInterrupt, so the bench's ``finally: bed.down()`` runs and no
    namespace or process is left behind."""
    from tfsync.testbed.bed import Testbed

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return Testbed.up(*args, **kwargs)


def work_dir(keep: str | None):
    """Where the runs' directories go: ``keep`` (made if missing, left in place), else a
    temporary directory in /tmp (no node sees it) removed at the end."""
    if keep:
        os.makedirs(keep, exist_ok=True)
        return contextlib.nullcontext(keep)
    return tempfile.TemporaryDirectory(dir="/tmp")


def wide_mlp_job(name: str, run_dir: str, hidden: int, epochs: float, eval_every: int = 0) -> str:
    """The job file's [job], [data], [model] and [train] tables (protocols and cluster follow)."""
    evals = f"eval_every = {eval_every}\neval_samples = 2000\n" if eval_every else ""
    return textwrap.dedent(f"""
        [job]
        name = "{name}"
        run_dir = "{run_dir}"
        seed = 0
        [data]
        name = "mnist"
        [model]
        fn = "{os.path.join(HERE, 'wide_mlp.py')}:build"
        args = {{hidden = {hidden}}}
        [train]
        loss = "SparseCategoricalCrossentropy"
        loss_args = {{from_logits = true}}
        epochs = {epochs}
        batch_size = 64
        learning_rate = 0.01
        checkpoint_every = 0
        timeout_s = 600
        """) + evals


def run_on_testbed(bed, job_path: str, text: str, run_dir: str, timeout: float = 1800) -> dict:
    """Write ``text`` to ``job_path``, run it with `tfsync run` on the coordinator's node
    and return its summary.json (RuntimeError with the output's tail if it failed)."""
    with open(job_path, "w") as f:
        f.write(text)
    r = subprocess.run(bed.command("c", [sys.executable, "-m", "tfsync.cli", "run", job_path, "--no-report"]),
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{job_path} failed ({r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


FITS = {"fit": 1, "fit 32/exec": 32}   # native model.fit under ParameterServerStrategy: steps per execution
FIT_EPOCH = 128   # fit's steps between evaluations (an epoch: fit joins every worker at its end)
STARTED = "fit_training_started"   # what the chief writes in its directory when its timed training starts


def training_started(run_dir: str) -> bool:
    """tfsync's first phase began (its metrics), or native fit's warm-up ended (``STARTED``)."""
    if os.path.exists(os.path.join(run_dir, STARTED)):
        return True
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        with open(metrics) as f:
            return any('"event": "phase"' in line for line in f)
    return False


def fit_dir(work: str, name: str, tag: str = "") -> str:
    """The run directory of the native fit ``name`` (a FITS key) under ``work``."""
    return os.path.join(work, f"run-{name.replace(' ', '-').replace('/', '-')}{tag}")


def run_fit(bed, text: str, run_dir: str, workers: int, spe: int, epoch_steps: int = FIT_EPOCH) -> dict:
    """Native ``model.fit`` (ASP) of the job ``text`` on task servers started from
    TF_CONFIG on the nodes the hooks would have put tfsync's tasks on (the PS on n1, the
    workers on n2..; in their CPU shares and behind their links), its chief on node c;
    ``spe`` steps per execution, an evaluation every ``epoch_steps`` steps (a multiple of
    ``spe``). Returns ``fit_chief``'s numbers with the run's wall time."""
    from bench_control_path import chief, spec, task_servers

    os.makedirs(run_dir, exist_ok=True)
    job = os.path.join(run_dir, "job.toml")
    with open(job, "w") as f:
        f.write(text)
    cluster = spec(bed, workers)
    t0 = time.time()
    with task_servers(bed, cluster, run_dir):
        out = chief(bed, cluster, [sys.executable, os.path.abspath(__file__), "--fit-chief", job,
                                   "--spe", str(spe), "--epoch-steps", str(epoch_steps)], run_dir)
    r = json.loads(out.strip().splitlines()[-1])
    return {"wall_s": round(time.time() - t0, 2), **r, "last_eval_accuracy": round(r["evals"][-1][1], 4)}


def fit_chief(job: str, spe: int, epoch_steps: int = FIT_EPOCH) -> int:
    """On node c, as the chief of TF_CONFIG: ``model.fit`` for the job's samples (rounded
    up to whole epochs of ``epoch_steps`` steps of the job's batch size on each worker),
    evaluating at each epoch's end on the subset tfsync's evaluations use; prints one JSON
    line. First a warm-up epoch, whose training is undone (the weights set back; plain SGD
    keeps no other state): it holds the datasets' creation on the workers and the step's
    tracing, which tfsync's training time does not hold either; ``STARTED`` is written in
    the working directory when it ends. The evaluations' time is not counted."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from bench_user_models import fit_dataset
    from tfsync.engine.evaluator import accuracy
    from tfsync.engine.workload import Workload
    from tfsync.job.config import load_job

    cfg = load_job(job)
    work = Workload.from_config(cfg)
    batch = cfg.train.batch_size
    epochs = -(-int(cfg.train.epochs * len(work.y_train)) // (batch * epoch_steps))
    keep = np.sort(np.random.default_rng(0).choice(len(work.y_test), 2000, replace=False))   # as Evaluator's
    x_eval, y_eval = work.x_test[keep], work.y_test[keep]
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())
    with strategy.scope():
        model = work.model_fn()
        model.compile(work.optimizer_fn(), lambda t, p: work.loss_fn(t, p), steps_per_execution=spe)
    initial, local = model.get_weights(), work.model_fn()
    evals, clock = [], {}

    class Evaluate(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            t = time.time()
            if epoch == 0:   # the warm-up
                model.set_weights(initial)
                open(STARTED, "w").close()
                clock.update(t0=time.time(), paused=0.0)
                return
            local.set_weights(model.get_weights())
            evals.append((round(t - clock["t0"] - clock["paused"], 3), accuracy(local, x_eval, y_eval)))
            clock["paused"] += time.time() - t

    model.fit(fit_dataset(work, batch), epochs=epochs + 1, steps_per_epoch=epoch_steps, callbacks=[Evaluate()],
              verbose=0)
    train_s = evals[-1][0]
    samples = epochs * epoch_steps * batch
    print(json.dumps({"train_s": round(train_s, 2), "samples": samples, "samples_per_s": round(samples / train_s, 1),
                      "test_accuracy": round(accuracy(local, work.x_test, work.y_test), 4), "evals": evals}))
    return 0


def write_csv(path: str, rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)


def typed(rows: list[dict]) -> list[dict]:
    """CSV rows with numbers as numbers and empty cells as None."""
    def value(v: str):
        if v == "":
            return None
        try:
            return int(v) if v.lstrip("-").isdigit() else float(v)
        except ValueError:
            return v
    return [{k: value(v) for k, v in row.items()} for row in rows]


def read_csv(path: str) -> list[dict]:
    """Rows ``write_csv`` wrote (``typed``)."""
    with open(path, newline="") as f:
        return typed(csv.DictReader(f))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="the chief of run_fit")
    p.add_argument("--fit-chief", required=True, metavar="JOB")
    p.add_argument("--spe", type=int, default=1)
    p.add_argument("--epoch-steps", type=int, default=FIT_EPOCH)
    a = p.parse_args()
    sys.path.insert(0, os.path.dirname(HERE))
    sys.exit(fit_chief(a.fit_chief, a.spe, a.epoch_steps))
