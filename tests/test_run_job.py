"""`tfsync run` as a user runs it: a real job on a local cluster, and Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from helpers import DATA, default_sigint, linear_job, tasks_under

pytestmark = pytest.mark.cluster


def _job(tmp_path, epochs):
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(linear_job("t", {"name": "bsp", "until": 0.5}, "asp", epochs=epochs, checkpoint_every=50)
                   .format(run_dir=run_dir))
    return job, run_dir


@pytest.fixture
def bsp_then_asp(main_job):
    """One `tfsync run` of the main job, BSP then ASP, under umask 022 (tests/conftest.py):
    (summary, run dir). Tests that change its outputs work on a copy."""
    _, _, run_dir, summary = main_job
    return summary, run_dir


def test_run_trains_bsp_then_asp_and_writes_its_records(bsp_then_asp):
    summary, run_dir = bsp_then_asp
    # issue 31 case 2: under umask 022 too, nothing the run wrote is open to other users
    written = [os.path.join(top, n) for top, dirs, files in os.walk(run_dir) for n in [""] + dirs + files]
    assert len(written) > 10 and any("checkpoints" in p for p in written) and any("data" in p for p in written)
    assert [p for p in written if os.lstat(p).st_mode & 0o077] == []
    assert [p for p in written if os.path.isdir(p) and os.lstat(p).st_mode & 0o700 != 0o700] == []
    assert [p["protocol"] for p in summary["timeline"]] == ["bsp", "asp"]
    assert summary["switches"][0]["method"] == "hot"
    assert summary["test_accuracy"] > 0.7  # a linear model, 2 epochs of 6000 real digits
    assert summary["timeline"][0]["lr"] == pytest.approx(0.1)  # BSP runs n * eta (Sync-Switch §IV-C)
    assert summary["timeline"][1]["lr"] == pytest.approx(0.05)
    records = [json.loads(l) for l in open(run_dir / "metrics.jsonl")]
    pushes = [x for x in records if "worker" in x]
    assert {x["protocol"] for x in pushes} == {"bsp", "asp"} and len(pushes) == summary["pushes"]
    assert os.listdir(run_dir / "tb") and (run_dir / "summary.json").exists()


def test_ctrl_c_stops_every_task_and_exits_130(tmp_path):
    job, run_dir = _job(tmp_path, 50)
    proc = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "run", str(job), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            metrics = run_dir / "metrics.jsonl"
            if metrics.exists() and '"worker"' in metrics.read_text():
                break
            time.sleep(0.5)
        assert len(tasks_under(proc.pid)) == 3
        below = psutil.Process(proc.pid).children(recursive=True)   # the tasks, and what forked them
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("tfsync: error: interrupted")
    gone, alive = psutil.wait_procs(below, timeout=15)
    assert not alive, "task processes outlived tfsync run"


def _inline(table: dict) -> str:
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + "}"


def test_a_diverging_run_stops_at_the_first_non_finite_loss_keeping_only_finite_checkpoints(tmp_path):
    """Issue 31 case 5: a learning rate that grows 1e8-fold per update makes the loss
    non-finite within a few updates; the run ends at once with one line naming the worker,
    the step and the last good checkpoint, exit 1, and every checkpoint it kept holds
    finite weights (resume starts from a good one)."""
    import numpy as np
    import tensorflow as tf

    job = tmp_path / "job.toml"
    run_dir = tmp_path / "run"
    growing = {"schedule": "ExponentialDecay", "initial_learning_rate": 0.05, "decay_steps": 1, "decay_rate": 1e8}
    job.write_text(linear_job("nan", "bsp", epochs=1, checkpoint_every=1).format(run_dir=run_dir)
                   .replace("learning_rate = 0.05", "learning_rate = " + _inline(growing)))
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", str(job), "--data", DATA],
                       capture_output=True, text=True, timeout=300)
    errors = [line for line in r.stderr.splitlines() if line.startswith("tfsync: error:")]
    assert r.returncode == 1 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "training diverged" in errors[0] and ("worker" in errors[0] or "update" in errors[0]), errors[0]
    kept = [p[:-len(".index")] for p in os.listdir(run_dir / "checkpoints") if p.endswith(".index")] \
        if (run_dir / "checkpoints").exists() else []
    assert kept and f"the last good checkpoint is {run_dir / 'checkpoints'}" in errors[0], (errors[0], kept)
    for prefix in kept:
        reader = tf.train.load_checkpoint(str(run_dir / "checkpoints" / prefix))
        assert all(np.isfinite(reader.get_tensor(k)).all() for k, dtype in
                   reader.get_variable_to_dtype_map().items() if dtype.is_floating), prefix
    summary_lines = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    assert not any("worker" in x and not np.isfinite(x["loss"]) for x in summary_lines)
