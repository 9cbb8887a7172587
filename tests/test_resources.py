"""ResourceMonitor on real processes (no mocks, no TF). Loose CPU bounds: this machine
has 2 cores shared with other work, so a spinning process may get only a part of one."""

import os
import subprocess
import sys
import time

import psutil
import pytest

from helpers import wait_for
from tfsync.base.procstats import CpuBusy, ProcessReader, worker_reading
from tfsync.engine.resources import LatestReadings, ResourceMonitor
from tfsync.policy.lbbsp import resource_reading

pytestmark = pytest.mark.unit

CPU = sorted(os.sched_getaffinity(0))[-1]
SPIN_AFTER = "import sys, time; time.sleep(float(sys.argv[1]))\nwhile True: pass"


def spawn(code, *args, cpu=None):
    p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)])
    if cpu is not None:
        os.sched_setaffinity(p.pid, {cpu})
    return p


def end(p):
    if p.poll() is None:
        p.kill()
    p.wait(10)


def test_busy_process_cpu_reading_rises():
    p = spawn(SPIN_AFTER, 1.2, cpu=CPU)
    try:
        m = ResourceMonitor({0: p.pid})
        m.sample()  # baseline
        time.sleep(0.6)
        idle = m.sample()[0]
        time.sleep(1.0)  # past the sleep: spinning now
        m.sample()
        time.sleep(0.6)
        busy = m.sample()[0]
    finally:
        end(p)
    assert idle["proc_cpu"] < 15, idle
    # a spinning process gets a fair share of its CPU even beside other busy ones
    assert busy["proc_cpu"] > max(20, idle["proc_cpu"] + 10), (idle, busy)
    assert busy["cpus"] == (CPU,) and busy["pid"] == p.pid
    assert 0 < busy["mem"] < 100 and 0 <= busy["cpu"] <= 100 and busy["set_cpu"] >= busy["cpu"]
    assert resource_reading(busy) == (busy["cpu"], busy["mem"])


def test_a_competing_process_on_the_same_cpu_reads_as_contention():
    idle = spawn("import time; time.sleep(60)", cpu=CPU)
    hog = spawn(SPIN_AFTER, 0, cpu=CPU)
    try:
        m = ResourceMonitor({3: idle.pid})
        m.sample()
        time.sleep(0.8)
        r = m.sample()[3]
    finally:
        end(hog)
        end(idle)
    assert r["proc_cpu"] < 10 and r["cpu"] > 50 and r["set_cpu"] > 50, r


def test_dead_and_zombie_pids_disappear_without_raising():
    a, b = spawn("import time; time.sleep(60)"), spawn("import time; time.sleep(60)")
    m = ResourceMonitor({0: a.pid, 1: b.pid})
    try:
        m.sample()
        time.sleep(0.2)
        assert set(m.sample()) == {0, 1}
        a.kill()
        time.sleep(0.2)  # a is a zombie now (not reaped)
        assert psutil.Process(a.pid).status() == psutil.STATUS_ZOMBIE
        assert set(m.sample()) == {1}
        a.wait(10)  # reaped: the pid no longer exists
        b.kill()
        b.wait(10)
        assert m.sample() == {} and m.latest() == {}
    finally:
        end(a)
        end(b)


def test_set_pids_replaces_a_restarted_worker():
    a, b = spawn("import time; time.sleep(60)"), spawn("import time; time.sleep(60)")
    try:
        m = ResourceMonitor({0: a.pid})
        m.sample()
        time.sleep(0.2)
        assert m.sample()[0]["pid"] == a.pid
        m.set_pids({0: b.pid})
        assert m.latest() == {}  # the old pid's reading is not the new task's
        m.sample()  # baseline of b
        time.sleep(0.2)
        assert m.sample()[0]["pid"] == b.pid
    finally:
        end(a)
        end(b)


def test_thread_samples_and_start_stop_are_idempotent():
    p = spawn("import time; time.sleep(60)")
    seen = []
    try:
        m = ResourceMonitor({0: p.pid}, interval=0.1, on_sample=seen.append)
        assert m.start() is m.start()
        deadline = time.monotonic() + 5
        while 0 not in m.latest() and time.monotonic() < deadline:
            time.sleep(0.05)
        m.stop()
        m.stop()
        n = len(seen)
        time.sleep(0.3)
        assert 0 in m.latest() and n >= 2 and len(seen) == n  # stopped: no more samples
        with m:  # restartable, and the context manager stops it
            time.sleep(0.25)
        assert len(seen) > n
    finally:
        end(p)


