"""A LocalCluster's task processes are forks of one fork server that imported TensorFlow
once (tfsync.base.forkserver): they serve, log, report how they ended, say why one
could not start, and end with the process that launched them; a cluster still running
keeps its tasks when the environment changes; TFSYNC_FORK_TASKS=0 starts each task as a
process of its own."""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tfsync.base import netns
from tfsync.base.ports import free_ports
from tfsync.base.taskcmd import task_env
from tfsync.engine.cluster import LocalCluster, port_open
from tfsync.base.forkserver import ForkedTask, ForkServer, running

pytestmark = pytest.mark.cluster


def _serving(cluster) -> bool:
    addresses = [a.rsplit(":", 1) for a in cluster.spec["ps"] + cluster.spec["worker"]]
    return all(port_open(host, int(port)) for host, port in addresses)


def _parent(pid: int) -> int:
    return psutil.Process(pid).ppid()


def _live_children(pid: int) -> set[int]:
    """The children of ``pid`` that run (one may end while they are listed)."""
    live = set()
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error, OSError):
            if child.status() != psutil.STATUS_ZOMBIE:
                live.add(child.pid)
    return live


def test_tasks_are_forks_of_one_server_that_serve_log_and_report_their_end(tmp_path):
    with LocalCluster(workers=2, ps=1, log_dir=str(tmp_path / "logs")) as cluster:
        procs = list(cluster.procs.values())
        assert all(isinstance(p, ForkedTask) and p.poll() is None for p in procs)
        parents = {_parent(p.pid) for p in procs}
        assert len(parents) == 1 and parents != {os.getpid()}   # one fork server, not this process
        assert sorted(psutil.Process(p.pid).name() for p in procs) == ["tfsync-ps0", "tfsync-worker0",
                                                                      "tfsync-worker1"]   # as ps shows them
        assert _serving(cluster)
        cluster.kill_task("worker", 1)
        assert cluster.dead_tasks() == [("worker", 1, -signal.SIGKILL)]
        assert "tfsync task ps:0 serving at" in (tmp_path / "logs" / "ps-0.log").read_text()
        with LocalCluster(workers=2, ps=1) as again:   # forked by the same server: no import again
            assert {_parent(p) for p in again.pids} == parents and _serving(again)
    assert all(p.poll() is not None and not running(p.pid) for p in procs)


def test_a_task_forked_after_its_launcher_gave_up_is_killed_and_the_server_goes_on():
    server = ForkServer.start(task_env())
    try:
        args = lambda port: ["--cluster", json.dumps({"ps": [f"127.0.0.1:{port}"]}), "--job", "ps", "--index", "0"]  # noqa: E731
        with pytest.raises(OSError, match="could not fork a task: did not answer in 0 s"):
            server.fork(args(free_ports(1)[0]), task_env(), None, None, None, timeout=0.01)   # it imports TF first
        port = free_ports(1)[0]
        task = server.fork(args(port), task_env(), None, None, None, timeout=120)   # the server still forks
        deadline = time.monotonic() + 60   # answered in turn: the late task's answer came first
        while _live_children(server.proc.pid) != {task.pid}:
            assert time.monotonic() < deadline, "the late task still runs"
            time.sleep(0.1)
        while not port_open("127.0.0.1", port):
            assert time.monotonic() < deadline and task.poll() is None
            time.sleep(0.1)
        task.kill()
        assert task.wait(timeout=30) == -signal.SIGKILL
    finally:
        server.close()


def test_importing_tensorflow_leaves_the_environment_a_fork_server_is_chosen_by():
    """`tfsync run` starts its fork server before it imports TensorFlow, which sets
    variables of its own: the tasks must still come from that server."""
    code = textwrap.dedent("""
        from tfsync.base import forkserver, taskcmd
        before = forkserver.env_key(taskcmd.task_env())
        import tfsync.cli.jobrun
        from tfsync.engine import cut
        cut.bound_redials()
        after = forkserver.env_key(taskcmd.task_env())
        print(sorted(set(after) ^ set(before)))
    """)
    clean = {"PATH": os.environ["PATH"]}   # not this process's: importing TensorFlow here set its variables
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=clean)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr[-2000:]


