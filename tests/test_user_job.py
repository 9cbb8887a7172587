"""A model module of the user's, outside the package, in a folder tfsync has never seen:
its job is run, switched at run time, stopped and resumed through the command line
exactly as the bundled MNIST job is (issue 16); tests/test_search_cli.py searches it."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from helpers import records, tfsync, wait_for
from tfsync.manager.store import Store
from userjob import JOB_HEAD, user_job

pytestmark = pytest.mark.cluster
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")

JOB = JOB_HEAD + """learning_rate = 0.01
batch_size = 16
epochs = {epochs}
checkpoint_every = 20
[[protocol]]
name = "bsp"
{protocols}
"""


def project(tmp_path, epochs, protocols="", run="run"):
    return user_job(tmp_path / "project", JOB.format(name="blobs", run_dir=tmp_path / run, units=16, epochs=epochs,
                                                     protocols=protocols), file=f"{run}.toml")


@pytest.mark.slow
def test_a_users_job_is_switched_stopped_and_resumed(tmp_path):
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    job = project(tmp_path, epochs=10)
    run_dir = tmp_path / "run"
    run = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "run", str(job), "--json"], cwd="/", env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def status():
            r = tfsync("status", str(job), "--json", env=env)
            return json.loads(r.stdout) if r.returncode == 0 and json.loads(r.stdout).get("step") else None

        wait_for("steps of the user's job", status)
        r = tfsync("switch", str(job), "--to", "ssp", "--staleness", "2", env=env)
        # BSP ran at 2 x the rate (2 workers); SSP runs at the configuration policy's x1
        assert r.returncode == 0 and "switched bsp -> ssp (hot), learning rate x1 (the configuration policy's for " \
            "ssp)" in r.stdout, r.stdout + r.stderr
        assert status()["protocol"] == "ssp"
        r = tfsync("batch-sizes", str(job), "12", "8", env=env)
        assert r.returncode == 0, r.stderr
        wait_for("a checkpoint", lambda: list((run_dir / "checkpoints").glob("ckpt-*.index")))
        r = tfsync("stop", str(job), env=env)
        assert r.returncode == 0, r.stderr
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err[-2000:]
    stopped = json.loads(out)
    assert stopped["stopped"] and stopped["samples"] < stopped["workload_samples"]

    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "resume", str(job), "--json"], cwd="/", env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    # what the commands changed holds after the resume (issue 32 case 1): SSP, x1, 12 and 8
    assert "goes on with ssp (staleness 2) at learning rate x1 and batch sizes [12, 8] as commands set it" in r.stderr
    summary = json.loads(r.stdout)
    assert summary["resumed_from"]["samples"] > 0
    # its rate: the samples it trained itself over its own training time (issue 32 case 2)
    assert summary["samples_per_s"] * summary["train_s"] == pytest.approx(
        summary["samples"] - summary["resumed_from"]["samples"], rel=0.01)
    # the summary covers the whole job: both runs, their phases on one time base
    assert [ph["protocol"] for ph in summary["timeline"]] == ["bsp", "ssp", "ssp"]
    assert summary["timeline"][-1]["resumed"] and summary["timeline"][-1]["time"] > summary["timeline"][1]["time"]
    assert [r["stopped"] for r in summary["runs"]] == [True, False]
    assert summary["job_wall_s"] == pytest.approx(stopped["wall_s"] + summary["wall_s"], abs=0.01)
    recs = records(run_dir)
    resumed = max(i for i, x in enumerate(recs) if x.get("event") == "resume")
    before = [x for x in recs[:resumed] if x.get("protocol") == "ssp"]
    assert before and all(math.isclose(x["lr"], 0.01, rel_tol=1e-5) for x in before)
    pushes = [x for x in recs[resumed:] if "worker" in x]
    assert pushes and {x["protocol"] for x in pushes} == {"ssp"}
    assert {(x["worker"], x["batch_size"]) for x in pushes} == {(0, 12), (1, 8)}
    assert all(math.isclose(x["lr"], 0.01, rel_tol=1e-5) for x in pushes), {x["lr"] for x in pushes}
    assert summary["samples"] >= summary["workload_samples"] == 10 * 1280
    assert summary["test_accuracy"] > 0.8  # the blobs are separable: it learned
    with Store(tmp_path / "home" / "jobs.db") as store:
        (stored,) = store.jobs()
        assert stored.state == "done" and [r.kind for r in store.runs(stored.id)] == ["train", "resume"]


def test_a_job_without_accuracy_is_searched_on_its_test_loss(tmp_path):
    """A regression job has no test accuracy: the search compares -ln(converged test loss)
    (a margin beta = a relative margin exp(beta) on the loss), here against a test loss to
    reach (--target-loss) so that one trial decides."""
    job = tmp_path / "project" / "job.toml"
    job.parent.mkdir()
    shutil.copy(os.path.join(EXAMPLES, "regression", "model.py"), job.parent / "model.py")
    job.write_text(open(os.path.join(EXAMPLES, "regression", "job.toml")).read().replace("epochs = 4", "epochs = 1"))
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    search = [sys.executable, "-m", "tfsync.cli", "search", str(job), "--runs", "1", "--settings", "1", "--no-ends"]
    r = subprocess.run([*search, "--target-loss", "1000", "--json"], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    found = json.loads(r.stdout)
    assert found["metric"] == "neg_log_loss" and found["target"] == pytest.approx(-math.log(1000))
    (tried,) = found["tried"]
    assert tried["fraction"] == 0.5 and tried["accepted"] and found["fraction"] == 0.5  # any loss beats 1000
    shown = subprocess.run([*search, "--show"], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "-ln(test loss)" in shown.stdout and "a test loss <= 1010" in shown.stdout


LBBSP_JOB = JOB_HEAD + """learning_rate = 0.005
batch_size = 32
epochs = 10
[[protocol]]
name = "lbbsp"
predictor = "ema"
guard = false   # the paper's sizing: a paused worker's stalls do not shrink with its batch
[[inject]]
worker = 1
slowdown = 4.0
start_s = 0.0
duration_s = 1000
"""


def test_lbbsp_sizes_a_users_model_around_an_injected_straggler(tmp_path):
    """LB-BSP and straggler injection on a model tfsync has never seen: worker 1 paused to a
    quarter of its speed throughout; every full round still trains X = 2 x 32 examples,
    split so that the slow worker gets the smaller share once its slowdown is measured.
    The PS closes and opens the rounds, yet the speeds LB-BSP sizes from are the
    workers': each push's turnaround from the PS's release of its round to its landing,
    on the PS's clock (the coordinator sees a round's pushes together, after the PS
    already opened the next one: by its own clock every worker looked alike)."""
    job = user_job(tmp_path / "project", LBBSP_JOB.format(name="blobs-lb", run_dir=tmp_path / "run", units=64))
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", str(job), "--json", "--no-manager"], cwd="/",
                       env=dict(os.environ, TFSYNC_HOME=str(tmp_path / "home")), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["injected"][0]["what"] == "begin" and summary["test_accuracy"] > 0.8
    assert summary["injected"][0]["slowdown"] == 4.0  # the report's shaded span says "4x slower"
    assert summary["timeline"][0]["protocol"] == "lbbsp"
    assert summary["timeline"][0]["lr"] == pytest.approx(2 * 0.005)  # it aggregates like BSP: n x eta
    pushes = [p for p in map(json.loads, open(tmp_path / "run" / "metrics.jsonl")) if "event" not in p]
    assert {p["mode"] for p in pushes} == {"aggregate"}
    rounds = {}
    for p in pushes:
        rounds.setdefault(p["round"], {})[p["worker"]] = p["batch_size"]
    full = {k: v for k, v in rounds.items() if len(v) == 2}
    assert len(full) >= 100 and all(v[0] + v[1] == 64 for v in full.values())
    # the EMA has seen the slowdown by the second half of the rounds, however fast the machine (a slowdown
    # that began some seconds in left too few rounds after it on a fast machine)
    late = [full[k][1] for k in sorted(full)[len(full) // 2:]]
    assert sum(late) / len(late) < 24, late  # the slow worker's share (even: 32)
    assert summary["ps_rounds"] >= 0.9 * summary["updates"]
    # one machine, one clock: from the release to the landing holds the worker's own step
    timed = [p for p in pushes if "turnaround_s" in p]   # (kept beside a prediction)
    assert len(timed) > 0.9 * len(pushes) and all(p["turnaround_s"] >= p["compute_s"] - 1e-4 for p in timed), \
        [(p["round"], p["turnaround_s"], p["compute_s"]) for p in timed if p["turnaround_s"] < p["compute_s"]][:5]
