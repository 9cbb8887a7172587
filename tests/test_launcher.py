"""HookLauncher on two real node hooks (gRPC on loopback) with real TF task processes."""

import time

import psutil
import pytest

from tfsync.api import auth, transport
from tfsync.api.v1 import common_pb2, node_hook_pb2, node_hook_pb2_grpc
from tfsync.base.ports import free_ports
from tfsync.hooks import node
from tfsync.hooks.tasks import port_open
from tfsync.engine.launcher import HookLauncher, LaunchError

pytestmark = pytest.mark.cluster

RUNNING = common_pb2.TASK_STATE_RUNNING
TIMEOUT_S = 60.0  # one TF task to open its port on a busy 2-core machine


@pytest.fixture
def hooks(tmp_path):
    """Two hooks (the job's token) on free loopback ports -> [(address, token)]; each is
    stopped at the end, which kills every task it started."""
    token, made = auth.new_token(), []
    try:
        for name in ("node-a", "node-b"):
            hook, port = node.serve(token=token, log_dir=str(tmp_path / name), node=name)
            made.append((hook, f"127.0.0.1:{port}"))
        yield [(address, token) for _, address in made]
    finally:
        for hook, _ in made:
            hook.stop(grace=None)


def _health(address, token):
    channel = transport.make_channel(address, token=token)
    try:
        return node_hook_pb2_grpc.NodeHookStub(channel).Health(node_hook_pb2.HealthRequest(), timeout=10)
    finally:
        channel.close()


def _gone(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_parallel_launch_restart_stop_on_two_hooks(hooks):
    addresses = [a for a, _ in hooks]
    ports = free_ports(3)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"], "worker": [f"127.0.0.1:{ports[2]}"]}

    # A wrong token is refused before anything starts, with the hook named.
    bad = HookLauncher([(addresses[0], "not-the-token"), hooks[1]], timeout=TIMEOUT_S)
    try:
        with pytest.raises(LaunchError) as e:
            bad.start(spec)
        assert addresses[0] in str(e.value) and "UNAUTHENTICATED" in str(e.value) and "token" in str(e.value)
        assert "ps:0" in str(e.value)
    finally:
        bad.stop()
    assert _health(*hooks[1]).tasks == []  # the good hook was not asked to start anything

    launcher = HookLauncher(hooks, parallel=True, timeout=TIMEOUT_S)
    pids = []
    try:
        launcher.start(spec)
        assert launcher.assignment == {("ps", 0): 0, ("worker", 0): 1}
        assert launcher.init_s > 0
        assert port_open(spec["ps"][0]) and port_open(spec["worker"][0])
        first = launcher.pids
        pids += first.values()
        for (address, token), task in zip(hooks, [("ps", 0), ("worker", 0)]):
            listed = [(t.job_id, t.task.job, t.task.index, t.pid, t.state) for t in _health(address, token).tasks]
            assert listed == [(launcher.job_id, *task, first[task], RUNNING)], address

        restart_s = launcher.restart_all()
        assert restart_s == launcher.restart_s > 0
        second = launcher.pids
        pids += second.values()
        assert set(second) == set(first) and all(second[t] != first[t] for t in first)
        assert all(s.state == RUNNING and s.restarts == 1 for s in launcher.status.values())
        assert all(_gone(pid) for pid in first.values())
        assert port_open(spec["ps"][0]) and port_open(spec["worker"][0])
        assert all(psutil.pid_exists(pid) for pid in second.values())

        stopped = launcher.stop()
        assert sorted(s.pid for s in stopped) == sorted(second.values())
        assert all(_gone(pid) for pid in pids)
        assert not port_open(spec["ps"][0]) and not port_open(spec["worker"][0])
        assert launcher.stop() == []  # a second stop is a no-op
    finally:
        launcher.stop()
    with pytest.raises(LaunchError, match="start"):
        launcher.restart_all()

