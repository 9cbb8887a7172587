"""`tfsync jobs | runs`, and `tfsync status` of a job that has ended, on a real job store that
the test fills as `tfsync run`'s embedded manager does (tfsync.manager.embedded.start/finish)."""

import dataclasses
import json
import os
import time

import pytest

from helpers import tfsync_here

from tfsync.api import auth, transport
from tfsync.cli import main
from tfsync.job.config import JobConfig
from tfsync.manager.store import StepSummary, Store
from tfsync.switch.trials import config_signature

pytestmark = pytest.mark.unit

SUMMARY = {"wall_s": 42.13, "pushes": 1234, "samples": 50000, "test_accuracy": 0.9123, "stopped": False}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TFSYNC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def store(home):
    with Store(home / "jobs.db") as s:
        yield s


tfsync = tfsync_here


def record(store, name, run_dir, protocols=("bsp",), summary=None, state="done", steps=0):
    """A job as embedded.start + finish store it: job (running), a train run, steps, results, state."""
    cfg = dataclasses.asdict(JobConfig.from_dict({"job": {"name": name, "run_dir": str(run_dir)},
                                                  "protocol": [{"name": p, "until": (i + 1) / len(protocols)}
                                                               for i, p in enumerate(protocols)]}))
    job = store.create_job(name, config_signature(cfg), cfg, run_dir=os.path.abspath(run_dir))
    store.set_job_state(job.id, "running")
    run = store.start_run(job.id, kind="train")
    store.add_steps([StepSummary(run.id, s, time.time(), 64, 1.0, protocols[0], (32, 32)) for s in range(steps)])
    for key in ("wall_s", "train_s", "pushes", "samples", "test_accuracy", "stopped"):
        if key in (summary or {}):
            store.set_result(run.id, key, summary[key])
    if state != "running":
        store.set_job_state(job.id, state)
    time.sleep(0.01)  # the next job is created later: newest-first order is by creation time
    return store.job(job.id), run


def error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfsync: error: "), err
    return lines[0]


def test_jobs_lists_newest_first_with_protocols_accuracy_and_wall_time(store, tmp_path, capsys):
    done, _ = record(store, "mnist", tmp_path / "runs" / "mnist", ("bsp", "asp"), SUMMARY)
    running, _ = record(store, "cifar", tmp_path / "runs" / "cifar", ("ssp",), state="running")
    code, out, err = tfsync(capsys, "jobs")
    assert code == 0 and err == ""
    header, first, second = out.splitlines()
    assert header.split() == ["JOB", "NAME", "STATE", "CREATED", "ENDED", "PROTOCOLS", "WORKERS", "RUNS", "TEST",
                              "WALL", "TRAINING", "RUN", "DIR"]
    assert first.startswith(running.id) and "running" in first and "ssp" in first
    assert second.startswith(done.id) and "bsp -> asp" in second and "acc 91.23%" in second and "42.1 s" in second
    assert second.endswith(str(tmp_path / "runs" / "mnist"))
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(done.created))
    assert second.count(created) == 2  # created and ended, local time
    assert first.index("cifar") == header.index("NAME")  # fixed width columns
    code, out, _ = tfsync(capsys, "jobs", "--state", "done")
    assert code == 0 and done.id in out and running.id not in out
    code, out, _ = tfsync(capsys, "jobs", "--limit", "1")
    assert code == 0 and done.id not in out and "1 newest of 2 jobs" in out


def test_the_store_shows_the_protocols_that_ran_not_the_plan(store, tmp_path, capsys):
    """Issue 32 case 3: planned LB-BSP -> ASP; it ran LB-BSP, was switched to SSP by a
    command, stopped, resumed in SSP, then ASP by the plan."""
    job, first = record(store, "blobs", tmp_path / "run", ("lbbsp", "asp"), {"wall_s": 30.0, "train_s": 20.0},
                        state="running")
    step = iter(range(100))
    store.add_steps([StepSummary(first.id, next(step), time.time(), 64, 1.0, p, (32, 32))
                     for p in ["lbbsp"] * 5 + ["ssp"] * 5])
    store.add_event(first.id, "switch", {"from": "lbbsp", "to": "ssp", "method": "hot", "by": "command"})
    second = store.start_run(job.id, kind="resume")
    store.add_steps([StepSummary(second.id, next(step), time.time(), 64, 1.0, p, (32, 32))
                     for p in ["ssp"] * 5 + ["asp"] * 5])
    store.add_event(second.id, "switch", {"from": "ssp", "to": "asp", "method": "hot", "by": "plan"})
    store.set_result(second.id, "wall_s", 12.0)
    store.set_result(second.id, "train_s", 7.5)
    store.set_job_state(job.id, "done")
    code, out, _ = tfsync(capsys, "jobs")
    assert code == 0 and "lbbsp -> ssp (by command) -> asp" in out and "42.0 s" in out, out   # both runs' wall
    assert "27.5 s" in out, out   # and training time
    code, out, _ = tfsync(capsys, "jobs", "--json")
    (listed,) = json.loads(out)
    assert listed["protocols"] == ["lbbsp", "ssp (by command)", "asp"] and listed["plan"] == ["lbbsp", "asp"]
    code, out, _ = tfsync(capsys, "runs", "blobs")
    assert code == 0 and "lbbsp -> ssp (by command) -> asp" in out, out
    assert "switched lbbsp -> ssp (by command); wall 30.0 s" in out and "switched ssp -> asp; wall 12.0 s" in out, out
    totals = "2 runs: wall 42.0 s in all (30.0 s + 12.0 s), training 27.5 s (20.0 s + 7.5 s)"
    assert out.splitlines()[-1] == totals, out
    code, out, _ = tfsync(capsys, "status", "blobs")
    assert code == 0 and out.splitlines()[1] == totals + "; the results above are the last run's", out


