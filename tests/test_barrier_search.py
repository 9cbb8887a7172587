"""Barrier searches of ElasticBSP (tfsync.policy.barrier_search): the exact ones against
brute force, the heuristics against a plain reference of the paper's Algorithm 1."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tfsync.policy import barrier_search as bs

pytestmark = pytest.mark.unit

EXACT = ("zipline_fast", "zipline", "brute_force")


def random_cases(seed, count, max_n, max_R, kind):
    """Seeded (n, R) matrices with sorted rows: uniform floats, small integers (many
    ties) or rows that repeat one value."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n, R = int(rng.integers(1, max_n + 1)), int(rng.integers(1, max_R + 1))
        if kind == "float":
            M = rng.random((n, R))
        elif kind == "int":
            M = rng.integers(0, 4, (n, R)).astype(float)
        else:  # "flat": rows of equal values, some shared across rows
            M = np.repeat(rng.integers(0, 3, (n, 1)), R, axis=1).astype(float)
            M[:, R // 2:] += rng.integers(0, 2, (n, 1))
        yield np.sort(M, axis=1)


def check_valid(M, b):
    """A barrier names one column per worker and reports that choice's spread and time."""
    M = np.asarray(M, dtype=float)
    assert len(b.steps) == M.shape[0]
    assert all(isinstance(s, int) and 1 <= s <= M.shape[1] for s in b.steps)
    z = M[np.arange(M.shape[0]), np.array(b.steps) - 1]
    assert b.spread == z.max() - z.min()
    assert b.time == z.max()


@pytest.mark.parametrize("kind", ["float", "int", "flat"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_searches_agree_with_brute_force(seed, kind):
    for M in random_cases(seed, 150, max_n=5, max_R=6, kind=kind):
        fast, lit, brute = (bs.SEARCHES[name](M) for name in EXACT)
        assert fast == lit == brute, (M, fast, lit, brute)
        check_valid(M, fast)


@pytest.mark.parametrize("kind", ["float", "int"])
def test_fast_matches_literal_zipline_on_larger_inputs(kind):
    for M in random_cases(10, 60, max_n=50, max_R=30, kind=kind):
        assert bs.zipline_fast(M) == bs.zipline(M)


def test_fast_result_is_a_local_minimum():
    """No single worker moving to another column can shrink the spread."""
    for M in random_cases(20, 200, max_n=8, max_R=8, kind="float"):
        b = bs.zipline_fast(M)
        cols = np.array(b.steps) - 1
        for p in range(M.shape[0]):
            for c in range(M.shape[1]):
                z = M[np.arange(M.shape[0]), cols].copy()
                z[p] = M[p, c]
                assert z.max() - z.min() >= b.spread


def test_first_minimum_is_kept():
    """Fig. 3: of equal minima the earliest window wins (strict < on line 17)."""
    M = [[0.0, 10.0], [1.0, 11.0]]
    for name in EXACT:
        assert bs.SEARCHES[name](M) == bs.Barrier((1, 1), 1.0, 1.0)


def test_hand_example():
    M = [[1.0, 5.0, 9.0], [2.0, 6.0, 10.0], [4.5, 12.0, 14.0]]
    for name in EXACT:
        assert bs.SEARCHES[name](M) == bs.Barrier((2, 2, 1), 1.5, 6.0)


def test_ties_take_each_workers_latest_column():
    M = [[3.0, 3.0, 3.0], [3.0, 3.0, 7.0]]
    for name in EXACT:
        assert bs.SEARCHES[name](M) == bs.Barrier((3, 1), 0.0, 3.0)


def test_single_worker_has_no_spread():
    for name, search in bs.SEARCHES.items():
        assert search([[0.5, 1.0, 2.0]]) == bs.Barrier((1,), 0.0, 0.5), name


def test_single_column_takes_it():
    M = [[3.0], [1.0], [2.0]]
    for name, search in bs.SEARCHES.items():
        assert search(M) == bs.Barrier((1, 1, 1), 2.0, 3.0), name


def reference_scan_row(M, q):
    """Algorithm 1 lines 5-14 as plain loops, designated row q."""
    best, best_cols = math.inf, None
    for i, e in enumerate(M[q]):
        cols = [i if p == q else min(range(len(row)), key=lambda c: abs(row[c] - e))
                for p, row in enumerate(M)]
        z = [M[p][c] for p, c in enumerate(cols)]
        if max(z) - min(z) < best:
            best, best_cols = max(z) - min(z), cols
    return best, best_cols


def test_heuristics_follow_algorithm_1():
    for M in random_cases(30, 150, max_n=6, max_R=6, kind="int"):
        rows = M.tolist()
        q = min(range(len(rows)), key=lambda p: rows[p][0])
        d, cols = reference_scan_row(rows, q)
        assert bs.grid_scan(M).steps == tuple(c + 1 for c in cols)
        full = min((reference_scan_row(rows, p) for p in range(len(rows))), key=lambda r: r[0])
        assert bs.full_grid_scan(M).steps == tuple(c + 1 for c in full[1])


def test_scan_row_chunks_agree():
    """Designated points taken a few at a time give the same answer as all at once."""
    for M in random_cases(31, 60, max_n=6, max_R=6, kind="int"):
        for q in range(M.shape[0]):
            d, cols = reference_scan_row(M.tolist(), q)
            for chunk in (1, 2 * M.size, 1 << 22):
                got = bs._scan_row(M, q, chunk_elems=chunk)
                assert (got[0], list(got[1])) == (d, cols)


@pytest.mark.parametrize("kind", ["float", "int", "flat"])
def test_heuristics_are_valid_and_never_beat_the_optimum(kind):
    for M in random_cases(40, 150, max_n=6, max_R=6, kind=kind):
        best = bs.zipline_fast(M).spread
        grid, full = bs.grid_scan(M), bs.full_grid_scan(M)
        check_valid(M, grid)
        check_valid(M, full)
        assert best <= full.spread <= grid.spread


def test_heuristics_can_miss_the_optimum():
    """The nearest point to a designated one is not always in the best set (Sec. IV)."""
    M = [[15.0, 15.0], [3.0, 3.0], [1.0, 13.0], [2.0, 19.0]]
    assert bs.zipline_fast(M) == bs.Barrier((1, 2, 2, 1), 13.0, 15.0)
    assert bs.full_grid_scan(M).spread == 14.0
    assert bs.grid_scan(M).spread == 14.0


@pytest.mark.parametrize("M, message", [
    ([[1.0, 3.0], [2.0, 1.0]], "row 1 of M is not sorted"),
    ([[1.0, float("nan")]], "finite"),
    ([[1.0, float("inf")]], "finite"),
    ([1.0, 2.0, 3.0], "2-D"),
    ([[[1.0]]], "2-D"),
    (np.zeros((0, 3)), "n >= 1"),
    (np.zeros((2, 0)), "R >= 1"),
    ([[1.0, 2.0], [3.0]], "array"),
    ([["a", "b"]], "array"),
])
def test_bad_input_is_refused(M, message):
    for name, search in bs.SEARCHES.items():
        with pytest.raises(ValueError, match=message):
            search(M)


def test_brute_force_refuses_huge_inputs():
    with pytest.raises(ValueError, match="R\\*\\*n"):
        bs.brute_force(np.tile(np.arange(10.0), (7, 1)))
    assert bs.brute_force(np.ones((100, 1))) == bs.Barrier((1,) * 100, 0.0, 1.0)  # 1**100 combinations


def test_searches_are_registered():
    assert set(bs.SEARCHES) == {"zipline_fast", "zipline", "grid_scan", "full_grid_scan", "brute_force"}


@pytest.mark.parametrize("seed", range(40))
def test_wait_share_objective_is_exact(seed):
    """zipline_fast(M, origin) minimises spread / (max - origin) over all R^n sets."""
    rng = np.random.default_rng(seed)
    n, R = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    M = np.cumsum(rng.uniform(0.5, 2.0, (n, R)), axis=1)
    got = bs.zipline_fast(M, origin=0.0)
    best = min((max(z) - min(z)) / max(z) for z in itertools.product(*M))
    assert got.spread / got.time == pytest.approx(best, rel=1e-12, abs=1e-15)
    chosen = [M[p, c - 1] for p, c in enumerate(got.steps)]
    assert max(chosen) - min(chosen) == pytest.approx(got.spread)
