"""The node hook on a real gRPC server on loopback: real TF task processes (cluster test)
and a stand-in task program that only opens its port (unit tests)."""

import json
import subprocess
import sys
import textwrap
import time

import grpc
import psutil
import pytest

from tfsync.api import auth, transport
from tfsync.api.v1 import common_pb2, node_hook_pb2, node_hook_pb2_grpc
from tfsync.base.ports import free_ports
from tfsync.hooks import firewall, node
from tfsync.hooks.tasks import port_open

RUNNING, STOPPED = common_pb2.TASK_STATE_RUNNING, common_pb2.TASK_STATE_STOPPED

# Listens on its spec address like a TF task would, and exits with its parent.
FAKE_TASK = textwrap.dedent("""
    import argparse, json, os, socket, time
    p = argparse.ArgumentParser()
    for a in ("--cluster", "--job", "--index", "--parent-pid"):
        p.add_argument(a)
    args = p.parse_args()
    host, port = json.loads(args.cluster)[args.job][int(args.index)].rsplit(":", 1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen(16)
    print("cwd", os.getcwd(), flush=True)
    while os.getppid() == int(args.parent_pid):
        time.sleep(0.05)
""")


@pytest.fixture
def make_hook(tmp_path):
    """make_hook(fake=True) -> (stub, hook, token); every hook is stopped at the end."""
    made = []

    def make(fake=True):
        fake_path = tmp_path / "fake_task.py"
        fake_path.write_text(FAKE_TASK)
        command = (sys.executable, str(fake_path)) if fake else node.TASK_COMMAND
        token = auth.new_token()
        hook, port = node.serve(token=token, log_dir=str(tmp_path / "logs"), node="node-a", task_command=command)
        channel = transport.make_channel(f"127.0.0.1:{port}", token=token)
        made.append((hook, channel))
        return node_hook_pb2_grpc.NodeHookStub(channel), hook, token, port

    try:
        yield make
    finally:
        for hook, channel in made:
            channel.close()
            hook.stop(grace=None)


def _spec(ps=1, workers=1):
    ports = free_ports(ps + workers + 1)
    addr = [f"127.0.0.1:{p}" for p in ports]
    return {"chief": addr[:1], "ps": addr[1:1 + ps], "worker": addr[1 + ps:]}


def _start(stub, spec, tasks=(("ps", 0),), wait=10.0, job_id="job-1", env=None):
    return stub.StartTasks(node_hook_pb2.StartTasksRequest(
        job_id=job_id, cluster_spec_json=json.dumps(spec), env=env or {}, wait_ready_s=wait,
        tasks=[common_pb2.TaskRef(job=j, index=i) for j, i in tasks]), timeout=wait + 10)


