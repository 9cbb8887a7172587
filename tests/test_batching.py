"""LB-BSP batch sizing (LB-BSP §3.2, §3.3) and hysteresis; pure NumPy/SciPy."""

import random

import numpy as np
import pytest

from tfsync.batching import (GpuProfile, Hysteresis, affine_rule, cpu_rule, gpu_rule, predicted_times,
                             profile_worker)
from tfsync.batching.stepfit import MAX_FIXED, StepFit

pytestmark = pytest.mark.unit


def test_cpu_rule_paper_example_and_exact_sum():
    assert cpu_rule([1.0, 3.0], 64) == [16, 48]
    assert cpu_rule([1, 1, 1], 100) in ([34, 33, 33], [33, 34, 33], [33, 33, 34])


def test_cpu_rule_invariants_on_random_inputs():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 12)
        speeds = [rng.uniform(0.1, 100.0) for _ in range(n)]
        total = rng.randint(n, 5000)
        sizes = cpu_rule(speeds, total)
        assert sum(sizes) == total and all(isinstance(x, int) and x >= 1 for x in sizes)
        ideal = [v / sum(speeds) * total for v in speeds]
        if all(i >= 1 for i in ideal):  # no bound binds: within rounding of the ideal
            assert all(abs(x - i) < 1 for x, i in zip(sizes, ideal)), (speeds, total, sizes)
            # largest remainder: every share rounded up had a larger fraction than any rounded down
            up = [i % 1 for x, i in zip(sizes, ideal) if x > i]
            down = [i % 1 for x, i in zip(sizes, ideal) if x < i]
            assert not up or not down or min(up) >= max(down) - 1e-9


def test_cpu_rule_bounds_bind_and_the_rest_is_reshared():
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(2, 10)
        speeds = [rng.lognormvariate(0, 1.5) for _ in range(n)]
        lo = [rng.randint(1, 20) for _ in range(n)]
        hi = [l + rng.randint(0, 200) for l in lo]
        total = rng.randint(sum(lo), sum(hi))
        sizes = cpu_rule(speeds, total, lo, hi)
        assert sum(sizes) == total
        assert all(l <= x <= h for x, l, h in zip(sizes, lo, hi)), (sizes, lo, hi)
    # One very fast worker capped at 12: the other two share the rest equally.
    assert cpu_rule([1, 100, 1], 30, lo=5, hi=12) == [9, 12, 9]
    assert cpu_rule([1, 100, 1], 30, lo=5) == [5, 20, 5]


@pytest.mark.parametrize("lo, hi, total, msg", [
    (20, None, 30, "lower bounds sum to 40"),
    (1, 10, 30, "upper bounds to 20"),
])
def test_cpu_rule_infeasible_bounds_are_a_clear_error(lo, hi, total, msg):
    with pytest.raises(ValueError, match=f"total batch {total} cannot be split among 2 workers.*{msg}"):
        cpu_rule([1.0, 2.0], total, lo, hi)


def test_affine_rule_equalises_step_lines_and_leaves_a_worker_whose_fixed_part_is_too_long_at_lo():
    a, b = [0.0036, 0.143], [6.9e-5, 1.46e-4]     # measured on the testbed: n3 at a third of a CPU
    sizes = affine_rule(a, b, 4096)
    assert sum(sizes) == 4096
    times = [ai + bi * x for ai, bi, x in zip(a, b, sizes)]
    assert abs(times[0] - times[1]) <= max(b)      # equal to within one sample
    assert affine_rule([0, 0, 0], [1 / 3000, 1 / 1000, 1 / 2000], 66) == cpu_rule([3000, 1000, 2000], 66)
    # worker 1's link alone takes 0.4 s, longer than worker 0 needs for the whole batch
    assert affine_rule([0.03, 0.40], [1 / 14000, 1 / 14000], 1024) == [1023, 1]
    assert affine_rule([0.03, 0.40], [1 / 14000, 1 / 14000], 1024, lo=8) == [1016, 8]
    with pytest.raises(ValueError, match="fixed times >= 0 and times per sample > 0"):
        affine_rule([0.1, -0.1], [1e-3, 1e-3], 64)
    with pytest.raises(ValueError, match="one fixed time and one time per sample per worker, got 2 and 1"):
        affine_rule([0.1, 0.1], [1e-3], 64)


def test_a_step_fit_finds_the_fixed_share_once_batches_differ():
    fit = StepFit(window=4)
    for _ in range(4):
        fit.add(512, 0.143 + 512 * 1.46e-4)
    assert fit.fixed_share(512) == 0.0              # one batch size: nothing to fit, the paper's model
    for x in (512, 735, 735):
        fit.add(x, 0.143 + x * 1.46e-4)
    assert fit.fixed_share(512) == pytest.approx(0.143 / (0.143 + 512 * 1.46e-4))
    for x in (256, 512, 1024):                      # slower at a smaller batch: noise, no evidence of a line
        fit.add(x, 0.5 - x * 1e-5)
    assert fit.fixed_share(512) == 0.0
    for x in (16, 512, 1024, 1024):                 # nearly all fixed: at most MAX_FIXED
        fit.add(x, 0.5 + x * 1e-7)
    assert fit.fixed_share(512) == MAX_FIXED
    restored = StepFit(window=4)
    restored.restore_state(fit.save_state())
    assert restored.points == fit.points


