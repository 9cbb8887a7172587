"""Task ports reachable only from this machine (tfsync.base.netns): TF's servers listen on every
interface, so a local cluster's tasks and the coordinator's own TF server run in a private
network namespace. Checked as an attacker would: from another host (a network namespace
of the test's own, linked to this machine) every task port must be closed."""

import concurrent.futures
import errno
import os
import shutil
import subprocess
import sys

import pytest

from tfsync.base import netguard, netns, nft

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
    seen = {}

    def probe(engine):
        spec = engine.generation.cluster.spec
        addresses = [a for job in ("chief", "ps", "worker") for a in spec[job]]
        ports = [int(a.rsplit(":", 1)[1]) for a in addresses]
        seen["here"] = listening_here(ports)
        with concurrent.futures.ThreadPoolExecutor(len(ports) + len(addresses)) as pool:   # (each waits 2 s)
            by_machine = pool.map(lambda p: connects_from_attacker(attacker, p), ports)   # (submitted at once)
            by_task = pool.map(lambda a: connects_from_attacker(*_split(a)), addresses)
            by_machine, by_task = list(by_machine), list(by_task)
        seen["by machine address"] = [p for p, reached in zip(ports, by_machine) if reached]
        seen["by task address"] = [a for a, reached in zip(addresses, by_task) if reached]
        seen["from this machine"] = [a for a in addresses if _connects(*_split(a))]
        seen["addresses"] = addresses

    summary = train_probing(tiny_problem, str(tmp_path), probe)
    assert seen["here"] == [], f"task ports listen in this machine's namespace: {seen['here']}"
    assert seen["by machine address"] == [], f"reachable from another host: {seen['by machine address']}"
    assert seen["by task address"] == []
    assert seen["from this machine"] == seen["addresses"]  # the cluster itself reaches every task
    assert summary["task_ports"].startswith("private network namespace tfsync-")


def train_probing(problem, run_dir: str, probe):
    """BSP on a real engine (2 workers + 1 PS) with ``probe(engine)`` called once training
    starts; returns the run's summary."""
    from tfsync.engine.generation import TrainSetup
    from tfsync.engine.engine import Engine
    from tfsync.engine.phase import Phase
    from tfsync.policy import BSP

    x, y, model_fn, optimizer_fn, loss_fn = problem
    setup = TrainSetup(model_fn, optimizer_fn, loss_fn, x, y, max_batch_size=16, shuffle=False)
    engine = Engine(setup, run_dir=run_dir, tensorboard=False, timeout_s=120, on_start=lambda: probe(engine))
    try:
        return engine.run([Phase(BSP())], total_samples=16 * 8)
    finally:
        engine.close()


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
    guard = netguard.table_name(dead.pid, 7) if nft.unavailable_reason() is None else None
    if guard:
        netguard.install(guard, "tfs7h", [0])
    try:
        removed = netns.remove_stale()
        assert name in removed and (guard is None or guard in removed)
        assert not os.path.exists(os.path.join(netns.NETNS_DIR, name))
        assert guard is None or guard not in nft.tables()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        if guard and guard in nft.tables():
            netguard.remove(guard)


@pytest.mark.unit
def test_the_guard_names_only_checked_values():
    text = netguard.ruleset("tfsync_ns_12_3", "tfs3h", [1000, 0, 0])
    assert 'oifname "tfs3h" meta skuid != { 0, 1000 } meta l4proto tcp reject with tcp reset' in text
    assert netguard.ruleset("tfsync_ns_12_3", "", []).count("table") == 2   # made, then deleted
    for table, device, uids in (("tfsync_hook_1_2", "tfs3h", [0]), ("tfsync_ns_1_2", "eth0", [0]),
                                ("tfsync_ns_1_2", 'tfs3h" accept', [0]), ("tfsync_ns_1_2", "tfs3h", [-1]),
                                ("tfsync_ns_1_2", "tfs3h", ["0; flush ruleset"])):
        with pytest.raises(ValueError):
            netguard.ruleset(table, device, uids)


@pytest.mark.unit
def test_without_a_private_network_the_summary_says_the_ports_are_open(monkeypatch):
    monkeypatch.setenv("TFSYNC_NO_NETNS", "1")
    assert netns.describe(None) == "every interface, unprotected: TFSYNC_NO_NETNS is set"


