"""Run events travel from the engine's controller to the job store over the real
Attach stream: the kinds the store keeps are stored with their details, others are not."""

import time

import pytest

from tfsync.manager import embedded
from tfsync.manager.store import Store

pytestmark = pytest.mark.unit

SWITCH = {"index": 1, "from": "bsp", "to": "asp", "method": "restart", "samples": 3200, "updates": 50,
          "drain_s": 0.01, "switch_s": 2.5, "overhead_s": 2.51}  # as the engine records a switch


def test_events_reach_the_job_store(tmp_path):
    m = embedded.start(str(tmp_path / "run"), "ev", {"model": {"name": "linear"}, "cluster": {"workers": 2}},
                       workers=2, protocol="bsp", store_path=str(tmp_path / "jobs.db"))
    run_id = m.run_id
    try:
        m.link.event("worker_lost", {"worker": 1, "step": 104})
        m.link.event("eval", {"accuracy": 0.9})  # not a kind the store keeps
        m.link.event("worker_rejoined", {"worker": 1, "steps_lost": 1})
        m.link.event("switch", SWITCH)  # the store's record of a run's switches
        deadline = time.monotonic() + 10
        while len(m.store.events(run_id)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        m.finish("done")
    with Store(tmp_path / "jobs.db") as store:
        events = store.events(run_id)
    assert [(e.kind, e.detail) for e in events] == [("worker_lost", {"worker": 1, "step": 104}),
                                                    ("worker_rejoined", {"worker": 1, "steps_lost": 1}),
                                                    ("switch", SWITCH)]
