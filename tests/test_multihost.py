"""A job file that lists node hooks: `tfsync run` starts, replaces and stops its tasks
through those hooks (two `tfsync hook` processes on loopback stand for two nodes)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import (CHECKPOINTED_JOB, DATA, check_ps_recovered, start_hook, task_children, tasks_under, tfsync_run,
                     wait_for_checkpoints)
from tfsync.api import auth
from tfsync.base.ports import free_ports

pytestmark = pytest.mark.cluster


@pytest.fixture
def two_hooks(tmp_path):
    token_file = tmp_path / "hooks.token"
    auth.write_token(token_file)
    ports = free_ports(2)
    hooks = []
    try:
        for i, port in enumerate(ports):
            hooks.append(start_hook(tmp_path, f"node{i}", token_file, port))
        yield [f"127.0.0.1:{p}" for p in ports], token_file, hooks
    finally:
        for h in hooks:
            h.send_signal(signal.SIGTERM)
        for h in hooks:
            try:
                h.wait(timeout=20)
            except subprocess.TimeoutExpired:
                h.kill()


def on_hooks(hooks, token_file) -> str:
    """The test job (its {run_dir} left to fill) with its tasks on ``hooks``."""
    return CHECKPOINTED_JOB.replace("[model]", f"[cluster]\nhooks = {json.dumps(hooks)}\ntoken_file = \"{token_file}\"\n[model]")


@pytest.mark.slow
def test_tasks_run_on_the_listed_hooks_and_a_killed_ps_is_restarted_by_its_hook(tmp_path, two_hooks):
    """... after a run of the same job with a wrong hook token was refused in one line,
    starting nothing on the same hooks."""
    addresses, token_file, hooks = two_hooks
    wrong = tmp_path / "wrong.token"
    auth.write_token(wrong)
    job = tmp_path / "wrong.toml"
    job.write_text(on_hooks(addresses, wrong).format(run_dir=tmp_path / "wrong"))
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", str(job), "--data", DATA, "-q"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 1
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("tfsync: error:")]
    assert "UNAUTHENTICATED" in line and addresses[0] in line
    assert [task_children(h) for h in hooks] == [{}, {}]
    assert "wrong token" in (tmp_path / "node0.out").read_text()  # refused and logged by the hook

    with tfsync_run(tmp_path, on_hooks(addresses, token_file)) as (run, run_dir, _):
        wait_for_checkpoints(run_dir)
        # round-robin, PS first: node0 runs ps:0 and worker:1, node1 runs worker:0
        first = [task_children(h) for h in hooks]
        assert sorted(first[0].values()) == ["tfsync-ps0", "tfsync-worker1"]
        assert list(first[1].values()) == ["tfsync-worker0"]
        assert not tasks_under(run.pid)  # no task of its own
        (ps,) = [pid for pid, name in first[0].items() if name == "tfsync-ps0"]
        os.kill(ps, signal.SIGKILL)
        out, err = run.communicate(timeout=300)
    check_ps_recovered(run, out, err, run_dir)
    # the second generation was started by the same hooks (their logs), and the job's end
    # stopped every task while the hooks themselves go on
    for node, names in (("node0", {"ps-0.log", "worker-1.log"}), ("node1", {"worker-0.log"})):
        generations = sorted(os.listdir(tmp_path / node))
        assert len(generations) == 2 and generations[1].endswith("-g2"), generations
        assert set(os.listdir(tmp_path / node / generations[1])) == names
    assert all(h.poll() is None for h in hooks)
    time.sleep(0.5)
    assert [task_children(h) for h in hooks] == [{}, {}]
