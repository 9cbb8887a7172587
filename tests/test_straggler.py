"""Straggler detection (Sync-Switch §IV-B2) on simulated clusters and on record dicts."""

import pytest

from tfsync.policy import ASP, BSP
from tfsync.sim.simulator import Simulator
from tfsync.sim.speeds import SpeedModel
from tfsync.switch.slowdown import Slowdown, TransientSlowdown
from tfsync.switch.stragglers import BECAME, RECOVERED, StragglerDetector, StragglerEvent, detect

pytestmark = pytest.mark.unit

WINDOW, K = 1.0, 3


@pytest.mark.parametrize("policy", [BSP, ASP])
def test_no_false_straggler_on_a_steady_jittery_cluster(policy):
    speeds = SpeedModel(fixed=0.05, per_sample=0.0, jitter=0.1, seed=2)
    result = Simulator(8, speeds).run(policy(), time=150.0)  # 150 windows of ~20 steps each
    assert detect(result.log, WINDOW, K) == []


def test_the_papers_rule_without_a_floor_raises_false_alarms():
    # Why min_drop exists: mean - sigma alone flags ~16 % of workers per window by chance.
    speeds = SpeedModel(fixed=0.05, per_sample=0.0, jitter=0.1, seed=2)
    result = Simulator(8, speeds).run(BSP(), time=150.0)
    assert any(e.kind == BECAME for e in detect(result.log, WINDOW, K, min_drop=0.0))


@pytest.mark.parametrize("policy", [BSP, ASP])
@pytest.mark.parametrize("t0", [5.0, 7.4])
def test_injected_straggler_is_detected_within_k_windows_and_recovers(policy, t0):
    t1 = t0 + 12.0
    speeds = TransientSlowdown(fixed=0.05, per_sample=0.0, jitter=0.1, seed=1,
                               slowdowns=(Slowdown(worker=3, start=t0, end=t1, factor=3.0),))
    result = Simulator(6, speeds).run(policy(), time=t1 + 10.0)
    events = detect(result.log, WINDOW, K)
    assert [(e.worker, e.kind) for e in events] == [(3, BECAME), (3, RECOVERED)]
    became, recovered = events
    assert t0 < became.time <= t0 + (K + 1) * WINDOW  # k windows, +1 for alignment
    # The last slow step (started just before t1) ends up to one slowed step after t1.
    assert t1 < recovered.time <= t1 + (K + 2) * WINDOW


def test_records_from_metrics_jsonl_give_the_same_events_as_pushes():
    speeds = TransientSlowdown(fixed=0.05, per_sample=0.0, jitter=0.1, seed=3,
                               slowdowns=(Slowdown(worker=1, start=4.0, end=12.0, factor=4.0),))
    result = Simulator(5, speeds).run(BSP(), time=20.0)
    from_pushes = detect(result.log, WINDOW, K)
    from_dicts = detect(result.records(), WINDOW, K)
    assert from_pushes and from_dicts == from_pushes


def test_hand_fed_windows_and_counters():
    d = StragglerDetector(window_s=1.0, k=2, min_drop=0.0, origin=0.0)
    speeds = {0: 10.0, 1: 10.0, 2: 10.0, 3: 2.0}  # samples per busy second
    events = []
    for window in range(6):
        for w, rate in speeds.items():
            if window >= 3:
                rate = 10.0
            events += d.observe({"worker": w, "end": window + 0.5, "start": window + 0.5 - 1.0,
                                 "batch_size": int(rate)})
    events += d.advance(6.0)
    # worker 3 is slow in windows 0..2: flagged after windows 0 and 1 (end of window 1 = 2.0);
    # fast from window 3: recovered after windows 3 and 4 (end 5.0).
    assert events == [StragglerEvent(2.0, 3, BECAME), StragglerEvent(5.0, 3, RECOVERED)]
    assert d.stragglers == frozenset()


def test_a_worker_slow_to_begin_its_steps_is_a_straggler_though_its_steps_are_short():
    """BSP rounds granted every 0.1 s: workers 0-2 push 0.02 s after the grant; worker 3's
    steps take as little time on its own clock, but it begins them late (paused before its
    gate opened) and pushes 0.09 s after the grant. Its turnaround shows it; end - start
    alone did not."""
    from tfsync.policy import Push

    def rounds(late):
        d, events = StragglerDetector(window_s=1.0, k=2, origin=0.0), []
        for r in range(30):
            t = r * 0.1
            for w in range(4):
                arrival = t + (late if w == 3 else 0.02)
                events += d.observe(Push(worker=w, step=r + 1, batch_size=16, start=arrival - 0.015, end=arrival,
                                         arrival=arrival, loss=0.0, granted_at=t, ready_at=t))
        return events + d.advance(3.0)

    assert rounds(late=0.09) == [StragglerEvent(2.0, 3, BECAME)]
    assert rounds(late=0.02) == []


def test_windows_start_at_the_first_time_seen():
    """The engine's clock is epoch seconds: windows must not be counted from 0 (that was
    1.8e9 windows to close on the first push, and an out-of-memory kill)."""
    d = StragglerDetector(window_s=1.0, k=2, min_drop=0.0)
    t0 = 1.8e9
    assert d.observe({"worker": 0, "end": t0 + 0.2, "compute_s": 0.5, "batch_size": 8}) == []
    assert d.origin == t0 + 0.2 and d.window_of(t0 + 1.1) == 0 and d.window_of(t0 + 1.3) == 1
    d.advance(t0 + 5.3)
    assert len(d.windows) == 5 and d.next_close() == t0 + 0.2 + 6.0  # the open window's end


def test_slow_windows_must_be_consecutive():
    d = StragglerDetector(window_s=1.0, k=2, min_drop=0.0)
    for window in range(8):  # worker 3 slow in every other window only
        for w in range(4):
            n = 2 if (w == 3 and window % 2 == 0) else 10
            d.observe({"worker": w, "end": window + 0.5, "compute_s": 1.0, "batch_size": n})
    assert d.advance(8.0) == [] and d.stragglers == frozenset()


def test_samples_per_window_second_when_records_have_no_start():
    d = StragglerDetector(window_s=2.0, k=1, min_drop=0.0, origin=0.0)
    for w, n in ((0, 100), (1, 100), (2, 100), (3, 10)):
        d.observe({"worker": w, "time": 1.0, "samples": n})
    assert d.advance(2.0) == [StragglerEvent(2.0, 3, BECAME)]
    assert d.windows[0][1][3] == pytest.approx(5.0)  # 10 samples / 2 s


def test_bad_arguments_and_records_say_what_to_fix():
    with pytest.raises(ValueError, match="window_s"):
        StragglerDetector(0.0)
    with pytest.raises(ValueError, match="min_workers"):
        StragglerDetector(1.0, min_workers=1)
    with pytest.raises(ValueError, match="batch_size or samples"):
        StragglerDetector(1.0).observe({"worker": 0, "end": 1.0})
