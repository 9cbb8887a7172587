"""A standalone manager owns a job from submission to end: `tfsync manager` in one process,
`tfsync submit | status | metrics | stop` from others (real gRPC on loopback, real TF
tasks, the real job store), then the Resume call continues the stopped job."""

import json
import os
import signal
import subprocess
import sys

import grpc
import pytest

from helpers import DATA, interrupt, linear_job, tfsync, wait_for
from tfsync.api import auth, transport
from tfsync.api.v1 import manager_pb2, manager_pb2_grpc
from tfsync.base.ports import free_ports
from tfsync.manager.store import Store

pytestmark = pytest.mark.cluster

JOB = linear_job("ctl", "bsp", batch_size=16, epochs=20, checkpoint_every=20)


@pytest.fixture
def manager(tmp_path):
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    address = f"127.0.0.1:{free_ports(1)[0]}"
    out = open(tmp_path / "manager.out", "w")
    proc = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "manager", "--listen", address],
                            stdout=out, stderr=subprocess.STDOUT, env=env)
    out.close()
    try:
        wait_for("the manager", lambda: "listening" in (tmp_path / "manager.out").read_text() or proc.poll())
        assert proc.poll() is None, (tmp_path / "manager.out").read_text()
        yield address, env, proc
    finally:
        interrupt(proc)


@pytest.mark.slow
def test_submit_follow_stop_and_resume(tmp_path, manager):
    address, env, proc = manager
    token_file = tmp_path / "home" / "manager.token"
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"
    run_dir = tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(run_dir=run_dir))

    r = tfsync("submit", str(job), "--manager", address, "--data", DATA, "--json", env=env)
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["job_id"]

    def status():
        s = tfsync("status", str(job), "--json", env=env)
        return json.loads(s.stdout) if s.returncode == 0 else None

    first = wait_for("steps", lambda: (s := status()) and int(s.get("step", 0)) > 30 and s, timeout=150)
    assert first["job_id"] == job_id and first["state"] == "JOB_STATE_RUNNING"
    assert tfsync("stop", str(job), env=env).returncode == 0
    channel = transport.make_channel(address, token=auth.read_token(token_file))
    stub = manager_pb2_grpc.ManagerStub(channel)
    with Store(str(tmp_path / "home" / "jobs.db")) as store:
        wait_for("the job to stop", lambda: store.job(job_id).state == "stopped", timeout=120)
        (first_run,) = store.runs(job_id)
        stopped_at = store.results(first_run.id)["samples"]
        assert 0 < stopped_at < 20 * 6000

        # a malformed submission and a wrong token are refused with a message
        with pytest.raises(grpc.RpcError) as e:
            stub.SubmitJob(manager_pb2.SubmitJobRequest(config_json='{"train": {"epochs": -1}}'), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "train.epochs" in e.value.details()
        bad = manager_pb2_grpc.ManagerStub(transport.make_channel(address, token="wrong"))
        with pytest.raises(grpc.RpcError) as e:
            bad.Resume(manager_pb2.ResumeRequest(job_id=job_id), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED

        resumed = stub.Resume(manager_pb2.ResumeRequest(job_id=job_id), timeout=30)
        assert resumed.job_id == job_id
        wait_for("the resumed run", lambda: len(store.runs(job_id)) == 2 and store.job(job_id).state == "running",
                 timeout=120)
        # it continues from the stop's checkpoint: its step numbers go on from the first run's
        wait_for("steps of the resumed run", lambda: store.steps(store.runs(job_id)[1].id), timeout=120)
        (_, second) = store.runs(job_id)
        assert store.steps(second.id)[0].step == store.results(first_run.id)["pushes"] + 1
        with pytest.raises(grpc.RpcError) as e:  # one coordinator per job
            stub.Resume(manager_pb2.ResumeRequest(job_id=job_id), timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # stopping the manager stops its jobs with their tasks
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=90) == 0
    with Store(str(tmp_path / "home" / "jobs.db")) as store:
        assert store.job(job_id).state == "stopped"
    assert not (run_dir / "control" / "manager.json").exists()
