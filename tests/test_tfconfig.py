"""TF_CONFIG (tfsync.base.tfconfig): tasks a platform starts (a Kubernetes TFJob, a Slurm
script), each from its own TF_CONFIG; `tfsync tfconfig` writes them, the task server and
`tfsync run` read them, and what tfsync cannot honour there is refused in one line."""

import json
import os
import subprocess
import sys

import pytest

from helpers import DATA, linear_job, tfsync
from tfsync.base import tfconfig
from tfsync.base.ports import free_ports

SPEC = {"chief": ["c:1"], "ps": ["p:2"], "worker": ["w:3", "w:4"]}


@pytest.mark.unit
def test_every_task_gets_the_cluster_and_its_own_place():
    configs = tfconfig.generate(SPEC)
    assert sorted(configs) == [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    read = tfconfig.read({"TF_CONFIG": configs[("worker", 1)]})
    assert read == tfconfig.TFConfig(SPEC, "worker", 1)
    assert tfconfig.read({}) is None


@pytest.mark.unit
@pytest.mark.parametrize("value, field", [
    ("{not json", "TF_CONFIG is not JSON"),
    (json.dumps({"cluster": {"worker": ["w:3"], "ps": ["p:2"]}, "task": {"type": "worker"}}), "TF_CONFIG.cluster.chief"),
    (json.dumps({"cluster": {**SPEC, "evaluator": ["e:5"]}, "task": {"type": "chief"}}), "TF_CONFIG.cluster.evaluator"),
    (json.dumps({"cluster": SPEC, "task": {"type": "worker", "index": 2}}), "TF_CONFIG.task.index"),
    (json.dumps({"cluster": SPEC, "task": {"type": "master"}}), "TF_CONFIG.task.type"),
])
def test_a_tf_config_tfsync_cannot_use_is_refused_naming_the_field(value, field):
    with pytest.raises(tfconfig.TFConfigError, match=field.replace(".", r"\.")):
        tfconfig.read({"TF_CONFIG": value})


@pytest.mark.unit
@pytest.mark.parametrize("task, overrides, field", [
    ("worker", [], "TF_CONFIG"),
    ("chief", ["cluster.workers=3"], "cluster.workers"),
    ("chief", ["switch.method=restart"], "switch.method"),
])
def test_tfsync_run_refuses_what_it_cannot_honour_under_tf_config(tmp_path, monkeypatch, task, overrides, field):
    from tfsync.job.config import load_job
    from tfsync.job.errors import ConfigError
    from tfsync.cli.jobrun import platform_cluster

    job = tmp_path / "job.toml"
    job.write_text(linear_job("tc", "bsp").format(run_dir=tmp_path / "run"))
    monkeypatch.setenv("TF_CONFIG", tfconfig.generate(SPEC)[(task, 0)])
    with pytest.raises(ConfigError) as e:
        platform_cluster(load_job(str(job), overrides=overrides))
    assert e.value.field == field and "\n" not in str(e.value)


@pytest.mark.cluster
def test_a_job_trains_on_tasks_a_platform_started_from_their_tf_config(tmp_path):
    """PS and workers started as a platform starts them (`python -m tfsync.engine.server`,
    TF_CONFIG from `tfsync tfconfig`, working directory the shared run directory); `tfsync
    run` with the chief's TF_CONFIG trains on them and leaves them running (not its own)."""
    job, run_dir = tmp_path / "job.toml", tmp_path / "run"
    job.write_text(linear_job("tc", {"name": "bsp", "until": 0.5}, "asp", epochs=0.5).format(run_dir=run_dir))
    chief, ps, w0, w1 = (f"127.0.0.1:{p}" for p in free_ports(4))
    out = tfsync("tfconfig", str(job), "--chief", chief, "--ps", ps, "--workers", f"{w0},{w1}", "--json")
    assert out.returncode == 0, out.stderr
    configs = json.loads(out.stdout)
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    tasks = [subprocess.Popen([sys.executable, "-m", "tfsync.engine.server"], cwd=run_dir,
                              env=dict(env, TF_CONFIG=configs[name], TF_CPP_MIN_LOG_LEVEL="3"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name in ("ps:0", "worker:0", "worker:1")]
    try:
        r = tfsync("run", str(job), "--json", "--data", DATA, "--no-manager", "--no-report",
                   env=dict(env, TF_CONFIG=configs["chief:0"]), timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        summary = json.loads(r.stdout)
        assert summary["samples"] >= summary["workload_samples"] and summary["test_accuracy"] > 0.5
        assert [p["protocol"] for p in summary["timeline"]] == ["bsp", "asp"]
        assert "TF_CONFIG" in summary["task_ports"]
        assert all(t.poll() is None for t in tasks), "tfsync stopped a task it did not start"
    finally:
        for t in tasks:
            t.kill()
            t.wait(10)


@pytest.mark.unit
def test_a_restart_switch_command_is_refused_on_a_platforms_tasks():
    """The manager's `tfsync switch --method restart` on such a run is refused (the run goes
    on), not a failed run: tfsync cannot start new tasks there."""
    from tfsync.engine.cluster import PlatformCluster
    from tfsync.engine.commands import Command, check, plan_switch
    from tfsync.engine.phase import Phase
    from tfsync.policy import BSP

    cmd = Command("c1", "switch", protocol="asp", method="restart")
    with pytest.raises(ValueError, match="platform's"):
        plan_switch(cmd, check(cmd, 2), Phase(BSP()), 2, 64, lambda protocol, n: 1.0,
                    restartable=PlatformCluster(SPEC).restartable)
    with pytest.raises(Exception, match="TF_CONFIG's tasks are the platform's"):
        make = PlatformCluster.factory(SPEC)
        make(2, 1, "127.0.0.1"), make(2, 1, "127.0.0.1")   # a second generation
