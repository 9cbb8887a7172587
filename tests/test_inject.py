"""Straggler injection: real burner processes (no TF). CPU shares are loose: on a loaded
machine a busy burner gets less than its duty; an idle one uses next to nothing whatever
the load, so idle and busy are told apart by a wide margin."""

import os
import time

import numpy as np
import psutil
import pytest

from tfsync.inject import CpuBurner, TraceDriver, level_plan, load_trace_csv, spec_for_share
from tfsync.sim import CpuTrace

pytestmark = pytest.mark.unit

CPU = sorted(os.sched_getaffinity(0))[-1]


def cpu_share(pid, seconds=1.0):
    p = psutil.Process(pid)
    p.cpu_percent(None)
    time.sleep(seconds)
    return p.cpu_percent(None)


@pytest.mark.timing
def test_burner_burns_about_its_duty_pinned_and_is_gone_after_stop():
    with CpuBurner(0.5, cpus={CPU}, mem_mb=16) as b:
        pid = b.pids[0]
        assert psutil.Process(pid).cpu_affinity() == [CPU]
        assert 5 <= cpu_share(pid) <= 70  # start() returns once it burns: no start-up in it
        assert psutil.Process(pid).memory_info().rss >= 16 << 20
        b.set_duty(0.0)
        time.sleep(0.2)
        assert cpu_share(pid, 0.5) < 8
    assert not psutil.pid_exists(pid)


def test_burner_is_stopped_when_the_body_raises():
    with pytest.raises(RuntimeError, match="boom"):
        with CpuBurner(1.0, cpus={CPU}, processes=2) as b:
            pids = b.pids
            assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
            raise RuntimeError("boom")
    assert not any(psutil.pid_exists(p) for p in pids)


def test_a_stuck_child_is_killed_within_the_timeouts():
    b = CpuBurner(1.0, cpus={CPU}).start()
    pid = b.pids[0]
    psutil.Process(pid).suspend()  # cannot see the stop request: terminate, then kill
    b.stop(timeout=0.5)
    assert not psutil.pid_exists(pid)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="duty must be in \\[0, 1\\]"):
        CpuBurner(1.5)
    with pytest.raises(ValueError, match="not a non-empty subset"):
        CpuBurner(0.5, cpus={10_000})


def test_levels_map_to_burners():
    homo = level_plan("homo", 4)
    assert all(s.processes == 0 for s in homo)
    l2, l3 = level_plan("Hetero-L2", 3), level_plan("hetero_l3", 3)
    assert (l2[0].processes, l2[-1].processes, l2[-1].duty) == (0, 1, 1.0)
    assert (l3[-1].processes, l3[-1].duty) == (2, 1.0) and l3[-1].share == pytest.approx(1 / 3)
    for s in (0.4, 0.6, 0.9):  # the model the mapping inverts: s = 1 - d k / (k + 1)
        spec = spec_for_share(s)
        assert 1 - spec.duty * spec.processes / (spec.processes + 1) == pytest.approx(s)
    with pytest.raises(ValueError, match="valid: homo, hetero-l2, hetero-l3"):
        level_plan("hetero-l9", 2)


@pytest.mark.timing
def test_trace_drives_the_duty_over_time(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("time,util\n0,0\n10,90\n20,0\n")
    trace = load_trace_csv(str(path))
    assert isinstance(trace, CpuTrace) and trace.at(15) == 90
    burner = CpuBurner(0.0, cpus={CPU})
    # 2 s idle, then 2 s busy: each window is measured well clear of the change
    with TraceDriver(burner, trace, time_scale=5.0, interval=0.05) as driver:
        pid = burner.pids[0]
        time.sleep(0.3)
        idle = cpu_share(pid, 1.2)
        time.sleep(0.8)  # into the busy phase
        busy = cpu_share(pid, 1.2)
    duties = [d for _, d in driver.history]
    assert 0.0 in duties and 0.9 in duties
    assert idle < 8 and busy > max(12, 3 * idle), (idle, busy)
    assert not psutil.pid_exists(pid)


def test_shared_traces_load(tmp_path):
    root = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "traces",
                        "bitbrains_rnd_2013-07")
    if not os.path.isdir(root):
        pytest.skip("shared/data/traces is not on this machine")
    f = sorted(x for x in os.listdir(root) if x.endswith(".csv"))[0]
    trace = load_trace_csv(os.path.join(root, f), gaps="hold")
    assert len(trace.times) > 2 and np.all(trace.util >= 0)
