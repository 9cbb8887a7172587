"""`tfsync scale` on a running job, as a user runs it: `tfsync run` in one process, `tfsync
scale | status | batch-sizes | stop` from others (real gRPC, real TF tasks, the real job
store), then `tfsync resume` with the count the job was scaled to."""

import json
import os
import subprocess
import sys

import pytest

from helpers import DATA, linear_job, tfsync, tfsync_run, wait_for
from tfsync.manager.store import Store

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

JOB = linear_job("scale", "bsp", batch_size=16, epochs=20, checkpoint_every=0,   # BSP at 2 x 0.05
                 extra="[cluster]\nworkers = 2\nmax_workers = 4\n")


def test_scale_a_running_job_up_then_stop_and_resume_at_the_scaled_count(tmp_path):
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    with tfsync_run(tmp_path, JOB, env=env) as (run, run_dir, job):
        def status():
            r = tfsync("status", str(job), "--json", env=env)
            return json.loads(r.stdout) if r.returncode == 0 else None

        wait_for("steps", lambda: (s := status()) and int(s.get("step", 0)) > 5 and s)
        r = tfsync("scale", str(job), "--workers", "0", env=env)
        assert r.returncode == 2 and "workers = 0: a job needs at least 1 worker" in r.stderr, r.stderr
        r = tfsync("scale", str(job), "--workers", "2", env=env)   # the manager knows the job's count
        assert r.returncode == 2 and "INVALID_ARGUMENT" in r.stderr and "already runs 2 workers" in r.stderr
        r = tfsync("scale", str(job), "--workers", "x", env=env)
        assert r.returncode == 2 and "invalid int value" in r.stderr
        r = tfsync("scale", str(job), "--workers", "9", env=env)   # the running job's bound, named
        assert r.returncode == 2 and "INVALID_ARGUMENT" in r.stderr and \
            "workers = 9: above cluster.max_workers = 4" in r.stderr, r.stderr

        # a rate set by hand (x3 at 2 workers) follows the count: x4.5 at 3
        sw = tfsync("switch", str(job), "--to", "bsp", "--lr-scale", "3", env=env)
        assert sw.returncode == 0, sw.stderr
        up = tfsync("scale", str(job), "--workers", "3", env=env, timeout=150)
        assert up.returncode == 0 and "scaled 2 -> 3 workers in" in up.stdout and "learning rate x4.5" in up.stdout, \
            up.stderr
        shown = tfsync("status", str(job), env=env)   # as soon as the answer: 3 workers (a new one: no step yet)
        assert shown.returncode == 0 and len(shown.stdout.split("batch sizes [")[1].split("]")[0].split()) == 3
        # the manager takes 3 batch sizes now (it checks them against the job's count)
        sizes = tfsync("batch-sizes", str(job), "4", "8", "12", env=env)
        assert sizes.returncode == 0, sizes.stderr
        wait_for("3 workers' batch sizes", lambda: (s := status()) and s.get("batch_sizes") == [4, 8, 12])
        assert tfsync("stop", str(job), env=env).returncode == 0
        out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err[-2000:]
    summary = json.loads(out)
    assert summary["workers"] == 3 and [(s["from"], s["to"]) for s in summary["scales"]] == [(2, 3)]
    recs = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    pushes = [r for r in recs if "worker" in r and "event" not in r]
    assert [r["pushes"] for r in pushes] == list(range(1, summary["pushes"] + 1))   # each once, none lost
    scaled_at = next(r for r in recs if r.get("event") == "scaled")["updates"]
    assert {r["worker"] for r in pushes if r["updates"] < scaled_at} == {0, 1}
    assert {r["worker"] for r in pushes if r["updates"] > scaled_at} == {0, 1, 2}
    assert summary["samples"] == sum(r["batch_size"] for r in pushes)
    assert all(r["lr"] == pytest.approx(0.05 * 4.5) for r in pushes if r["updates"] > scaled_at)

    with Store(str(tmp_path / "home" / "jobs.db")) as store:
        (stored,) = store.jobs()
        (run_row,) = store.runs(stored.id)
        (event,) = store.events(run_row.id, "scaled")
        assert (event.detail["from"], event.detail["to"]) == (2, 3)
    listed = tfsync("jobs", env=env)   # where users look: the job's workers, the run's scale
    assert listed.returncode == 0 and "2 -> 3" in listed.stdout.splitlines()[1], listed.stdout
    runs = tfsync("runs", str(job), env=env)
    assert runs.returncode == 0 and "scaled 2 -> 3 workers (command)" in runs.stdout, runs.stdout

    # the job file still says 2 workers: the resumed run goes on with the 3 it was scaled to
    epochs = summary["samples"] / summary["meta"]["train_examples"] + 0.2   # a little more than done
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "resume", str(job), "--json", "--data", DATA,
                        "--set", f"train.epochs={epochs:.4f}"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "goes on with 3 workers, as `tfsync scale` left it" in r.stderr
    resumed = json.loads(r.stdout)
    assert resumed["workers"] == 3 and resumed["scales"] == []
    later = [x for x in map(json.loads, open(run_dir / "metrics.jsonl")) if "worker" in x and "event" not in x][len(pushes):]
    assert later and {x["worker"] for x in later} == {0, 1, 2}
    # what the commands set holds, once, at the count it was set for
    assert all(x["lr"] == pytest.approx(0.05 * 4.5) for x in later)
    assert {(x["worker"], x["batch_size"]) for x in later} == {(0, 4), (1, 8), (2, 12)}