def test_bad_interval():
    with pytest.raises(ValueError, match="interval must be > 0"):
        ResourceMonitor({}, interval=0)


def test_process_reader_baselines_then_reads_and_forgets_ended_pids():
    p = spawn(SPIN_AFTER, 0, cpu=CPU)
    try:
        plain, pinned = ProcessReader(), ProcessReader(affinity=True)
        first = plain.read(p.pid)
        assert first.cpu is None and first.rss_bytes > 0 and 0 < first.mem < 100 and first.cpus == ()
        pinned.read(p.pid)
        time.sleep(0.5)
        use = pinned.read(p.pid)
        assert use.cpus == (CPU,) and use.cpu > 10, use  # spinning: a share of its CPU beside other work
        assert plain.read(p.pid).cpu > 10  # each reader has its own baseline
        plain.keep(set())
        assert plain.read(p.pid).cpu is None  # forgotten: a fresh baseline
    finally:
        end(p)
    assert pinned.read(p.pid) is None


def test_cpu_busy_per_cpu_and_of_all_cpus():
    per, total = CpuBusy(percpu=True), CpuBusy(percpu=False)
    time.sleep(0.2)
    busy, (whole,) = per.sample(), total.sample()
    assert len(busy) == psutil.cpu_count() and all(0 <= b <= 100 for b in busy) and 0 <= whole <= 100


@pytest.mark.parametrize("busy_sum, n_cpus, proc_cpu, cpu, set_cpu", [
    (150.0, 2, 50.0, 50.0, 75.0),    # the others keep half of the two CPUs busy
    (40.0, 1, 60.0, 0.0, 40.0),      # the process alone (its CPU % counted over a longer span)
    (400.0, 2, 0.0, 100.0, 200.0),   # at most 100
])
def test_a_workers_reading_is_the_share_its_cpus_are_busy_with_others(busy_sum, n_cpus, proc_cpu, cpu, set_cpu):
    r = worker_reading(busy_sum, n_cpus, proc_cpu, 12.34567, 7, 100.0, node="n1")
    assert r == {"cpu": cpu, "mem": 12.346, "proc_cpu": proc_cpu, "set_cpu": set_cpu, "pid": 7, "node": "n1",
                 "time": 100.0}
    assert resource_reading(r) == (cpu, 12.346)


def test_the_hooks_sampler_reports_a_new_pid_at_0_and_an_ended_one_as_not_alive():
    from tfsync.hooks.resources import ResourceSampler

    p = spawn(SPIN_AFTER, 0, cpu=CPU)
    sampler = ResourceSampler()
    try:
        first = sampler.process(p.pid)
        assert first.alive and first.cpu_percent == 0.0 and first.rss_bytes > 0
        # it has spun for a while, however busy the machine (a share of a core is the load's to decide)
        wait_for("CPU time", lambda: sum(psutil.Process(p.pid).cpu_times()[:2]) >= 0.05, timeout=120)
        busy = sampler.process(p.pid)
        assert busy.alive and busy.cpu_percent > 0 and busy.cpu_percent == round(busy.cpu_percent, 1), busy
        node = sampler.node()
        assert 0 <= node.cpu_percent <= 100 and 0 < node.memory_used_bytes < node.memory_total_bytes
    finally:
        end(p)
    assert not sampler.process(p.pid).alive and sampler.process(p.pid, alive=False).rss_bytes == 0


def test_a_views_readings_are_read_once_at_the_first_look_and_never_unlooked():
    """The engine makes a view for every push; its readings (copies of every worker's)
    are read from the monitor at the first look, once, and not at all by a policy that
    never looks (ASP, BSP)."""
    class Counting(ResourceMonitor):
        reads = 0

        def latest(self):
            self.reads += 1
            return {0: {"cpu": 50.0}, 2: {"cpu": 10.0}}

    monitor = Counting()
    LatestReadings(monitor)
    assert monitor.reads == 0
    readings = LatestReadings(monitor)
    assert readings and readings.get(0) == {"cpu": 50.0} and readings.get(1) is None and sorted(readings) == [0, 2]
    assert len(readings) == 2 and readings[2]["cpu"] == 10.0 and monitor.reads == 1
    assert not LatestReadings(ResourceMonitor())