def test_cpu_rule_rejects_bad_speeds():
    with pytest.raises(ValueError, match="speeds must be finite and > 0"):
        cpu_rule([1.0, 0.0], 10)


def test_gpu_rule_equalises_times_when_bounds_allow():
    rng = random.Random(2)
    for _ in range(50):
        n = rng.randint(2, 6)
        ps = [GpuProfile(rng.uniform(1e-4, 1e-3), rng.uniform(0.0, 0.05), 1, None) for _ in range(n)]
        comm = [rng.uniform(0.0, 0.02) for _ in range(n)]
        total = rng.randint(200 * n, 500 * n)
        sizes = gpu_rule(ps, total, comm)
        assert sum(sizes) == total and all(isinstance(x, int) for x in sizes)
        t = predicted_times(ps, sizes, comm)
        slowest_step = max(p.m for p in ps)  # rounding moves a time by at most one sample
        assert max(t) - min(t) <= slowest_step + 1e-9, (sizes, t)


def test_gpu_rule_respects_bounds_that_bind():
    ps = [GpuProfile(0.001, 0.01, 8, 512), GpuProfile(0.003, 0.02, 8, 512), GpuProfile(0.0005, 0.05, 16, 100)]
    sizes = gpu_rule(ps, 300, [0.01, 0.0, 0.02])
    assert sizes == [150, 50, 100]  # worker 2 is capped at x_o = 100; 0 and 1 equalised
    t = predicted_times(ps, sizes, [0.01, 0.0, 0.02])
    assert t[0] == pytest.approx(t[1]) and t[2] < t[0]
    # a lower bound: a slow worker is not pushed below its saturation point
    sizes = gpu_rule([GpuProfile(0.001, 0.0, 1, None), GpuProfile(0.1, 0.0, 40, None)], 100)
    assert sizes == [60, 40]
    with pytest.raises(ValueError, match="upper bounds to 1124"):
        gpu_rule(ps, 2000)


def test_profile_worker_finds_the_flat_part_and_the_line():
    sizes = [8, 16, 32, 64, 128, 256]
    rng = np.random.default_rng(0)
    obs = [(x, (0.05 if x <= 32 else 0.05 + 0.001 * (x - 32)) * (1 + rng.normal(0, 0.005)))
           for x in sizes for _ in range(3)]
    p = profile_worker(obs, x_o=400)
    assert p.x_s == 32 and p.x_o == 400
    assert p.m == pytest.approx(0.001, rel=0.05) and p.b == pytest.approx(0.018, abs=0.003)
    linear = profile_worker([(x, 0.002 * x + 0.01) for x in sizes])
    assert linear.x_s == 8 and linear.x_o == 256 and linear.m == pytest.approx(0.002)
    with pytest.raises(ValueError, match="at least 2 distinct batch sizes"):
        profile_worker([(8, 0.1), (8, 0.11)])


def cpu_times(speeds):
    return lambda sizes: {w: sizes[w] / speeds[w] for w in sizes}


def test_hysteresis_keeps_sizes_on_noise_and_moves_on_a_real_change():
    h = Hysteresis(min_gain=0.05, max_change=0.5)
    rng = random.Random(3)
    current, plans = None, set()
    for _ in range(50):  # speeds 100 and 300 with 3 % noise
        speeds = {0: 100 * (1 + rng.gauss(0, 0.03)), 1: 300 * (1 + rng.gauss(0, 0.03))}
        proposed = dict(zip((0, 1), cpu_rule([speeds[0], speeds[1]], 128)))
        plans.add(tuple(proposed.values()))
        current = h.choose(current, proposed, cpu_times(speeds))
    assert len(plans) > 3  # the plain rule would have churned
    assert h.moves == 1 and h.holds == 49 and abs(current[0] - 32) <= 2  # the first plan stays
    speeds = {0: 200.0, 1: 200.0}  # worker 1 became a straggler-free equal
    proposed = dict(zip((0, 1), cpu_rule([200.0, 200.0], 128)))
    assert h.choose(current, proposed, cpu_times(speeds)) == {0: 64, 1: 64} and h.moves == 2


def test_hysteresis_moves_on_new_members_and_off_with_zero_thresholds():
    h = Hysteresis()
    assert h.choose({0: 10, 1: 10}, {0: 8, 1: 8, 2: 4}, cpu_times({0: 1, 1: 1, 2: 1})) == {0: 8, 1: 8, 2: 4}
    plain = Hysteresis(0.0, 0.0)
    assert plain.choose({0: 10, 1: 10}, {0: 11, 1: 9}, cpu_times({0: 1.1, 1: 0.9})) == {0: 11, 1: 9}
    with pytest.raises(ValueError, match="min_gain >= 0"):
        Hysteresis(-1)