INTRUDER = 65533   # another local user (no passwd entry needed): setpriv switches to the number


def as_user(uid: int, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv],
                          capture_output=True, text=True, timeout=timeout)


def readable_by(uid: int, *paths: str) -> bool:
    return as_user(uid, ["sh", "-c", 'for p; do [ -r "$p" ] || exit 1; done', "sh", *paths]).returncode == 0


def _guard_reason():
    from tfsync.base import nft
    return ROOT_REASON or (None if shutil.which("setpriv") else "needs util-linux's setpriv") \
        or nft.unavailable_reason()


@pytest.mark.cluster
def test_another_local_user_cannot_reach_the_tasks(tiny_problem, tmp_path):
    """While a real engine trains, a process of another local user cannot open a
    connection to any of the cluster's ports (chief, PS, workers), over IPv4 or the link's
    IPv6 address, nor run a TF operation on the PS; root (the coordinator) still trains."""
    reason = _guard_reason()
    if reason:
        pytest.skip(reason)
    connect = ("import socket, sys\nfor a in sys.argv[1:]:\n"
               "    h, p = a.rsplit(':', 1)\n"
               "    family, kind, proto, _, where = socket.getaddrinfo(h.strip('[]'), int(p), type=socket.SOCK_STREAM)[0]\n"
               "    s = socket.socket(family, kind, proto); s.settimeout(3)\n    print(a, s.connect_ex(where))\n")
    tf_op = ("import sys, tensorflow as tf\n"
             "with tf.compat.v1.Session('grpc://' + sys.argv[1], config=tf.compat.v1.ConfigProto("
             "operation_timeout_in_ms=5000)) as s:\n    print(s.run(tf.constant(7)))\n")
    seen = {}

    def probe(engine):
        net = engine.generation.cluster.network
        spec = engine.generation.cluster.spec
        addresses = [a for job in ("chief", "ps", "worker") for a in spec[job]]
        link6 = _link_local(net)
        targets = addresses + ([f"[{link6}]:{a.rsplit(':', 1)[1]}" for a in addresses] if link6 else [])
        seen["intruder"] = as_user(INTRUDER, ["/usr/bin/python3", "-c", connect, *targets]).stdout.split("\n")
        seen["root"] = [a for a in addresses if _connects(*_split(a))]
        seen["addresses"], seen["link6"] = addresses, link6
        if readable_by(INTRUDER, sys.executable):
            r = as_user(INTRUDER, [sys.executable, "-c", tf_op, spec["ps"][0]], timeout=120)
            seen["tf"] = (r.returncode, r.stdout)

    summary = train_probing(tiny_problem, str(tmp_path), probe)
    lines = [line for line in seen["intruder"] if line]
    assert len(lines) == len(seen["addresses"]) * (2 if seen["link6"] else 1)
    assert all(line.rsplit(" ", 1)[1] == str(errno.ECONNREFUSED) for line in lines), f"not refused: {lines}"
    assert seen["root"] == seen["addresses"]
    if "tf" in seen:
        assert seen["tf"][0] != 0 and "7" not in seen["tf"][1]
    assert summary["samples"] == 16 * 8
    assert "by uid 0 only (nftables table inet tfsync_ns_" in summary["task_ports"]


def _link_local(net) -> str | None:
    out = subprocess.run(["ip", "-n", net.name, "-o", "-6", "addr", "show", "scope", "link"],
                         capture_output=True, text=True).stdout
    found = [f.split("/")[0] for line in out.splitlines() for f in line.split() if f.startswith("fe80:")]
    if not found:
        return None
    device = f"tfs{net.index}h"   # reached through this machine's end of the link
    return f"{found[0]}%{device}"


