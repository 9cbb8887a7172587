"""LB-BSP's guard (tfsync.batching.guard) on round times given directly: no simulator, no
TensorFlow."""

import math

import pytest

from tfsync.batching.guard import DRIFT, HOLD_PER_TRIAL, MAX_TRIAL_WINDOWS, WARMUP, WINDOW_S, EvenGuard

pytestmark = pytest.mark.unit

EVEN = 64
UNEVEN = {0: 48, 1: 80}


def feed(guard: EvenGuard, times, batch: int = EVEN) -> None:
    """Complete rounds of one push each, ``batch`` samples, the given seconds."""
    for seconds in times:
        guard.observe(guard.rounds, batch, seconds, members=1)


def noisy(mean: float, spread: float, count: int) -> list[float]:
    return [mean + (spread if i % 2 else -spread) for i in range(count)]


def tried(guard: EvenGuard, even_s: float, sizes_s: float, spread: float, rounds: int = 20) -> list:
    """Warm-up, even rounds at ``even_s``, then a trial of ``rounds`` rounds of uneven sizes
    at ``sizes_s``, both alternating by +-``spread``; the checks made."""
    feed(guard, [even_s] * WARMUP + noisy(even_s, spread, 20))
    assert guard.allow(None, UNEVEN) == UNEVEN   # the sizes leave the even split: a trial
    feed(guard, noisy(sizes_s, spread, rounds), batch=48)
    return guard.checks


def test_a_gain_inside_the_noise_is_tried_longer_and_not_kept_and_one_beyond_it_is_kept():
    """5 % faster rounds: with +-30 % between rounds the difference of the means is within
    two standard errors, the trial runs on to MAX_TRIAL_WINDOWS seconds, and the even split
    holds; with +-1 % the sizes are kept after a second. (A fixed 3 % margin kept both.)"""
    guard = EvenGuard(EVEN)
    assert tried(guard, 0.1, 0.095, 0.03, rounds=11) == []   # a second: faster, within the noise
    trial = 11
    while not guard.checks:
        feed(guard, [0.095], batch=48)
        trial += 1
    assert trial == math.ceil(MAX_TRIAL_WINDOWS * WINDOW_S / 0.095)
    (check,) = guard.checks
    assert check["kind"] == "trial" and not check["kept"] and check["se_s"] > 0.005
    assert [c["kept"] for c in tried(EvenGuard(EVEN), 0.1, 0.095, 0.001, rounds=11)] == [True]


def test_a_failed_trial_holds_the_even_split_for_several_times_its_rounds():
    """On a fast model a trial spans a second of many rounds: the hold after it is at least
    HOLD_PER_TRIAL times as many, so trials of noise take at most a quarter of the rounds."""
    guard = EvenGuard(EVEN, backoff=16)
    assert [c["kept"] for c in tried(guard, 0.11, 0.11, 0.01, rounds=10)] == [False]   # (a second)
    assert guard.hold == HOLD_PER_TRIAL * 10 > 16
    for _ in range(guard.hold - 1):
        assert guard.allow(None, UNEVEN) == {0: EVEN, 1: EVEN}
        feed(guard, [0.11])
    feed(guard, [0.11])
    assert guard.allow(None, UNEVEN) == UNEVEN


def test_kept_sizes_that_drift_far_from_those_granted_are_probed_at_once():
    """Sizes kept, then moved by LB-BSP: within DRIFT of the even batch they run on; beyond
    it the even split is probed at once (not only when the recheck is due), at most once
    each ``recheck`` rounds."""
    guard = EvenGuard(EVEN, recheck=64)
    assert [c["kept"] for c in tried(guard, 0.1, 0.08, 0.001, rounds=13)] == [True]
    granted = {0: 40, 1: 88}
    assert guard.allow(UNEVEN, granted) == granted   # the sizes first granted after the verdict
    near = {0: 40 + int(DRIFT * EVEN) - 1, 1: 88 - int(DRIFT * EVEN) + 1}
    assert guard.allow(granted, near) == near
    far = {0: 40 + int(DRIFT * EVEN) + 1, 1: 88 - int(DRIFT * EVEN) - 1}
    assert guard.allow(near, far) == {0: EVEN, 1: EVEN} and guard.probe == []
    feed(guard, [0.1] * 20)   # the probe: even rounds slower than the sizes' -> kept again
    assert [c["kind"] for c in guard.checks] == ["trial", "probe"] and guard.checks[-1]["kept"]
    assert guard.allow(None, granted) == granted   # the new anchor
    assert guard.allow(granted, far) == far   # a drift again within `recheck` rounds: not probed yet
    feed(guard, [0.08] * 64, batch=48)
    assert guard.allow(far, far) == {0: EVEN, 1: EVEN}   # the recheck, due
