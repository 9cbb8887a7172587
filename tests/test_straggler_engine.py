"""Sync-Switch's online straggler policies on a real 3-worker cluster, from a job file:
worker 2 is paused to a fifth of its speed for a while (tfsync.inject.pause); the greedy
policy runs ASP while it is detected, the elastic one trains BSP without it and takes it
back at the switch point. The elastic test trains the bundled linear MNIST model, the
greedy one a user's model module, data and Adam in a folder tfsync has never seen
(issue 16: the policies work on a user's job exactly as on the bundled one)."""

import json
import math

import pytest

from helpers import DATA, linear_job, run_here
from userjob import JOB_HEAD, user_job

pytestmark = pytest.mark.cluster

# BSP for 0.8 of the workload, then ASP; worker 2 at a fifth of its speed from 1 s to 9 s
PLAN = """
[[protocol]]
name = "bsp"
until = 0.8
[[protocol]]
name = "asp"
[switch]
stragglers = "{policy}"
straggler_window_s = 1.0
straggler_k = 2
readmit_after_s = 1000
[[inject]]
worker = 2
slowdown = 5.0
start_s = 1.0
duration_s = 8.0
"""
CLUSTER = """
[cluster]
workers = 3
"""
JOB = linear_job("strag", batch_size=16, epochs=2.5, extra=CLUSTER + PLAN)  # 15 000 samples of the 6 000-image MNIST sample
# The user's job: the same workload in samples (12 epochs of 1 280 examples)
USER_JOB = JOB_HEAD + """learning_rate = 0.01
batch_size = 16
epochs = 12
""" + CLUSTER + PLAN


def run(tmp_path, capsys, monkeypatch, policy, user=False):
    if user:  # run from elsewhere: the job names its module relative to the job file
        job = user_job(tmp_path / "project", USER_JOB.format(name="strag", run_dir=tmp_path / "run", units=16,
                                                             policy=policy))
        args = []
    else:
        job = tmp_path / "job.toml"
        job.write_text(JOB.format(run_dir=tmp_path / "run", policy=policy))
        args = ["--data", DATA]
    monkeypatch.chdir("/")
    out = run_here(capsys, "run", str(job), "--json", "--no-manager", *args)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    return s, s["timeline"][0]["stats"]


def test_elastic_trains_without_the_straggler_then_takes_it_back(tmp_path, capsys, monkeypatch):
    s, stats = run(tmp_path, capsys, monkeypatch, "elastic")
    assert s["injected"][0]["what"] == "begin" and s["test_accuracy"] > 0.6
    removed = [t for t, what, w in stats["membership"] if what == "remove" and w == 2]
    restored = [t for t, what, w in stats["membership"] if what == "restore" and w == 2]
    assert removed and restored and restored[-1] > removed[0], stats["membership"]
    assert any(w == 2 and kind == "became" for _, w, kind in stats["detected"])
    states = [state for _, state in stats["states"]]
    assert states[-1] == "final" and "asp" not in states  # BSP throughout, ASP only after the switch
    assert s["ps_rounds"] > 0   # its rounds with every worker in ran on the PS
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        pushes = [json.loads(line) for line in f if '"event"' not in line]
    t0 = s["started_at"]
    out = [p for p in pushes if p["worker"] == 2 and removed[0] + 0.5 < p["time"] + t0 < restored[-1]]
    assert out == [], "a removed worker kept training"


def test_greedy_runs_asp_while_a_straggler_is_present_on_a_users_model(tmp_path, capsys, monkeypatch):
    s, stats = run(tmp_path, capsys, monkeypatch, "greedy", user=True)
    assert s["meta"]["model"].endswith("blobs_model.py:mlp") and s["samples"] >= s["workload_samples"] == 12 * 1280
    assert s["injected"][0]["what"] == "begin" and s["test_accuracy"] > 0.8  # the blobs are separable
    states = [state for _, state in stats["states"]]
    assert any(w == 2 and kind == "became" for _, w, kind in stats["detected"])
    assert "asp" in states and states.index("asp") < len(states) - 1  # left BSP for the straggler
    assert states[-1] == "final" and stats["switches"] >= 2
    assert s["ps_rounds"] > 0   # its BSP rounds without a straggler ran on the PS
    began, ended = (min([s["started_at"] + e["time"] for e in s["injected"] if e["what"] == what] or [math.inf])
                    for what in ("begin", "end"))
    assert began < next(t for t, state in stats["states"] if state == "asp") < ended  # while it was slow
    # the configuration policy's rates on the user's Adam: BSP rounds at n x eta, ASP steps at eta
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        pushes = [json.loads(line) for line in f if '"event"' not in line]
    rates = {(p["mode"], round(p["lr"], 6)) for p in pushes if not p["dropped"]}  # a dropped push updates nothing
    assert rates == {("aggregate", 0.03), ("apply", 0.01)}, rates
