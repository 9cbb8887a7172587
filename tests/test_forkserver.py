"""A LocalCluster's task processes are forks of one fork server that imported TensorFlow
once (tfsync.engine.forkserver): they serve, log, report how they ended, and end with the
process that launched them; TFSYNC_FORK_TASKS=0 starts each as its own process."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tfsync.engine.cluster import LocalCluster, port_open
from tfsync.engine.forkserver import ForkedTask

pytestmark = pytest.mark.cluster


def _serving(cluster) -> bool:
    addresses = [a.rsplit(":", 1) for a in cluster.spec["ps"] + cluster.spec["worker"]]
    return all(port_open(host, int(port)) for host, port in addresses)


def test_tasks_are_forks_of_one_server_that_serve_log_and_report_their_end(tmp_path):
    with LocalCluster(workers=2, ps=1, log_dir=str(tmp_path / "logs")) as cluster:
        procs = list(cluster.procs.values())
        assert all(isinstance(p, ForkedTask) and p.poll() is None for p in procs)
        parents = {psutil.Process(p.pid).ppid() for p in procs}
        assert len(parents) == 1 and parents != {os.getpid()}   # one fork server, not this process
        assert _serving(cluster)
        cluster.kill_task("worker", 1)
        assert cluster.dead_tasks() == [("worker", 1, -signal.SIGKILL)]
        log = (tmp_path / "logs" / "ps-0.log").read_text()
        assert "tfsync task ps:0 serving at" in log
        again = LocalCluster(workers=2, ps=1)   # a second cluster: forked by the same server, at once
        t0 = time.monotonic()
        again.start()
        try:
            assert time.monotonic() - t0 < 5 and {psutil.Process(p).ppid() for p in again.pids} == parents
        finally:
            again.stop()
    assert all(p.poll() is not None and not psutil.pid_exists(p.pid) for p in procs)


def test_tasks_end_with_the_process_that_launched_them(tmp_path):
    script = textwrap.dedent("""
        import sys, time
        from tfsync.engine.cluster import LocalCluster
        cluster = LocalCluster(workers=2, ps=1).start()
        print(" ".join(map(str, cluster.pids)), flush=True)
        time.sleep(600)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in launcher.stdout.readline().split()]
        assert len(pids) == 3 and all(psutil.pid_exists(p) for p in pids)
        server = psutil.Process(pids[0]).ppid()
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 20
        while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                  for p in [*pids, server]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in [*pids, server] if psutil.pid_exists(p)
                    and psutil.Process(p).status() != psutil.STATUS_ZOMBIE], "a task outlived its launcher"
    finally:
        launcher.kill()


def test_without_the_fork_server_each_task_is_a_process_of_its_own(monkeypatch):
    monkeypatch.setenv("TFSYNC_FORK_TASKS", "0")
    with LocalCluster(workers=1, ps=1) as cluster:
        procs = list(cluster.procs.values())
        assert all(isinstance(p, subprocess.Popen) for p in procs) and _serving(cluster)
        assert {psutil.Process(p.pid).ppid() for p in procs} == {os.getpid()}
