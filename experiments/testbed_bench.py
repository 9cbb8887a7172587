"""What the testbed benchmarks share (bench_testbed*.py): the wide-MLP job that makes a
step's pull and push large against its compute, running a job file on the coordinator's
node, and writing their rows as CSV."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap

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


def write_csv(path: str, rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)


def read_csv(path: str) -> list[dict]:
    """Rows ``write_csv`` wrote: numbers as numbers, empty cells as None."""
    def value(v: str):
        if v == "":
            return None
        try:
            return int(v) if v.lstrip("-").isdigit() else float(v)
        except ValueError:
            return v
    with open(path, newline="") as f:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(f)]
