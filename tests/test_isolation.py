"""Task ports reachable only from this machine (tfsync.netns): TF's servers listen on every
interface, so a local cluster's tasks and the coordinator's own TF server run in a private
network namespace. Checked as an attacker would: from another host (a network namespace
of the test's own, linked to this machine) every task port must be closed."""

import os
import shutil
import subprocess
import sys

import pytest

from tfsync import netns

ROOT_REASON = ("needs root and iproute2's `ip` to make the attacker's network namespace"
               if os.geteuid() != 0 or shutil.which("ip") is None else None)
ATTACKER = f"tfsynctest-{os.getpid()}"          # not a tfsync-<pid>-<n> name: never removed as stale
ATTACKER_NET = ("198.18.255.1", "198.18.255.2")  # this machine's end, the attacker's end (/30)


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def attacker():
    """Another host: a namespace linked to this one, routing everything through it."""
    if ROOT_REASON:
        pytest.skip(ROOT_REASON)
    mine, theirs = ATTACKER_NET
    try:
        _ip("netns", "add", ATTACKER)
        _ip("link", "add", "tfsatk0", "type", "veth", "peer", "name", "tfsatk1", "netns", ATTACKER)
        _ip("addr", "add", f"{mine}/30", "dev", "tfsatk0")
        _ip("link", "set", "tfsatk0", "up")
        _ip("-n", ATTACKER, "addr", "add", f"{theirs}/30", "dev", "tfsatk1")
        _ip("-n", ATTACKER, "link", "set", "tfsatk1", "up")
        _ip("-n", ATTACKER, "route", "add", "default", "via", mine)
        yield mine
    finally:
        subprocess.run(["ip", "netns", "del", ATTACKER], capture_output=True)
        subprocess.run(["ip", "link", "del", "tfsatk0"], capture_output=True)


def connects_from_attacker(host: str, port: int) -> bool:
    code = ("import socket, sys\n"
            "s = socket.socket(); s.settimeout(2)\n"
            f"sys.exit(0 if s.connect_ex(({host!r}, {port})) == 0 else 1)\n")
    r = subprocess.run(["ip", "netns", "exec", ATTACKER, sys.executable, "-c", code], timeout=30)
    return r.returncode == 0


def listening_here(ports) -> list[str]:
    """Lines of `ss -ltn` in this machine's namespace that listen on any of ``ports``."""
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if any(line.split()[3].endswith(f":{p}") for p in ports)]


@pytest.mark.cluster
def test_no_task_port_is_reachable_from_another_host(tiny_problem, tmp_path, attacker):
    """While a real engine trains (2 workers + 1 PS + the coordinator's TF server), none of
    the cluster's ports listens in this machine's namespace, none answers from another
    host (by this machine's address or the tasks' own), the cluster reaches them, and the
    summary says what protected them."""
    from tfsync.engine.generation import TrainSetup
    from tfsync.engine.trainer import Engine, Phase
    from tfsync.policy import BSP

    x, y, model_fn, optimizer_fn, loss_fn = tiny_problem
    seen = {}

    def probe():
        spec = engine.generation.cluster.spec
        addresses = [a for job in ("chief", "ps", "worker") for a in spec[job]]
        ports = [int(a.rsplit(":", 1)[1]) for a in addresses]
        seen["here"] = listening_here(ports)
        seen["by machine address"] = [p for p in ports if connects_from_attacker(attacker, p)]
        seen["by task address"] = [a for a in addresses if connects_from_attacker(*_split(a))]
        seen["from this machine"] = [a for a in addresses if _connects(*_split(a))]
        seen["addresses"] = addresses

    setup = TrainSetup(model_fn, optimizer_fn, loss_fn, x, y, max_batch_size=16, shuffle=False)
    engine = Engine(setup, run_dir=str(tmp_path), tensorboard=False, timeout_s=120, on_start=probe)
    try:
        summary = engine.run([Phase(BSP())], total_samples=16 * 8)
    finally:
        engine.close()
    assert seen["here"] == [], f"task ports listen in this machine's namespace: {seen['here']}"
    assert seen["by machine address"] == [], f"reachable from another host: {seen['by machine address']}"
    assert seen["by task address"] == []
    assert seen["from this machine"] == seen["addresses"]  # the cluster itself reaches every task
    assert summary["task_ports"].startswith("private network namespace tfsync-")


def _split(address):
    host, port = address.rsplit(":", 1)
    return host, int(port)


def _connects(host, port):
    import socket
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0


@pytest.mark.unit
def test_a_hook_runs_tasks_only_in_a_tfsync_private_network(tmp_path):
    from tfsync.hooks.tasks import TaskRequestError, TaskSupervisor

    sup = TaskSupervisor(str(tmp_path), task_command=[sys.executable, "-c", "import time; time.sleep(60)"])
    spec = '{"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}'
    for bad in ("host", "tfsync-1-x", "../../proc/1/ns/net", f"tfsync-{os.getpid()}-99999"):
        with pytest.raises(TaskRequestError, match="network namespace"):
            sup.start("job", spec, [("ps", 0)], {}, netns=bad)
    assert sup.tasks() == []


@pytest.mark.unit
def test_namespaces_of_dead_processes_are_removed(tmp_path):
    if ROOT_REASON:
        pytest.skip(ROOT_REASON)
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    name = f"tfsync-{dead.pid}-7"
    _ip("netns", "add", name)
    try:
        assert name in netns.remove_stale()
        assert not os.path.exists(os.path.join(netns.NETNS_DIR, name))
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.mark.unit
def test_without_a_private_network_the_summary_says_the_ports_are_open(monkeypatch):
    monkeypatch.setenv("TFSYNC_NO_NETNS", "1")
    assert netns.describe(None) == "every interface, unprotected: TFSYNC_NO_NETNS is set"
