"""Sync-Switch's online straggler policies on a real 3-worker cluster, from a job file:
worker 2 is paused to a fifth of its speed for a while (tfsync.inject.pause); the greedy
policy runs ASP while it is detected, the elastic one trains BSP without it and takes it
back at the switch point."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster

DATA = os.path.join(os.path.dirname(__file__), "..", "tfsync", "datasets", "mnist_sample.npz")
JOB = """
[job]
name = "strag"
run_dir = "{run_dir}"
[cluster]
workers = 3
[model]
name = "linear"
[train]
batch_size = 16
learning_rate = 0.05
epochs = 2.5
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


def run(tmp_path, policy):
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(run_dir=tmp_path / "run", policy=policy))
    out = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", str(job), "--json", "--no-manager",
                          "--data", DATA], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    return s, s["timeline"][0]["stats"]


def test_elastic_trains_without_the_straggler_then_takes_it_back(tmp_path):
    s, stats = run(tmp_path, "elastic")
    assert s["injected"][0]["what"] == "begin" and s["test_accuracy"] > 0.6
    removed = [t for t, what, w in stats["membership"] if what == "remove" and w == 2]
    restored = [t for t, what, w in stats["membership"] if what == "restore" and w == 2]
    assert removed and restored and restored[-1] > removed[0], stats["membership"]
    assert any(w == 2 and kind == "became" for _, w, kind in stats["detected"])
    states = [state for _, state in stats["states"]]
    assert states[-1] == "final" and "asp" not in states  # BSP throughout, ASP only after the switch
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        pushes = [json.loads(line) for line in f if '"event"' not in line]
    t0 = s["started_at"]
    out = [p for p in pushes if p["worker"] == 2 and removed[0] + 0.5 < p["time"] + t0 < restored[-1]]
    assert out == [], "a removed worker kept training"


def test_greedy_runs_asp_while_a_straggler_is_present(tmp_path):
    s, stats = run(tmp_path, "greedy")
    assert s["test_accuracy"] > 0.6
    states = [state for _, state in stats["states"]]
    assert any(w == 2 and kind == "became" for _, w, kind in stats["detected"])
    assert "asp" in states and states.index("asp") < len(states) - 1  # left BSP for the straggler
    assert states[-1] == "final" and stats["switches"] >= 2