def test_a_task_that_cannot_start_ends_with_its_reason_in_its_log(tmp_path):
    server = ForkServer.start(task_env())
    try:
        log = tmp_path / "task.log"
        task = server.fork(["--cluster", '{"ps": ["127.0.0.1:1"]}', "--job", "ps", "--index", "0"], task_env(),
                           str(tmp_path / "nowhere"), str(log), None, timeout=120)
        assert task.wait(timeout=60) == 1
        assert "FileNotFoundError" in log.read_text() and str(tmp_path / "nowhere") in log.read_text()
        bad = server.fork(["--job", "chief"], task_env(), None, str(log), None, timeout=60)
        assert bad.wait(timeout=60) == 2 and "invalid choice: 'chief'" in log.read_text()   # argparse's exit
    finally:
        server.close()


def test_a_running_cluster_keeps_its_tasks_when_the_environment_changes(monkeypatch):
    with LocalCluster(workers=1, ps=1) as first:
        monkeypatch.setenv("TFSYNC_TEST_OTHER_ENV", "1")   # another environment: another fork server
        with LocalCluster(workers=1, ps=1) as second:
            assert {_parent(p) for p in second.pids} != {_parent(p) for p in first.pids}
            time.sleep(1.5)   # tasks whose server had gone would have ended by now (they poll every 0.5 s)
            assert all(p.poll() is None for p in first.procs.values()) and _serving(first)


def test_a_launcher_that_imports_tensorflow_forks_its_server_and_its_tasks_end_with_it(tmp_path):
    """As `tfsync run` does: the launcher (its stderr moved off descriptor 2, logging on
    it) imports TensorFlow, then forks its fork server from itself (one import, not two);
    the server keeps none of the launcher's files (a pipe it holds would keep a caller
    reading the launcher's output waiting); a task that cannot start says why in its own
    log; the tasks and the server end with the launcher."""
    log = tmp_path / "failed.log"
    script = textwrap.dedent(f"""
        import logging, os, time
        from tfsync.base import forkserver, taskcmd
        from tfsync.base.quiet import native_logs_off
        native_logs_off()
        logging.basicConfig()
        kept, _ = os.pipe()
        forkserver.prestart(here=True)
        from tfsync.engine.cluster import LocalCluster
        cluster = LocalCluster(workers=2, ps=1).start()
        failed = forkserver.fork(["--cluster", '{{"ps": ["127.0.0.1:1"]}}', "--job", "ps", "--index", "0"],
                                 taskcmd.task_env(), "/nonexistent", {str(log)!r}, 60)
        print(failed.wait(60), os.readlink(f"/proc/self/fd/{{kept}}"), " ".join(map(str, cluster.pids)), flush=True)
        time.sleep(600)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([launcher.stdout], [], [], 180)[0], "the cluster did not start"
        code, kept, *pids = launcher.stdout.readline().split()
        pids = [int(p) for p in pids]
        assert len(pids) == 3 and all(running(p) for p in pids)
        server = _parent(pids[0])
        assert {_parent(p) for p in pids} == {server} and _parent(server) == launcher.pid
        assert psutil.Process(server).cmdline() == psutil.Process(launcher.pid).cmdline()   # forked, not started
        assert psutil.Process(server).name() == "tfsync-forks"
        held = {os.readlink(f"/proc/{server}/fd/{fd}") for fd in os.listdir(f"/proc/{server}/fd")}
        assert kept.startswith("pipe:") and kept not in held
        assert code == "1" and "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent'" in log.read_text()
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 20
        while any(running(p) for p in [*pids, server]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in [*pids, server] if running(p)], "a task outlived its launcher"
    finally:
        launcher.kill()
        launcher.wait()
        netns.remove_stale()   # the killed launcher's private network (it had no atexit to remove it)
    left = os.listdir(netns.NETNS_DIR) if os.path.isdir(netns.NETNS_DIR) else []
    assert not [n for n in left if n.startswith(f"tfsync-{launcher.pid}-")], "its network namespace was left behind"


def test_a_fork_setting_that_is_neither_0_nor_1_is_refused_naming_it(monkeypatch):
    from tfsync.engine.cluster import ClusterError

    monkeypatch.setenv("TFSYNC_FORK_TASKS", "yes")
    cluster = LocalCluster(workers=1, ps=1)
    with pytest.raises(ClusterError, match=r"^TFSYNC_FORK_TASKS='yes': expected 1 .* or 0 "):
        cluster.start()
    assert cluster.procs == {}   # nothing started


def test_without_the_fork_server_each_task_is_a_process_of_its_own(monkeypatch):
    monkeypatch.setenv("TFSYNC_FORK_TASKS", "0")
    with LocalCluster(workers=1, ps=1) as cluster:
        procs = list(cluster.procs.values())
        assert all(isinstance(p, subprocess.Popen) for p in procs) and _serving(cluster)
        assert {_parent(p.pid) for p in procs} == {os.getpid()}
