"""Controlling a running job as a user does: `tfsync run` in one process, `tfsync status |
metrics | switch | batch-sizes | scale | stop` from others, over the job's embedded manager
(real gRPC on loopback, real TF tasks, the real job store), then `tfsync resume` with the
count the job was scaled to."""

import contextlib
import json
import os
import subprocess
import sys

import pytest

import helpers
from helpers import DATA, kill_if_running, linear_job, wait_for
from tfsync.api import auth
from tfsync.manager.store import Store

pytestmark = pytest.mark.cluster

JOB = linear_job("ctl", "bsp", batch_size=16, epochs=20, checkpoint_every=0,   # BSP at 2 x 0.05
                 extra="[cluster]\nworkers = 2\nmax_workers = 4\n")


@pytest.mark.slow
def test_status_switch_batch_sizes_scale_and_stop_reach_a_running_job_and_resume_keeps_the_scaled_count(tmp_path):
    """`tfsync run job.toml` in its folder, with a relative run_dir; every command given the
    job file's absolute path (or the run directory's) from another folder reaches that run.
    `tfsync scale` takes it from 2 workers to 3 (after the commands of one protocol after
    another), and `tfsync resume` goes on with the 3 it was scaled to."""
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    job, run_dir = project / "job.toml", project / "runs" / "ctl"
    job.write_text(JOB.format(run_dir="runs/ctl"))
    with contextlib.ExitStack() as cleanup:
        run = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "run", "job.toml", "--json", "--data", DATA],
                               cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        cleanup.callback(kill_if_running, run)

        def tfsync(*args):
            return helpers.tfsync(*args, env=env, cwd=elsewhere)

        info = wait_for("the manager", lambda: (run_dir / "control" / "manager.json").is_file())
        assert info and oct((run_dir / "control" / "token").stat().st_mode & 0o777) == "0o600"

        def status():
            r = tfsync("status", str(job), "--json")
            return json.loads(r.stdout) if r.returncode == 0 else None

        first = wait_for("steps", lambda: (s := status()) and int(s.get("step", 0)) > 5 and s)
        assert first["protocol"] == "bsp" and first["state"] == "JOB_STATE_RUNNING"

        token = run_dir / "control" / "token"
        real = token.read_text()
        token.write_text(auth.new_token() + "\n")  # a caller with a wrong token is refused
        bad = tfsync("status", str(job))
        token.write_text(real)
        assert bad.returncode == 1 and "UNAUTHENTICATED" in bad.stderr
        # the step records from the first on (held ones replayed), until the run ends
        metrics = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "metrics", str(job), "--json"], cwd=elsewhere,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        cleanup.callback(kill_if_running, metrics)

        bad = tfsync("batch-sizes", str(run_dir), "8", "8", "8")
        assert bad.returncode == 2 and "INVALID_ARGUMENT" in bad.stderr and "expected 2 integers" in bad.stderr
        bad = tfsync("switch", str(job), "--to", "zipline")
        assert bad.returncode == 2 and "unknown protocol 'zipline'" in bad.stderr

        bad = tfsync("switch", str(job), "--to", "ssp", "--lr-scale", "nan")
        assert bad.returncode == 2 and "lr_scale nan; expected a finite number > 0" in bad.stderr

        # refused where it would be carried out, and the caller is told so (not "queued")
        big = tfsync("batch-sizes", str(job), "4", "100000")
        assert big.returncode == 1 and "FAILED_PRECONDITION" in big.stderr, big.stderr
        assert "exceeds the input pipeline's" in big.stderr and len(big.stderr.strip().splitlines()) == 1

        lb = tfsync("switch", str(job), "--to", "lbbsp")
        assert lb.returncode == 0 and "switched bsp -> lbbsp" in lb.stdout, lb.stderr
        mine = tfsync("batch-sizes", str(job), "4", "12")
        assert mine.returncode == 1 and "lbbsp sizes its own batches" in mine.stderr, mine.stderr

        sw = tfsync("switch", str(job), "--to", "ssp", "--staleness", "1", "--lr-scale", "0.5")
        assert sw.returncode == 0 and "switched lbbsp -> ssp (hot)" in sw.stdout, sw.stderr
        assert status()["protocol"] == "ssp"  # carried out before the answer came

        sizes = tfsync("batch-sizes", str(job), "4", "12")
        assert sizes.returncode == 0 and "batch sizes [4, 12] from the next grant" in sizes.stdout, sizes.stderr
        wait_for("batch sizes 4 and 12", lambda: (s := status()) and s.get("batch_sizes") == [4, 12])

        # `tfsync scale`: refused counts, each in one line naming why
        r = tfsync("scale", str(job), "--workers", "0")
        assert r.returncode == 2 and "workers = 0: a job needs at least 1 worker" in r.stderr, r.stderr
        r = tfsync("scale", str(job), "--workers", "2")   # the manager knows the job's count
        assert r.returncode == 2 and "INVALID_ARGUMENT" in r.stderr and "already runs 2 workers" in r.stderr
        r = tfsync("scale", str(job), "--workers", "x")
        assert r.returncode == 2 and "invalid int value" in r.stderr
        r = tfsync("scale", str(job), "--workers", "9")   # the running job's bound, named
        assert r.returncode == 2 and "INVALID_ARGUMENT" in r.stderr and \
            "workers = 9: above cluster.max_workers = 4" in r.stderr, r.stderr
        # a rate set by hand (x3 at 2 workers) follows the count: x4.5 at 3
        sw = tfsync("switch", str(job), "--to", "bsp", "--lr-scale", "3")
        assert sw.returncode == 0, sw.stderr
        up = helpers.tfsync("scale", str(job), "--workers", "3", env=env, cwd=elsewhere, timeout=150)
        assert up.returncode == 0 and "scaled 2 -> 3 workers in" in up.stdout and "learning rate x4.5" in up.stdout, \
            up.stderr
        shown = tfsync("status", str(job))   # as soon as the answer: 3 workers (a new one: no step yet)
        assert shown.returncode == 0 and len(shown.stdout.split("batch sizes [")[1].split("]")[0].split()) == 3
        # the manager takes 3 batch sizes now (it checks them against the job's count)
        sizes = tfsync("batch-sizes", str(job), "4", "8", "12")
        assert sizes.returncode == 0, sizes.stderr
        wait_for("3 workers' batch sizes", lambda: (s := status()) and s.get("batch_sizes") == [4, 8, 12])

        assert tfsync("stop", str(job)).returncode == 0
        out, err = run.communicate(timeout=120)
        streamed, metrics_err = metrics.communicate(timeout=30)
    assert run.returncode == 0, err[-2000:]
    summary = json.loads(out)
    assert metrics.returncode == 0, metrics_err
    streamed = [json.loads(line) for line in streamed.splitlines()]
    assert [r["step"] for r in streamed] == list(range(1, summary["pushes"] + 1))  # each once, none lost
    assert {r["protocol"] for r in streamed} == {"bsp", "lbbsp", "ssp"} and {r["worker"] for r in streamed} == {0, 1, 2}
    assert summary["stopped"] and summary["stop_checkpoint"]
    assert [p["protocol"] for p in summary["timeline"]] == ["bsp", "lbbsp", "ssp", "bsp"]
    assert summary["samples"] < summary["workload_samples"]  # it really stopped early
    records = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    ssp = [r for r in records if "worker" in r and r["protocol"] == "ssp"]
    assert [[r["batch_size"] for r in ssp if r["worker"] == w][-1] for w in (0, 1)] == [4, 12]
    assert ssp and all(r["lr"] == pytest.approx(0.05 * 0.5) for r in ssp)  # --lr-scale 0.5 of 0.05
    assert not (run_dir / "control" / "manager.json").exists()
    # the scale: 2 -> 3 workers, every counted push once across it, the rate x4.5 after it
    assert summary["workers"] == 3 and [(s["from"], s["to"]) for s in summary["scales"]] == [(2, 3)]
    pushes = [r for r in records if "worker" in r and "event" not in r]
    assert [r["pushes"] for r in pushes] == list(range(1, summary["pushes"] + 1))   # each once, none lost
    scaled_at = next(r for r in records if r.get("event") == "scaled")["updates"]
    assert {r["worker"] for r in pushes if r["updates"] < scaled_at} == {0, 1}
    assert {r["worker"] for r in pushes if r["updates"] > scaled_at} == {0, 1, 2}
    assert summary["samples"] == sum(r["batch_size"] for r in pushes)
    assert all(r["lr"] == pytest.approx(0.05 * 4.5) for r in pushes if r["updates"] > scaled_at)

    with Store(str(tmp_path / "home" / "jobs.db")) as store:
        (stored,) = store.jobs()
        assert stored.state == "stopped"
        (run_row,) = store.runs(stored.id)
        steps = store.steps(run_row.id)
        assert len(steps) == summary["pushes"] and {s.protocol for s in steps} == {"bsp", "lbbsp", "ssp"}
        assert store.results(run_row.id)["stopped"] is True
        (event,) = store.events(run_row.id, "scaled")
        assert (event.detail["from"], event.detail["to"]) == (2, 3)
    listed = helpers.tfsync("jobs", env=env)   # where users look: the job's workers, the run's scale
    assert listed.returncode == 0 and "2 -> 3" in listed.stdout.splitlines()[1], listed.stdout
    runs = helpers.tfsync("runs", str(job), env=env, cwd=elsewhere)
    assert runs.returncode == 0 and "scaled 2 -> 3 workers (command)" in runs.stdout, runs.stdout

    # the job file still says 2 workers: the resumed run goes on with the 3 it was scaled to
    epochs = summary["samples"] / summary["meta"]["train_examples"] + 0.2   # a little more than done
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "resume", str(job), "--json", "--data", DATA,
                        "--set", f"train.epochs={epochs:.4f}"], capture_output=True, text=True, timeout=300, env=env,
                       cwd=project)   # (where it ran: the job's run_dir is relative)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "goes on with 3 workers, as `tfsync scale` left it" in r.stderr
    resumed = json.loads(r.stdout)
    assert resumed["workers"] == 3 and resumed["scales"] == []
    later = [x for x in map(json.loads, open(run_dir / "metrics.jsonl"))
             if "worker" in x and "event" not in x][len(pushes):]
    assert later and {x["worker"] for x in later} == {0, 1, 2}
    # what the commands set holds, once, at the count it was set for
    assert all(x["lr"] == pytest.approx(0.05 * 4.5) for x in later)
    assert {(x["worker"], x["batch_size"]) for x in later} == {(0, 4), (1, 8), (2, 12)}


def test_a_job_that_is_not_running_is_named(tmp_path):
    """A run directory, or a job file whose relative run_dir holds no running job: one line
    naming the absolute paths looked at."""
    r = helpers.tfsync("status", str(tmp_path))
    assert r.returncode == 2 and "no running job there" in r.stderr
    other = tmp_path / "other.toml"
    other.write_text(linear_job("other", "bsp").format(run_dir="runs/other"))
    r = helpers.tfsync("status", str(other), cwd=tmp_path)
    assert r.returncode == 2 and f"no {tmp_path}/runs/other/control/manager.json" in r.stderr, r.stderr
