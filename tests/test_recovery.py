"""Kill the parameter server mid-run: the engine restarts the tasks through the run's node
hook, restores the newest checkpoint and finishes the job; the work lost is at most one
checkpoint interval."""

import os
import signal

import pytest

from helpers import CHECKPOINTED_JOB, check_ps_recovered, records, tasks_under, tfsync_run, wait_for_checkpoints

pytestmark = pytest.mark.cluster


def test_a_killed_ps_is_restarted_from_the_last_checkpoint(tmp_path):
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    with tfsync_run(tmp_path, CHECKPOINTED_JOB, env=env) as (run, run_dir, _):
        wait_for_checkpoints(run_dir)
        (ps,) = [pid for pid, name in tasks_under(run.pid).items() if name == "tfsync-ps0"]
        os.kill(ps, signal.SIGKILL)
        killed_at = max(r["samples"] for r in records(run_dir) if "worker" in r)
        out, err = run.communicate(timeout=300)
    rec = check_ps_recovered(run, out, err, run_dir)
    assert killed_at - rec["samples_lost"] >= 0
    # both generations' tasks were started by the run's node hook (its task logs)
    assert [p.parent.name[-3:] for p in sorted(run_dir.glob("logs/*/ps-0.log"))] == ["-g1", "-g2"]

