"""Kill a worker task mid-run, once under BSP and once under ASP: the engine restarts the
cluster from a checkpoint taken at the loss, the job finishes, no completed step is lost
(every counted update was applied on the PS; only the dead worker's running step is),
and the job store records each loss and rejoin."""

import json
import os

import pytest

from helpers import kill_worker, linear_job, records, tfsync_run, wait_for
from tfsync.manager.store import Store
from tfsync.policy.pacing import MAX_DEPTH

pytestmark = pytest.mark.cluster

# BSP for 7200 samples, then ASP for 22800: enough left after the second kill (at 350
# pushes) for the rejoined worker to train again, however fast ASP runs
JOB = linear_job("wloss", {"name": "bsp", "until": 0.24}, "asp", epochs=5, checkpoint_every=0)
WORKLOAD = 5 * 6000


@pytest.mark.slow
def test_killed_workers_rejoin_and_no_completed_step_is_lost(tmp_path):
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
    with tfsync_run(tmp_path, JOB, env=env) as (run, run_dir, _):
        pushes = lambda: [r for r in records(run_dir) if "worker" in r and "event" not in r]  # noqa: E731
        wait_for("60 BSP steps", lambda: len(pushes()) >= 60, 180)
        kill_worker(run.pid, 1)
        wait_for("the rejoin", lambda: any(r.get("event") == "worker_rejoined" for r in records(run_dir)), 180)
        wait_for("ASP steps", lambda: any(r.get("protocol") == "asp" for r in pushes()) and len(pushes()) >= 350, 180)
        kill_worker(run.pid, 0)
        out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-2000:]
    s = json.loads(out)
    assert s["samples"] >= s["workload_samples"] == WORKLOAD and s["test_accuracy"] > 0.8
    workers = [r for r in s["recoveries"] if r["task"].startswith("worker")]
    assert [r["task"] for r in workers] == ["worker:1", "worker:0"]
    # lost: the steps granted to the dead worker and not pushed, at most the steps ASP grants ahead
    depth = MAX_DEPTH
    assert all(0 <= r["steps_lost"] <= depth and r["in_flight_lost"] <= 2 * depth for r in workers)
    # every update the engine counted was applied on the PS: nothing completed was lost (a
    # dead worker's ASP step may have reached the PS before the worker died: applied, not counted)
    assert s["updates"] <= s["optimizer_iterations"] <= s["updates"] + sum(r["in_flight_lost"] for r in workers)
    recs = records(run_dir)
    steps = [r for r in recs if "worker" in r and "event" not in r]
    assert len(steps) == s["pushes"] and sum(r["batch_size"] for r in steps if not r.get("dropped")) == s["samples"]
    events = [r["event"] for r in recs if r.get("event") in ("worker_lost", "worker_rejoined")]
    assert events == ["worker_lost", "worker_rejoined"] * 2
    back = [r for r in recs if r.get("event") == "worker_rejoined"]
    for ev in back:  # the restarted worker trains again
        assert any(r["worker"] == ev["worker"] and r["time"] > ev["time"] for r in steps)  # one time base
    bsp_rounds = [r["round"] for r in steps if r["protocol"] == "bsp" and not r.get("dropped")]
    short = [k for k in set(bsp_rounds) if bsp_rounds.count(k) != 2]
    assert len(short) <= 1 and all(bsp_rounds.count(k) == 1 for k in short)  # only the round of the loss
    with Store(str(tmp_path / "home" / "jobs.db")) as store:
        (stored,) = store.jobs()
        (run_row,) = store.runs(stored.id)
        kinds = [e.kind for e in store.events(run_row.id) if e.kind.startswith("worker")]
        assert kinds == ["worker_lost", "worker_rejoined"] * 2
