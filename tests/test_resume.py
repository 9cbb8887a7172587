"""Kill the manager (the `tfsync run` process that embeds it) mid-run; `tfsync resume`
continues from the job store's job and the last checkpoint, losing at most the steps
after that checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from test_control import tfsync_run
from tfsync.manager.store import Store

pytestmark = pytest.mark.cluster

JOB = """
[job]
name = "res"
run_dir = "{run_dir}"
[model]
name = "linear"
[train]
batch_size = 32
learning_rate = 0.05
epochs = 4
checkpoint_every = 10
[[protocol]]
name = "bsp"
until = 0.5
[[protocol]]
name = "asp"
"""
DATA = os.path.join(os.path.dirname(__file__), "..", "tfsync", "datasets", "mnist_sample.npz")
PER_UPDATE = 2 * 32  # samples in one BSP update: 2 workers x batch 32


def records(run_dir):
    out = []
    if not (run_dir / "metrics.jsonl").exists():  # the run has not started yet
        return out
    with open(run_dir / "metrics.jsonl") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:  # the line the kill cut short
                pass
    return out


def check_counted_once(run_dir, summary, why: str) -> None:
    """metrics.jsonl holds each counted push once, numbered 1..pushes as summary.json says;
    what was trained again after going back to a checkpoint is in metrics.discarded.jsonl."""
    recs = records(run_dir)
    assert [r["pushes"] for r in recs if "worker" in r] == list(range(1, summary["pushes"] + 1))
    (rewind,) = [r for r in recs if r.get("event") == "rewind"]
    path = run_dir / "metrics.discarded.jsonl"  # none when nothing ran after the checkpoint
    discarded = [json.loads(line) for line in open(path)] if path.exists() else []
    assert rewind["why"] == why and rewind["discarded"] == len(discarded)
    assert all(d["discarded"] == why and d["pushes"] > rewind["pushes"] for d in discarded)


def wait_for_checkpoints(run_dir, count: int = 2, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "metrics.jsonl").exists() and \
                sum(r.get("event") == "checkpoint" for r in records(run_dir)) >= count:
            return
        time.sleep(0.2)
    pytest.fail(f"fewer than {count} checkpoints within {timeout:.0f} s")


@pytest.mark.slow
def test_resume_after_the_manager_is_killed(tmp_path):
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    with tfsync_run(tmp_path, JOB, env=env, output=subprocess.DEVNULL) as (run, run_dir, job):
        wait_for_checkpoints(run_dir)  # two checkpoints, still in the BSP phase
        tasks = psutil.Process(run.pid).children(recursive=True)
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
    gone, alive = psutil.wait_procs(tasks, timeout=15)  # tasks exit when their parent dies
    assert not alive
    done_before = max(r["samples"] for r in records(run_dir) if "worker" in r)
    checkpoint = [r for r in records(run_dir) if r.get("event") == "checkpoint"][-1]

    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "resume", str(job), "--json", "--data", DATA],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    start = summary["resumed_from"]
    assert start["path"] == checkpoint["path"] and start["samples"] == checkpoint["samples"] > 0
    # Lost work: only what came after the checkpoint (plus the round in flight).
    assert done_before - start["samples"] <= (10 + 1) * PER_UPDATE
    assert summary["samples"] >= summary["workload_samples"] == 4 * 6000
    recs = records(run_dir)
    resumed = next(i for i, x in enumerate(recs) if x.get("event") == "resume")
    first = next(x for x in recs[resumed:] if "worker" in x)
    # Counters and weights continue: the first step after resuming counts on from the
    # checkpoint, and its loss is that of a trained model, not of a fresh one (~2.3).
    assert start["samples"] < first["samples"] <= start["samples"] + 2 * PER_UPDATE
    assert first["loss"] < 1.0
    assert [p["protocol"] for p in summary["timeline"]] == ["bsp", "asp"]
    assert summary["test_accuracy"] > 0.8
    check_counted_once(run_dir, summary, "resume")

    with Store(str(tmp_path / "home" / "jobs.db")) as store:
        (stored,) = store.jobs()  # the same job, a second run
        assert stored.state == "done"
        assert [run.kind for run in store.runs(stored.id)] == ["train", "resume"]


def test_resume_without_a_checkpoint_says_what_to_do(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(run_dir=tmp_path / "run"))
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "resume", str(job)], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, TFSYNC_HOME=str(tmp_path / "home")))
    assert r.returncode == 2 and "no checkpoint to resume from" in r.stderr