@pytest.mark.cluster
def test_tasks_run_as_the_user_who_ran_sudo(tiny_problem, tmp_path, monkeypatch, open_tmp):
    """Root was needed only for the namespace: under sudo (SUDO_UID, SUDO_GID) every task
    process runs as that user, reading the run directory's data it was handed; a run
    directory that user cannot reach is one line naming it, before any task starts."""
    reason = ROOT_REASON or (None if shutil.which("setpriv") else "needs util-linux's setpriv")
    if reason:
        pytest.skip(reason)
    from tfsync.base import taskcmd
    from tfsync.engine.generation import TrainSetup
    from tfsync.engine.engine import Engine
    from tfsync.engine.phase import Phase
    from tfsync.policy import BSP
    nobody = 65534
    if not readable_by(nobody, sys.executable, taskcmd.PACKAGE_ROOT):
        pytest.skip(f"uid {nobody} cannot read this Python ({sys.executable}) or tfsync's checkout")
    monkeypatch.setenv("SUDO_UID", str(nobody))
    monkeypatch.setenv("SUDO_GID", str(nobody))
    x, y, model_fn, optimizer_fn, loss_fn = tiny_problem
    setup = TrainSetup(model_fn, optimizer_fn, loss_fn, x, y, max_batch_size=16, shuffle=False)

    closed = tmp_path / "closed"   # pytest's tmp_path is 0700 root: its user cannot pass it
    engine = Engine(setup, run_dir=str(closed / "run"), tensorboard=False, timeout_s=120)
    try:
        with pytest.raises(Exception, match=r"the tasks run as uid 65534 \(who ran sudo\) and cannot read .*closed"):
            engine.run([Phase(BSP())], total_samples=16 * 4)
    finally:
        engine.close()

    run_dir = str(open_tmp / "run")
    uids = {}

    def probe():
        for pid in engine.generation.cluster.pids:
            with open(f"/proc/{pid}/status") as f:
                uids[pid] = [line.split()[1:3] for line in f if line.startswith(("Uid:", "Gid:"))]

    engine = Engine(setup, run_dir=run_dir, tensorboard=False, timeout_s=120, on_start=probe)
    try:
        summary = engine.run([Phase(BSP())], total_samples=16 * 8)
    finally:
        engine.close()
    assert len(uids) == 3 and all(v == [[str(nobody)] * 2] * 2 for v in uids.values()), uids
    assert summary["samples"] == 16 * 8


@pytest.fixture
def open_tmp():
    """A directory every user may pass through (pytest's own are closed to others)."""
    import pathlib
    import tempfile
    path = pathlib.Path(tempfile.mkdtemp(prefix="tfsync-test-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.unit
def test_under_sudo_a_task_command_runs_as_that_user_in_the_namespace(monkeypatch, open_tmp):
    """The command every launcher builds (netns.command_in) runs its program in the
    private network as the user who ran sudo, with that user's group and no other; the
    run directory's files are handed to that user, and one it cannot reach is refused in
    one line. (A TF task as that user: the test above, where this Python is readable.)"""
    reason = ROOT_REASON or (None if shutil.which("setpriv") else "needs util-linux's setpriv")
    if reason:
        pytest.skip(reason)
    net = netns.shared()
    assert net is not None
    monkeypatch.setenv("SUDO_UID", "65534")
    monkeypatch.setenv("SUDO_GID", "65533")
    assert netns.task_user() == (65534, 65533)
    probe = ["sh", "-c", 'id -u; id -g; id -G; ip -o -4 addr show | grep -c "inet ' + net.address + '/"; cat "$1"',
             "sh", "data/x.bin"]
    run_dir = open_tmp / "run"
    (run_dir / "data").mkdir(parents=True, mode=0o700)
    (run_dir / "data" / "x.bin").write_text("rows")
    (run_dir / "data" / "x.bin").chmod(0o600)
    netns.hand_over(str(run_dir), ["data/x.bin"], ("/bin/sh",))
    r = subprocess.run(net.command(probe), capture_output=True, text=True, cwd=run_dir, timeout=30)
    assert r.stdout.split("\n")[:5] == ["65534", "65533", "65533", "1", "rows"], (r.stdout, r.stderr)
    closed = open_tmp / "closed"
    (closed / "run").mkdir(parents=True)
    closed.chmod(0o700)
    with pytest.raises(netns.NetnsError, match=r"^the tasks run as uid 65534 \(who ran sudo\) and cannot read "
                                               r".*closed/run: run from a directory that user can read$"):
        netns.hand_over(str(closed / "run"))
    monkeypatch.setenv("SUDO_UID", "0")   # root ran sudo: the tasks are root's
    assert netns.task_user() is None and "setpriv" not in netns.command_in(net.name, ["true"])
