"""Search-cost replay (Sync-Switch §VI-C1) against hand computations on synthetic runs."""

import math
import os

import pytest

from tfsync.switch.search_cost import RecordedRun, RunBank, bank_from_results, simulate_setting

pytestmark = pytest.mark.unit

# BSP: 2 runs, 100 s, accuracy 0.90. Switch at 0.5: 60 s, 0.90. At 0.25: 40 s, one run at
# 0.80 and one at 0.90 (mean 0.85 < 0.90 - beta: the full-information search rejects it).
RUNS = [RecordedRun(1.0, 0.90, 100.0), RecordedRun(1.0, 0.90, 100.0),
        RecordedRun(0.5, 0.90, 60.0), RecordedRun(0.5, 0.90, 60.0),
        RecordedRun(0.25, 0.80, 40.0), RecordedRun(0.25, 0.90, 40.0)]
SIMS = 4000


def close(p, q, sims=SIMS):  # within 4 binomial standard deviations
    return abs(p - q) <= 4 * math.sqrt(max(q * (1 - q), 1e-9) / sims)


def test_recurring_one_run_per_setting():
    # M = 2: 0.5 always accepted; 0.25 accepted (a wrong answer) iff its one draw is the 0.90 run.
    row = simulate_setting(RunBank(RUNS), recurring=True, bsp_runs=0, candidate_runs=1, settings=2, sims=SIMS)
    assert row.reference == 0.5
    assert row.cost == pytest.approx((60 + 40) / 100)  # every replay trains the same two runs
    assert row.effective == pytest.approx(2 / 1.0)
    assert row.amortization == pytest.approx(1.0 / (1 - 60 / 100))
    assert close(row.success, 0.5) and set(row.found) == {0.25, 0.5}


def test_new_job_with_every_run_drawn_is_certain():
    # (No, 2, 2): both BSP runs (200 s) and both runs of each setting, without replacement.
    row = simulate_setting(RunBank(RUNS), recurring=False, bsp_runs=2, candidate_runs=2, settings=2, sims=200)
    assert row.success == 1.0
    assert row.cost == pytest.approx((200 + 120 + 80) / 100)
    assert row.effective == pytest.approx(6 / 4.0)


def test_more_runs_than_recorded_are_drawn_with_replacement():
    # R = 3 from the two runs at 0.25: the mean reaches 0.89 only if all three draws are the
    # 0.90 run, probability 1/8; otherwise the right answer.
    row = simulate_setting(RunBank(RUNS), recurring=True, bsp_runs=0, candidate_runs=3, settings=2, sims=SIMS)
    assert close(row.success, 7 / 8)
    assert row.cost == pytest.approx(3 * (60 + 40) / 100)


def test_unrecorded_switch_points_use_the_nearest_recorded_fraction():
    # M = 3 on noise-free runs: 0.5 accept, 0.25 reject, then 0.375 -- as far from 0.25 as
    # from 0.5; the tie goes to the larger fraction, 0.5, which is accepted.
    runs = [r for r in RUNS if r.accuracy == 0.90 and r.fraction != 0.25] + [RecordedRun(0.25, 0.80, 40.0)]
    bank = RunBank(runs)
    row = simulate_setting(bank, recurring=True, bsp_runs=0, candidate_runs=1, settings=3, sims=50)
    assert row.reference == 0.375 and row.success == 1.0
    assert row.cost == pytest.approx((60 + 40 + 60) / 100)
    assert bank.mean_time(0.375) == 60.0


def test_missing_times_and_the_cost_unit():
    bank = bank_from_results({(1.0, 0): (100.0, 0.9), (1.0, 1): (300.0, 0.9), (0.5, 0): (50.0, 0.9)})
    assert bank.bsp_time == 200.0
    assert RunBank(RUNS[:2] + [RecordedRun(1.0, 0.9, None)], time_stat="median").runs[1.0][2].time == 100.0
    with pytest.raises(ValueError, match="no BSP run"):
        RunBank([RecordedRun(0.5, 0.9, 1.0)])
    with pytest.raises(ValueError, match="bsp_runs must be 0"):
        simulate_setting(bank, recurring=True, bsp_runs=1, candidate_runs=1, settings=1)


@pytest.mark.skipif(not os.path.isdir(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                                                   "sync-switch-curves")), reason="needs shared/data")
def test_setup_three_reproduces_the_papers_table_vi():
    # Setup 3 (16 workers) has only BSP and 50 % runs, so the replay is unambiguous.
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "experiments"))
    from bench_search_cost import DATA, load_setup

    bank = RunBank(load_setup(DATA, 3))
    for (rec, b, c), cost, amort in (((False, 5, 5), 7.68, 16.54), ((True, 0, 1), 0.54, 1.16)):
        row = simulate_setting(bank, recurring=rec, bsp_runs=b, candidate_runs=c, settings=1, sims=300)
        assert row.cost == pytest.approx(cost, rel=0.03) and row.amortization == pytest.approx(amort, rel=0.05)


def test_a_search_cheaper_than_one_bsp_training():
    # (Yes, 0, 1) with M = 1 (the paper's setup 3): one run at 0.5, 0.6 of a BSP training.
    row = simulate_setting(RunBank(RUNS), recurring=True, bsp_runs=0, candidate_runs=1, settings=1, sims=20)
    assert row.cost == pytest.approx(0.6) and row.effective == pytest.approx(1 / 0.6)
    assert row.amortization == pytest.approx(0.6 / 0.4) and row.success == 1.0