def _gone(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.cluster
def test_real_tf_task_lifecycle(make_hook):
    stub, hook, _, _ = make_hook(fake=False)
    spec = _spec()
    started = _start(stub, spec, wait=90.0).tasks[0]
    assert started.state == RUNNING, f"TF task did not serve within 90 s; see {started.log_path}"
    assert port_open(spec["ps"][0])
    health = stub.Health(node_hook_pb2.HealthRequest(), timeout=10)
    assert [(t.task.job, t.pid, t.state) for t in health.tasks] == [("ps", started.pid, RUNNING)]
    samples = list(stub.StreamResources(node_hook_pb2.StreamResourcesRequest(interval_s=0.1, max_samples=3),
                                        timeout=10))
    assert len(samples) == 3 and samples[-1].node == "node-a" and samples[-1].memory_total_bytes > 0
    proc = samples[-1].processes[0]
    assert (proc.pid, proc.alive) == (started.pid, True) and proc.rss_bytes > 10 * 2**20  # TF is loaded

    again = _start(stub, spec, wait=0.0)  # a retried StartTasks returns the running task
    assert again.tasks[0].pid == started.pid and "already running" in again.messages[0]

    restarted = stub.RestartTask(node_hook_pb2.RestartTaskRequest(
        job_id="job-1", task=common_pb2.TaskRef(job="ps", index=0), expected_pid=started.pid, wait_ready_s=90.0),
        timeout=100)
    assert restarted.pid != started.pid and restarted.restarts == 1 and restarted.state == RUNNING
    assert _gone(started.pid) and port_open(spec["ps"][0])

    stopped = stub.StopTasks(node_hook_pb2.StopTasksRequest(job_id="job-1"), timeout=20).tasks
    assert [(t.pid, t.state) for t in stopped] == [(restarted.pid, STOPPED)]
    assert _gone(restarted.pid) and not port_open(spec["ps"][0])


@pytest.mark.unit
def test_malformed_requests_are_invalid_argument_and_the_hook_goes_on(make_hook):
    stub, _, _, _ = make_hook()
    spec = _spec()
    bad = [
        node_hook_pb2.StartTasksRequest(job_id="j", cluster_spec_json="{not json",
                                        tasks=[common_pb2.TaskRef(job="ps", index=0)]),
        node_hook_pb2.StartTasksRequest(job_id="j", cluster_spec_json=json.dumps(spec),
                                        tasks=[common_pb2.TaskRef(job="evaluator", index=0)]),
        node_hook_pb2.StartTasksRequest(job_id="j", cluster_spec_json=json.dumps(spec),
                                        tasks=[common_pb2.TaskRef(job="ps", index=-1)]),
        node_hook_pb2.StartTasksRequest(job_id="j", cluster_spec_json=json.dumps(spec),
                                        tasks=[common_pb2.TaskRef(job="worker", index=1)]),
        node_hook_pb2.StartTasksRequest(job_id="../etc", cluster_spec_json=json.dumps(spec),
                                        tasks=[common_pb2.TaskRef(job="ps", index=0)]),
        node_hook_pb2.StartTasksRequest(job_id="j", cluster_spec_json=json.dumps(spec), env={"LD_PRELOAD": "x.so"},
                                        tasks=[common_pb2.TaskRef(job="ps", index=0)]),
    ]
    expected = ["not valid JSON", "cannot run on a node hook", "negative", "outside the cluster spec",
                "job_id '../etc'", "LD_PRELOAD"]
    for request, words in zip(bad, expected):
        with pytest.raises(grpc.RpcError) as e:
            stub.StartTasks(request, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.value.details()
    for interval in (0.0, -1.0, 0.01):
        with pytest.raises(grpc.RpcError) as e:
            list(stub.StreamResources(node_hook_pb2.StreamResourcesRequest(interval_s=interval), timeout=10))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and ">= 0.05" in e.value.details()
    assert stub.Health(node_hook_pb2.HealthRequest(), timeout=10).tasks == []  # nothing was started
    ok = _start(stub, spec, env={"OMP_NUM_THREADS": "1"})
    assert ok.tasks[0].state == RUNNING


@pytest.mark.unit
def test_retries_and_unknown_tasks(make_hook):
    stub, _, _, _ = make_hook()
    spec = _spec(workers=2)
    first = _start(stub, spec, tasks=[("worker", 0), ("worker", 1)]).tasks
    assert [t.state for t in first] == [RUNNING, RUNNING]
    other = _spec()
    with pytest.raises(grpc.RpcError) as e:  # same task, another spec: refused, not replaced
        _start(stub, other, tasks=[("worker", 0)])
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    ref = common_pb2.TaskRef(job="worker", index=0)
    new = stub.RestartTask(node_hook_pb2.RestartTaskRequest(job_id="job-1", task=ref, expected_pid=first[0].pid,
                                                            wait_ready_s=10), timeout=20)
    retried = stub.RestartTask(node_hook_pb2.RestartTaskRequest(job_id="job-1", task=ref, expected_pid=first[0].pid),
                               timeout=20)
    assert new.pid != first[0].pid and retried.pid == new.pid and retried.restarts == 1
    with pytest.raises(grpc.RpcError) as e:
        stub.RestartTask(node_hook_pb2.RestartTaskRequest(job_id="job-2", task=ref), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    not_ours = stub.StopTasks(node_hook_pb2.StopTasksRequest(job_id="job-2", tasks=[ref]), timeout=10)
    assert not_ours.tasks == [] and "not started by this hook" in not_ours.messages[0]
    assert psutil.pid_exists(new.pid)  # job-2's stop touched nothing of job-1
    stub.StopTasks(node_hook_pb2.StopTasksRequest(job_id="job-1", tasks=[ref]), timeout=10)
    again = stub.StopTasks(node_hook_pb2.StopTasksRequest(job_id="job-1", tasks=[ref]), timeout=10)
    assert again.tasks[0].state == STOPPED and "already ended" in again.messages[0]
    assert [t.state for t in stub.Health(node_hook_pb2.HealthRequest(), timeout=10).tasks] == [STOPPED, RUNNING]


@pytest.mark.unit
def test_stopping_the_hook_kills_its_tasks(make_hook):
    """... and removes its firewall table, which the reply named (or the reply says the
    ports are open, and why)."""
    stub, hook, _, _ = make_hook()
    spec = _spec(workers=1)
    reply = _start(stub, spec, tasks=[("ps", 0), ("worker", 0)])
    pids = [t.pid for t in reply.tasks]
    assert all(psutil.pid_exists(p) for p in pids)
    fw = hook.supervisor.firewall
    if firewall.unavailable_reason() is None:
        ports = sorted(int(a.rsplit(":", 1)[1]) for a in spec["ps"] + spec["worker"])
        assert reply.task_ports == (f"firewalled: ports {ports[0]}, {ports[1]} of this node accept only 127.0.0.0/8, "
                                    f"127.0.0.1, ::1 (nftables table inet {fw.table})")
        assert fw.table in _nft_tables()
    else:
        assert fw is None and reply.task_ports.startswith("every interface, unprotected: ")
    hook.stop(grace=None)
    assert all(_gone(p) for p in pids)
    if fw is not None:
        assert fw.table not in _nft_tables()


def _nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout


@pytest.mark.unit
def test_wrong_or_missing_token_is_unauthenticated(make_hook):
    _, _, _, port = make_hook()
    for channel in (transport.make_channel(f"127.0.0.1:{port}", token=auth.new_token()),
                    grpc.insecure_channel(f"127.0.0.1:{port}")):
        with channel:
            with pytest.raises(grpc.RpcError) as e:
                node_hook_pb2_grpc.NodeHookStub(channel).Health(node_hook_pb2.HealthRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.unit
def test_stream_resources_reports_each_task_and_ends_when_asked(make_hook):
    stub, _, _, _ = make_hook()
    task = _start(stub, _spec()).tasks[0]
    samples = list(stub.StreamResources(node_hook_pb2.StreamResourcesRequest(interval_s=0.1, max_samples=4),
                                        timeout=60))
    # paced: 3 intervals between the wake-ups; each sample's time is read after its work
    # (psutil's readings), which a busy machine lengthens unevenly (CI: 0.298 s), so a
    # span of more than 2 intervals, where samples sent at once would span milliseconds
    assert len(samples) == 4 and samples[-1].time - samples[0].time > 0.2
    assert all(s.processes[0].pid == task.pid and s.processes[0].alive for s in samples)
    assert samples[-1].processes[0].rss_bytes > 0 and samples[-1].time > samples[0].time
    assert list(stub.StreamResources(node_hook_pb2.StreamResourcesRequest(
        interval_s=0.05, max_samples=1, job_id="other"), timeout=10))[0].processes == []


def _chunks(stage_id, name, data, sha=None, size=None, chunk=3):
    import hashlib
    yield node_hook_pb2.FileChunk(stage_id=stage_id, name=name, sha256=sha or hashlib.sha256(data).hexdigest(),
                                  size=len(data) if size is None else size)
    for i in range(0, len(data), chunk):
        yield node_hook_pb2.FileChunk(data=data[i:i + chunk])


@pytest.mark.unit
def test_staged_files_reach_the_tasks_working_directory_once_and_checked(make_hook, tmp_path):
    """StageFile keeps a file under the job's stage once its digest checks; tasks started
    with that stage run there (relative paths reach the copy); a bad name, digest or size
    is refused with nothing kept; a second send of the same file writes nothing."""
    stub, hook, token, port = make_hook()
    data = b"0123456789" * 7
    reply = stub.StageFile(_chunks("job-s", "data/train_x.bin", data), timeout=10)
    assert not reply.existed and reply.size == len(data)
    staged = tmp_path / "logs" / "stage" / "job-s" / "data" / "train_x.bin"
    assert staged.read_bytes() == data
    mtime = staged.stat().st_mtime_ns
    assert stub.StageFile(_chunks("job-s", "data/train_x.bin", data), timeout=10).existed
    assert staged.stat().st_mtime_ns == mtime

    for name, sha, size, why in (("../escape", None, None, "not a relative path"),
                                 ("/etc/passwd", None, None, "not a relative path"),
                                 ("data/other.bin", "0" * 64, None, "announced"),
                                 ("data/other.bin", None, 5, "longer than"),
                                 ("data/other.bin", "xyz", None, "64 hex digits")):
        with pytest.raises(grpc.RpcError) as e:
            stub.StageFile(_chunks("job-s", name, data, sha=sha, size=size), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in e.value.details()
    assert sorted(p.name for p in staged.parent.iterdir()) == ["train_x.bin"]   # nothing half-written kept

    spec = _spec()
    reply = stub.StartTasks(node_hook_pb2.StartTasksRequest(
        job_id="job-s-g1", cluster_spec_json=json.dumps(spec), wait_ready_s=10, stage_id="job-s",
        tasks=[common_pb2.TaskRef(job="ps", index=0)]), timeout=20)
    log = reply.tasks[0].log_path
    deadline = time.monotonic() + 10
    while "cwd" not in open(log).read() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"cwd {staged.parent.parent}" in open(log).read()
    with pytest.raises(grpc.RpcError) as e:
        stub.StartTasks(node_hook_pb2.StartTasksRequest(
            job_id="job-w", cluster_spec_json=json.dumps(_spec()), workdir="relative/dir",
            tasks=[common_pb2.TaskRef(job="ps", index=0)]), timeout=20)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "workdir" in e.value.details()


@pytest.mark.unit
def test_init_token_writes_a_0600_token_once_and_the_hook_serves_with_it(tmp_path):
    import os
    import signal
    import stat
    import subprocess

    path = tmp_path / "keys" / "hook.token"

    def start():
        proc = subprocess.Popen([sys.executable, "-m", "tfsync.hooks.node", "--token-file", str(path), "--init-token",
                                 "--log-dir", str(tmp_path / "logs")], stdout=subprocess.PIPE, text=True)
        lines = []
        while not lines or not lines[-1].startswith("tfsync hook listening"):
            lines.append(proc.stdout.readline())
            assert lines[-1], f"the hook ended: {lines}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        return "".join(lines)

    first = start()
    assert "wrote a new token" in first and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    token = auth.read_token(path)
    assert "wrote a new token" not in start() and auth.read_token(path) == token   # kept, not replaced


@pytest.mark.unit
def test_free_ports_skips_ports_in_use_and_hands_out_fresh_ones_in_turn(make_hook):
    import socket
    stub, hook, token, port = make_hook()
    from tfsync.hooks.tasks import _bindable   # what FreePorts itself asks of a port
    # 6 ports free now, below the kernel's ephemeral range (32768-60999 by default), so no
    # other process is handed one of them while the test runs (a full run once was)
    first = next(f for f in range(20000, 32000, 10) if all(_bindable(p) for p in range(f, f + 6)))
    busy = socket.socket()
    try:
        busy.bind(("0.0.0.0", first + 1))   # a task left by a coordinator that died, say
        busy.listen(1)

        def ask(count):
            return list(stub.FreePorts(node_hook_pb2.FreePortsRequest(first=first, last=first + 5, count=count),
                                       timeout=10).ports)
        a = ask(2)
        assert first + 1 not in a and len(a) == 2
        b = ask(2)
        assert first + 1 not in b and not set(a) & set(b)       # the next ones, not the same again
        with pytest.raises(grpc.RpcError) as e:
            ask(6)                                                # 5 of the 6 are free
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "only 5" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.FreePorts(node_hook_pb2.FreePortsRequest(first=10, last=5, count=1), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        busy.close()
