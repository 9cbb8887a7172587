"""A node hook joins a running job (`tfsync hook --join`), as a user runs it: `tfsync run`
with its manager on a known address, then `tfsync hook --join` started later (real
gRPC, real TF tasks on real hooks). A hook with another token is refused in one line and
exits; one with the job's token joins, gets a worker and trains, and the job goes on
with one worker more, every counted push kept once; restarted in place, the joined hook
does not announce itself again. A node hook restarted in place (SIGHUP) while its tasks
run: the same process re-executes itself, adopts its tasks (still its children,
untouched), and the job on them goes on without a recovery (issue 17: faults across hosts)."""

import json
import os
import signal
import time

import psutil
import pytest

from helpers import linear_job, records, start_hook, task_children, tfsync, tfsync_run, wait_for
from tfsync.api import auth
from tfsync.base.ports import free_ports

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_a_hook_started_with_join_gets_a_worker_and_a_hook_with_another_token_is_refused(tmp_path):
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    token_file, other_token, manager_token = tmp_path / "hooks.token", tmp_path / "other.token", tmp_path / "m.token"
    for path in (token_file, other_token, manager_token):
        auth.write_token(path)
    first, joining, wrong, manager = free_ports(4)
    hooks = [start_hook(tmp_path, "node0", token_file, first)]
    job = linear_job("join", "bsp", batch_size=16, epochs=12, checkpoint_every=0,
                     extra=f'[cluster]\nhooks = ["127.0.0.1:{first}"]\ntoken_file = "{token_file}"\n'
                           "max_workers = 3\n")
    join = ["--join", f"127.0.0.1:{manager}", "--manager-token-file", str(manager_token)]
    try:
        with tfsync_run(tmp_path, job, env=env, args=("--manager-listen", f"127.0.0.1:{manager}",
                                                      "--manager-token-file", str(manager_token))) as (run, run_dir, job_file):
            wait_for("the first pushes", lambda: (run_dir / "metrics.jsonl").exists() and len(records(run_dir)) >= 10)
            # node0's hook restarted in place (SIGHUP): it re-executes itself and adopts its
            # tasks (still its children, untouched); the job goes on without a recovery
            before = task_children(hooks[0])
            assert len(before) == 3   # ps:0, worker:0, worker:1
            hooks[0].send_signal(signal.SIGHUP)
            node0 = tmp_path / "node0.out"
            wait_for("node0's hook back", lambda: node0.read_text().count("listening") == 2, timeout=60)
            back = time.time()
            assert task_children(hooks[0]) == before   # the same processes, still the hook's
            wait_for("its tasks its own children (their fork server ended at the exec)",
                     lambda: set(before) <= {p.pid for p in psutil.Process(hooks[0].pid).children()})
            wait_for("no zombie left of the program before the exec", lambda: not [
                p for p in psutil.Process(hooks[0].pid).children() if p.status() == psutil.STATUS_ZOMBIE])

            refused = start_hook(tmp_path, "wrong", other_token, wrong, args=join)
            assert refused.wait(timeout=60) == 2
            said = (tmp_path / "wrong.out").read_text()
            assert "refused the job's hook token (cluster.token_file)" in said and "joined" not in said, said

            hooks.append(start_hook(tmp_path, "node1", token_file, joining, args=join))
            out = tmp_path / "node1.out"
            wait_for("the join's answer", lambda: "joined;" in out.read_text(), timeout=200)
            assert f"hook 127.0.0.1:{joining} joined; scaled 2 -> 3 workers in" in out.read_text(), out.read_text()
            assert len(task_children(hooks[1])) == 2   # worker:0 and worker:2 (round-robin, the PS on node0)
            wait_for("worker 2's pushes", lambda: sum(r.get("worker") == 2 for r in records(run_dir)) >= 5)
            # restarted in place (a new tfsync installed), the joined hook does not announce itself again
            hooks[1].send_signal(signal.SIGHUP)
            wait_for("the hook back", lambda: out.read_text().count("listening") == 2, timeout=60)
            assert tfsync("stop", str(job_file), env=env).returncode == 0
            stdout, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr[-2000:]
        assert out.read_text().count("joined;") == 1 and "error" not in out.read_text(), out.read_text()
        summary = json.loads(stdout)
        assert summary["recoveries"] == []   # node0's hook restarted in place: no task was lost
        assert any(r["time"] + summary["time_base"] > back for r in records(run_dir)), "nothing trained after it"
        assert hooks[0].poll() is None and "restarting in place" in node0.read_text()
        (scaled,) = summary["scales"]
        assert (scaled["from"], scaled["to"], scaled["by"], scaled["node"]) == (2, 3, "join", f"127.0.0.1:{joining}")
        recs = records(run_dir)
        pushes = [r for r in recs if "worker" in r and "event" not in r]
        assert [r["pushes"] for r in pushes] == list(range(1, summary["pushes"] + 1))   # each once, none lost
        scaled_at = next(r for r in recs if r.get("event") == "scaled")["updates"]
        assert {r["worker"] for r in pushes if r["updates"] > scaled_at} == {0, 1, 2}
        assert summary["workers"] == 3 and summary["samples"] == sum(r["batch_size"] for r in pushes)
        assert hooks[1].poll() is None   # it serves on, a node of the job until the job ends
        wait_for("their tasks stopped at the job's end", lambda: not any(task_children(h) for h in hooks))
    finally:
        for hook in hooks:
            hook.terminate()
            hook.wait(timeout=30)
