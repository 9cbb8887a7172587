"""`tfsync search` end to end on a real local cluster, on a model module of the user's in a
folder tfsync has never seen (tests/userjob.py), run from another directory:
interrupted, it resumes from the trials in the job store without training any of them
again; `--show` prints the answer; `tfsync run` then switches at the stored point (and
not when the job says switch.point = "job")."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from helpers import default_sigint, tfsync
from tfsync.cli.search import stored_switch_point
from tfsync.job.config import load_job
from tfsync.manager.store import Store
from tfsync.switch.trials import config_signature
from userjob import JOB_HEAD, user_job

pytestmark = pytest.mark.cluster

JOB = JOB_HEAD + """learning_rate = 0.01
batch_size = 16
epochs = 2
{switch}
"""


def write_job(tmp_path, run: str, switch: str = ""):
    return user_job(tmp_path / "project", JOB.format(name="recurring", run_dir=tmp_path / run, units=16,
                                                     switch=switch), file=f"{run}.toml")


def stored_trials(db_path, signature):
    if not os.path.exists(db_path):
        return []
    with Store(db_path) as store:
        return [(r.config["search"], res) for r, res in store.runs_by_signature(signature)
                if r.kind == "trial" and "converged_accuracy" in res]


@pytest.mark.slow
def test_interrupted_search_resumes_and_run_uses_the_stored_point(tmp_path):
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    job = write_job(tmp_path, "run")
    signature = config_signature(load_job(job).to_dict())
    db = str(tmp_path / "home" / "jobs.db")
    args = ["search", str(job), "--runs", "1", "--settings", "1"]

    proc = subprocess.Popen([sys.executable, "-m", "tfsync.cli", *args], cwd="/", env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 240
        while not stored_trials(db, signature):  # the BSP trial is in the store
            assert proc.poll() is None and time.monotonic() < deadline, "no trial stored in time"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # while the second trial trains
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "resume" in err
    def left():   # the trial's fork server and tasks (forks of it: its command line) end with it
        return [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]

    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left() == [], "the interrupted trial left processes behind"
    done_before = stored_trials(db, signature)
    assert [s["fraction"] for s, _ in done_before] == [1.0]

    out = tfsync(*args, "--json", env=env, timeout=600, cwd="/")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["trials_reused"] == 1 and result["trials_run"] == 2  # the BSP trial is not trained again
    assert result["bsp"] == [done_before[0][1]["converged_accuracy"]]
    assert [t["fraction"] for t in result["tried"]] == [0.5, 0.0]   # the switch point, then ASP only
    fractions = sorted(s["fraction"] for s, _ in stored_trials(db, signature))
    assert fractions == [0.0, 0.5, 1.0]  # every trial stored once
    times = {float(f): t for f, t in result["times"].items()}   # the acceptable plans' mean training times
    assert result["fraction"] == min(times, key=times.get)
    f = result["fraction"]

    show = tfsync("search", "--show", str(job), env=env, timeout=600, cwd="/")
    assert show.returncode == 0 and f"signature {signature}" in show.stdout and "accept" in show.stdout

    run = tfsync("run", str(job), "--json", "--no-manager", env=env, timeout=600, cwd="/")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    expected = [["bsp", f], ["asp", 1.0]] if 0 < f < 1 else [["bsp" if f else "asp", 1.0]]
    assert summary["meta"]["protocols"] == expected
    assert "found by `tfsync search`" in run.stderr
    assert summary["evals"] == [] and summary["converged_accuracy"] == summary["test_accuracy"]

    # switch.point = "job": the job file's own plan, whatever is stored
    own = write_job(tmp_path, "own", '[switch]\npoint = "job"')
    os.environ["TFSYNC_HOME"], home = env["TFSYNC_HOME"], os.environ.get("TFSYNC_HOME")
    try:
        cfg, found = stored_switch_point(load_job(own))
        assert found is None and [p.until for p in cfg.protocol] == [0.5, 1.0]
        cfg, found = stored_switch_point(load_job(job))
        assert found["fraction"] == f
    finally:
        os.environ.pop("TFSYNC_HOME") if home is None else os.environ.__setitem__("TFSYNC_HOME", home)


def test_show_without_a_search_says_what_to_do(tmp_path):
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    job = write_job(tmp_path, "run")
    out = tfsync("search", "--show", str(job), env=env, timeout=600)
    assert out.returncode == 1 and "no switch point stored" in out.stderr and "tfsync search" in out.stderr
    bad = tfsync("search", str(job), "--runs", "0", env=env, timeout=600)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "runs" in bad.stderr
