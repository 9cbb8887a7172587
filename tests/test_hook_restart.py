"""A node hook restarted in place (SIGHUP) while its tasks run: the same process re-executes
itself, adopts its tasks (still its children, untouched), and the job on them goes on
without a recovery (issue 17: faults across hosts)."""

import json
import signal
import time

import psutil
import pytest

from helpers import linear_job, records, start_hook, task_children, tfsync_run, wait_for
from tfsync.api import auth
from tfsync.base.ports import free_ports

pytestmark = pytest.mark.cluster


@pytest.mark.slow
def test_a_hook_restarted_in_place_keeps_its_tasks_and_the_job_goes_on(tmp_path):
    token_file = tmp_path / "hooks.token"
    auth.write_token(token_file)
    address = f"127.0.0.1:{free_ports(1)[0]}"
    hook = start_hook(tmp_path, "node0", token_file, int(address.rsplit(":", 1)[1]))
    out_file = tmp_path / "node0.out"
    job = linear_job("hr", {"name": "bsp", "until": 0.3}, "asp", epochs=5,
                     extra=f'[cluster]\nhooks = ["{address}"]\ntoken_file = "{token_file}"\n')
    try:
        with tfsync_run(tmp_path, job) as (run, run_dir, _):
            wait_for("the first pushes", lambda: len(records(run_dir)) >= 20)
            before = task_children(hook)
            assert len(before) == 3   # ps:0, worker:0, worker:1
            hook.send_signal(signal.SIGHUP)
            wait_for("the hook back", lambda: out_file.read_text().count("listening") == 2, timeout=60)
            back = time.time()
            assert task_children(hook) == before   # the same processes, still the hook's
            wait_for("its tasks its own children (their fork server ended at the exec)",
                     lambda: set(before) <= {p.pid for p in psutil.Process(hook.pid).children()})
            wait_for("no zombie left of the program before the exec", lambda: not [
                p for p in psutil.Process(hook.pid).children() if p.status() == psutil.STATUS_ZOMBIE])
            out, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-2000:]
        summary = json.loads(out)
        assert summary["recoveries"] == [] and summary["samples"] >= summary["workload_samples"]
        assert any(r["time"] + summary["time_base"] > back for r in records(run_dir)), "nothing trained after it"
        assert hook.poll() is None and "restarting in place" in out_file.read_text()
        wait_for("its tasks stopped at the job's end", lambda: not task_children(hook))
    finally:
        hook.send_signal(signal.SIGTERM)
        hook.wait(timeout=30)
