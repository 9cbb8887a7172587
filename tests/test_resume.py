"""Kill the manager (the `tfsync run` process that embeds it) mid-run; `tfsync resume`
continues from the job store's job and the last checkpoint, losing at most the steps
after that checkpoint."""

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from helpers import (CHECKPOINTED_JOB, DATA, PER_UPDATE, check_counted_once, records, run_here, tfsync_run,
                     wait_for_checkpoints)
from tfsync.manager.store import Store

pytestmark = pytest.mark.cluster

@pytest.mark.slow
def test_resume_after_the_manager_is_killed(tmp_path):
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    with tfsync_run(tmp_path, CHECKPOINTED_JOB, env=env, output=subprocess.DEVNULL) as (run, run_dir, job):
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
    assert summary["samples"] >= summary["workload_samples"] == 9000
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


def test_a_finished_job_is_done_and_a_damaged_newest_checkpoint_is_skipped_naming_it(tmp_path, main_job):
    """A run on a run directory that holds another run's outputs (tests/conftest.py's
    main_job, copied) sets them aside, each run's records its own (not both appended). The
    job trained to its end: `tfsync resume` says so (exit 0), starts no cluster and
    writes nothing. Then (issue 31 case 6) its newest checkpoint's data damaged on disk:
    with a larger workload (--set train.epochs) `tfsync resume` says in one line that it
    skipped it and why, goes on from the newest intact one and trains on, counting its
    own samples exactly."""
    import shutil

    from helpers import linear_job

    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    run_dir, job = tmp_path / "run", tmp_path / "job.toml"
    job.write_text(linear_job("dmg", {"name": "bsp", "until": 0.3}, "asp", epochs=0.2, checkpoint_every=5,
                              eval_every=5).format(run_dir=run_dir))
    _, _, first_dir, first = main_job
    shutil.copytree(first_dir, run_dir, symlinks=True)   # the first run's outputs, where this job writes
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", str(job), "--json", "--data", DATA],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "were moved to" in r.stderr   # (this was test_run_job.py's test_a_second_run_sets_the_first_ones_...)
    (previous,) = (run_dir / "previous").iterdir()
    for path, summary in ((run_dir, json.loads(r.stdout)), (previous, first)):
        pushes = [x for x in map(json.loads, open(path / "metrics.jsonl")) if "worker" in x]
        assert len(pushes) == summary["pushes"]  # each run's records, not both appended
    assert (previous / "checkpoints").is_dir() and (run_dir / "checkpoints").is_dir()

    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "resume", str(job), "--json", "--data", DATA],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "dmg is done: it trained" in r.stderr and "nothing started" in r.stderr, r.stderr
    assert r.stdout == "" and "steps/s" not in r.stderr
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file() and p.name != ".tfsync.lock"} \
        == {p: t for p, t in before.items() if p.name != ".tfsync.lock"}

    saved = [x for x in records(run_dir) if x.get("event") == "checkpoint"]
    newest, older = saved[-1]["path"], saved[-2]
    data = next(p for p in os.listdir(run_dir / "checkpoints") if p.startswith(os.path.basename(newest) + ".data"))
    with open(run_dir / "checkpoints" / data, "r+b") as f:   # the same size, other bytes
        size = f.seek(0, 2)
        f.seek(size // 3)
        f.write(os.urandom(max(1, size // 3)))
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "resume", str(job), "--json", "--data", DATA,
                        "--set", "train.epochs=0.25"],   # more than the finished run: something to resume
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    said = [line for line in r.stderr.splitlines() if line.startswith("skipped checkpoint")]
    assert len(said) == 1 and newest in said[0] and "does not read back" in said[0], r.stderr[-2000:]
    summary = json.loads(r.stdout)
    start = summary["resumed_from"]["samples"]
    assert summary["resumed_from"]["path"] == older["path"] and summary["samples"] >= summary["workload_samples"]
    first, second = summary["runs"]
    assert second["samples"] == summary["samples"] - start > 0   # this run's own, exactly
    assert first["samples"] >= start
    # the whole job's evaluations: the first run's up to the checkpoint, then this run's
    assert any(e["samples"] <= start for e in summary["evals"]) and any(e["samples"] > start for e in summary["evals"])
    # resumed in the ASP phase: the BSP phase before it is done, not started again for a round
    recs = records(run_dir)
    after = [x for x in recs[max(i for i, x in enumerate(recs) if x.get("event") == "resume"):] if "worker" in x]
    assert after and {x["protocol"] for x in after} == {"asp"}
    assert [ph["protocol"] for ph in summary["timeline"]] == ["bsp", "asp", "asp"]
    assert summary["timeline"][-1]["resumed"] and [r["stopped"] for r in summary["runs"]] == [False, False]


def test_resume_without_a_checkpoint_says_what_to_do(tmp_path, capsys, monkeypatch):
    job = tmp_path / "job.toml"
    job.write_text(CHECKPOINTED_JOB.format(run_dir=tmp_path / "run"))
    monkeypatch.setenv("TFSYNC_HOME", str(tmp_path / "home"))
    r = run_here(capsys, "resume", str(job))
    assert r.returncode == 2 and "no checkpoint to resume from" in r.stderr