def test_a_regression_jobs_runs_show_its_test_loss_and_metrics(store, tmp_path, capsys):
    """Issue 32 case 3: a job without accuracy keeps its test loss and metrics in the store."""
    from tfsync.manager.store_types import run_results
    summary = {**SUMMARY, "test_accuracy": None, "test_loss": 0.0412, "test_mae": 0.151, "train_s": 30.5,
               "timeline": [], "meta": {}}
    job, run = record(store, "housing", tmp_path / "run", ("bsp",), state="running")
    for key, value in run_results(summary).items():
        store.set_result(run.id, key, value)
    store.set_job_state(job.id, "done")
    code, out, _ = tfsync(capsys, "runs", "housing")
    assert code == 0 and "test loss 0.0412" in out and "test mae 0.151" in out and "training 30.5 s" in out, out
    assert "accuracy" not in out
    code, out, _ = tfsync(capsys, "jobs")   # its first test number: the loss
    assert code == 0 and "loss 0.0412" in out.splitlines()[1], out


def test_jobs_json_is_a_list_with_results(store, tmp_path, capsys):
    done, _ = record(store, "mnist", tmp_path / "run", ("bsp", "asp"), SUMMARY)
    running, _ = record(store, "cifar", tmp_path / "run2", state="running")
    code, out, _ = tfsync(capsys, "jobs", "--json")
    listed = json.loads(out)
    assert code == 0 and [j["id"] for j in listed] == [running.id, done.id]
    assert listed[1]["protocols"] == ["bsp", "asp"] and listed[1]["results"] == SUMMARY
    assert listed[1]["ended"] == done.updated and listed[0]["ended"] is None
    assert listed[1]["state"] == "done" and listed[1]["run_dir"] == str(tmp_path / "run") and listed[1]["runs"] == 1


def test_no_store_and_an_empty_store_say_how_to_start_a_job(home, capsys):
    code, out, err = tfsync(capsys, "jobs")
    assert code == 0 and err == "" and "no jobs yet" in out and "tfsync run" in out
    assert not (home / "jobs.db").exists() and not home.exists()  # listing made no store
    code, out, _ = tfsync(capsys, "jobs", "--json")
    assert code == 0 and json.loads(out) == []
    Store(home / "jobs.db").close()
    code, out, _ = tfsync(capsys, "jobs", "--store", str(home / "jobs.db"))
    assert code == 0 and "no jobs yet" in out and str(home / "jobs.db") in out


def test_runs_of_a_job_by_name_or_id(store, tmp_path, capsys):
    job, first = record(store, "mnist", tmp_path / "run", summary=None, state="running", steps=3)
    second = store.start_run(job.id, kind="resume")  # the first run was killed; `tfsync resume`
    for key, value in SUMMARY.items():
        store.set_result(second.id, key, value)
    store.set_job_state(job.id, "done")
    other, _ = record(store, "other", tmp_path / "other", state="running")
    code, out, err = tfsync(capsys, "runs", "mnist")
    assert code == 0 and err == ""
    head, columns, run1, run2 = out.splitlines()
    assert head.startswith(f"job {job.id} (mnist): done")
    assert columns.split() == ["RUN", "KIND", "STARTED", "ENDED", "STATE", "RESULTS"]
    assert run1.split()[:2] == [str(first.id), "train"] and " ended " in run1 and "step 2 (bsp)" in run1
    assert run2.split()[:2] == [str(second.id), "resume"] and " done " in run2
    assert "test accuracy 91.23%" in run2 and "1,234 steps" in run2
    code, out, _ = tfsync(capsys, "runs", job.id, "--json")
    got = json.loads(out)
    assert code == 0 and got["job"]["id"] == job.id and [r["id"] for r in got["runs"]] == [first.id, second.id]
    assert [r["state"] for r in got["runs"]] == ["ended", "done"] and got["runs"][1]["results"] == SUMMARY
    assert got["runs"][0]["last_step"]["step"] == 2 and got["job"]["results"] == SUMMARY  # the latest run's
    code, out, _ = tfsync(capsys, "runs", other.id, "--json")
    (run,) = json.loads(out)["runs"]
    assert code == 0 and run["state"] == "running" and run["ended"] is None and run["results"] == {}


