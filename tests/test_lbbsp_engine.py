"""LB-BSP from a job file on a real local cluster: every round processes X = n * B samples,
split between the workers by their predicted speeds (LB-BSP §3.2)."""

import collections
import json
import subprocess
import sys

import pytest

from helpers import DATA, linear_job

pytestmark = pytest.mark.cluster

JOB = linear_job("lb", {"name": "lbbsp", "predictor": "ema"}, epochs=0.5)
# (a slowed worker's batches, sized from the PS's clock: test_user_job's injected straggler)


def _run(tmp_path, text):
    job = tmp_path / "job.toml"
    job.write_text(text.format(run_dir=tmp_path / "run"))
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", str(job), "--json", "--data", DATA, "--no-manager"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    pushes = [x for x in map(json.loads, open(tmp_path / "run" / "metrics.jsonl")) if "worker" in x]
    return json.loads(r.stdout), pushes


def test_lbbsp_job_keeps_the_round_total_and_learns(tmp_path):
    summary, pushes = _run(tmp_path, JOB)
    assert summary["timeline"][0]["protocol"] == "lbbsp"
    assert summary["timeline"][0]["lr"] == pytest.approx(0.1)  # aggregates like BSP: n * eta
    assert summary["ps_rounds"] >= 40   # the PS closes and opens the rounds, at the sizes the coordinator sets
    rounds = collections.defaultdict(list)
    for p in pushes:
        assert p["mode"] == "aggregate"
        rounds[p["round"]].append(p["batch_size"])
    full = [sizes for sizes in rounds.values() if len(sizes) == 2]
    assert len(full) >= 40 and all(sum(sizes) == 64 for sizes in full)
    assert summary["test_accuracy"] > 0.7
