"""A policy file drives a real job: `tfsync run` with protocol rlp on a local cluster."""

import json

import numpy as np
import pytest

from helpers import DATA, linear_job, run_here
from tfsync.policy.rlp import QNetwork

pytestmark = pytest.mark.cluster

JOB = linear_job("rl", {"name": "rlp", "model": "{model}"}, epochs=0.2, checkpoint_every=0)


def lockstep_network() -> QNetwork:
    """A hand-set network that reads l_n, the updates applied during the pusher's step:
    l_n = 0 -> NONE, l_n >= 1 -> ALL. With 2 workers that is BSP in apply form."""
    w1 = np.zeros((40, 1))
    w1[3, 0] = 1.0  # newest tuple's l_n / 10
    return QNetwork([w1, np.zeros(1), np.array([[-20.0, 0.0, 20.0]]), np.array([1.0, 0.0, -1.0])])


def test_a_policy_file_runs_a_real_job_and_its_actions_are_obeyed(tmp_path, capsys):
    model = tmp_path / "policy.npz"
    lockstep_network().save(model)
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(run_dir=tmp_path / "run", model=model))
    r = run_here(capsys, "run", str(job), "--json", "--no-manager", "--data", DATA)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    stats = summary["timeline"][0]["stats"]
    actions = stats["actions"]
    assert summary["timeline"][0]["protocol"] == "rlp"
    # Each round: the first arrival says NONE; the second says ALL, or NONE when its step
    # began after the first one's update (l_n = 0), which the policy turns into ALL (forced).
    forced = stats["forced_all"]
    assert actions["none"] > 5 and actions["submitter"] == 0
    assert abs(actions["none"] - actions["all"] - 2 * forced) <= 1
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    clocks = {0: 0, 1: 0}
    for rec in (x for x in records if "worker" in x):  # arrival order
        clocks[rec["worker"]] += 1
        assert abs(clocks[0] - clocks[1]) <= 1  # lock-step, as the network decided
    assert summary["test_accuracy"] > 0.5


def test_a_job_naming_rlp_without_a_model_is_refused(tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text(JOB.replace('model = "{model}"\n', "").format(run_dir=tmp_path / "run"))
    r = run_here(capsys, "run", str(job))
    assert r.returncode == 2 and "protocol[0].model: missing" in r.stderr