def test_runs_of_a_search_are_its_trials(store, tmp_path, capsys):
    """`tfsync search` stores each finished trial as a run (JobStoreTrials); the search goes on."""
    from tfsync.switch.trials import JobStoreTrials, TrialKey, TrialResult

    job, _ = record(store, "mnist", tmp_path / "run", ("bsp", "asp"), state="running")
    JobStoreTrials(store, job.id).put(TrialKey(job.signature, 0.25, 1), TrialResult(0.91, 40.0))
    code, out, _ = tfsync(capsys, "runs", "mnist")
    trial = out.splitlines()[-1]
    assert code == 0 and trial.split()[1] == "trial" and trial.split()[4:6] == ["-", "done"]  # no end: no steps
    assert "switch at 0.25 (trial 1): converged accuracy 91.00%, time 40.0 s" in trial


def test_runs_of_an_unknown_job_is_one_line_exit_2(store, tmp_path, capsys):
    record(store, "mnist", tmp_path / "run", summary=SUMMARY)
    code, out, err = tfsync(capsys, "runs", "nosuchjob")
    assert code == 2 and out == "" and "no job 'nosuchjob'" in error_line(err) and "tfsync jobs" in err


def test_status_of_an_ended_job_comes_from_the_store(store, tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "control").mkdir(parents=True)  # finish() removed manager.json
    job, run = record(store, "mnist", run_dir, ("bsp", "asp"), SUMMARY, state="stopped")
    job_file = tmp_path / "job.toml"
    job_file.write_text(f'[job]\nname = "mnist"\nrun_dir = "{run_dir}"\n')
    for target in (str(run_dir), str(job_file), job.id, "mnist"):
        code, out, err = tfsync(capsys, "status", target)
        assert code == 0 and err == "", target
        first, second = out.splitlines()
        assert first.startswith(f"job {job.id} (mnist): stopped at ") and "test accuracy 91.23%" in first
        assert "bsp -> asp" in first and second.startswith(f"run dir {run_dir};")
    code, out, _ = tfsync(capsys, "status", str(run_dir), "--json")
    got = json.loads(out)
    assert code == 0 and got["job_id"] == job.id and got["state"] == "JOB_STATE_STOPPED"
    assert got["run_id"] == run.id and got["results"] == SUMMARY


def test_status_after_a_killed_run_uses_the_manager_json_left_behind(tmp_path, monkeypatch, capsys):
    """A killed `tfsync run` leaves manager.json: its manager does not answer; the job is the
    one the file names, in the store the file names (not $TFSYNC_HOME's)."""
    with Store(tmp_path / "elsewhere.db") as other:
        job, run = record(other, "mnist", tmp_path / "somewhere", state="running")
    control = tmp_path / "run" / "control"
    control.mkdir(parents=True)
    auth.write_token(control / "token")
    (control / "manager.json").write_text(json.dumps({"address": "127.0.0.1:9", "job_id": job.id, "run_id": run.id,
                                                      "store": str(tmp_path / "elsewhere.db")}))

    def unreachable(channel, timeout, what, **kw):
        raise transport.TransportError(f"{what} not reachable within {timeout:.1f} s")
    monkeypatch.setattr(transport, "wait_ready", unreachable)  # as 127.0.0.1:9 does, without the wait
    code, out, err = tfsync(capsys, "status", str(tmp_path / "run"))
    assert code == 0 and err == "" and out.startswith(f"job {job.id} (mnist): running")
    assert "no manager answers" in out and "tfsync resume" in out


def test_status_of_a_job_found_nowhere_is_one_line_exit_2(store, tmp_path, capsys):
    record(store, "mnist", tmp_path / "run", summary=SUMMARY)
    code, out, err = tfsync(capsys, "status", str(tmp_path / "never"))
    line = error_line(err)
    assert code == 2 and out == "" and "no running job there" in line and "has no job with that" in line


def test_a_damaged_store_is_one_line_exit_1(tmp_path, capsys):
    bad = tmp_path / "jobs.db"
    bad.write_bytes(b"this is not a database" * 100)
    for args in (("jobs",), ("runs", "mnist"), ("status", "mnist")):
        code, out, err = tfsync(capsys, *args, "--store", str(bad))
        assert code == 1 and out == "" and "damaged" in error_line(err), args


@pytest.mark.parametrize("command, words", [("jobs", "newest first"), ("runs", "runs of one job"),
                                            ("status", "looked up in the job store")])
def test_help_explains_the_commands(capsys, command, words):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0 and words in " ".join(capsys.readouterr().out.split())
