"""Where to put the next ElasticBSP barrier: pick one predicted iteration end time per
worker so that the chosen times are as close as possible (ZipLine paper, Sec. III-IV).

``M`` is an (n, R) array: row p holds worker p's next R predicted end times, ascending.
A :class:`Barrier` says how many iterations each worker runs before it (``steps``), the
fastest worker's wait ``spread`` = d_Z = max(Z) - min(Z), and the barrier ``time`` = max(Z).

Exact searches (``zipline_fast``, ``zipline``, ``brute_force``) break ties the same way:
all n*R elements are ordered by a stable sort of the row-major concatenation (value,
worker, column); the window with the minimum spread whose right end comes first in that
order wins, and each worker takes its latest element at or before that right end.
NumPy only; no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BRUTE_FORCE_LIMIT = 2_000_000


@dataclass(frozen=True)
class Barrier:
    steps: tuple[int, ...]  # per worker: predicted iterations to run before the barrier, 1..R
    spread: float           # d_Z = max(Z) - min(Z): the fastest worker's wait
    time: float             # max(Z): when the barrier happens


def _check(M) -> np.ndarray:
    """M as a float64 (n, R) array; ValueError unless 2-D, non-empty, finite, rows sorted."""
    try:
        a = np.asarray(M, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"M must be an (n, R) array of floats: {e}") from None
    if a.ndim != 2:
        raise ValueError(f"M must be 2-D (workers x predicted iterations), got shape {a.shape}")
    if a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"M needs n >= 1 workers and R >= 1 predictions, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError("M must be finite (no NaN or inf)")
    bad = np.flatnonzero((np.diff(a, axis=1) < 0).any(axis=1))
    if bad.size:
        raise ValueError(f"row {bad[0]} of M is not sorted ascending")
    return a


def _barrier(a: np.ndarray, cols, spread: float) -> Barrier:
    cols = np.asarray(cols, dtype=np.int64)
    return Barrier(tuple(int(c) + 1 for c in cols), float(spread),
                   float(a[np.arange(a.shape[0]), cols].max()))


def _sorted_order(flat: np.ndarray):
    """Stable argsort of ``flat`` and the sorted values. The unstable (SIMD) sort is ~3x
    faster than timsort and gives the same order when no two values are equal."""
    order = np.argsort(flat)
    t = flat[order]
    if (t[1:] == t[:-1]).any():
        order = np.argsort(flat, kind="stable")
        t = flat[order]
    return order, t


def zipline_fast(M, origin: float | None = None) -> Barrier:
    """Exact ZipLine (Sec. IV, Alg. 2 and Fig. 3): one sort, then O(nR) vectorised.

    ``origin`` (ours, beyond the paper): minimise the wait *per unit of superstep*,
    d_Z / (max(Z) - origin), instead of d_Z. The paper's objective prefers the first
    iteration of every worker whenever speeds differ (its spread is smallest), which
    makes supersteps one step long on many uneven workers, i.e. BSP. For a fixed right
    end the tightest window is still best, so the same scan finds this optimum too.

    For each right end j of the sorted order the window's left end is the earliest of the
    workers' latest positions <= j, l(j) = min(min_{k>j} prv[k], min_w last_w), where prv[k]
    is the previous position of k's worker (-1 if none; l(j) = -1: some worker not seen yet).
    """
    a = _check(M)
    n, R = a.shape
    N = n * R
    it = np.int32 if N < 2**31 else np.int64
    order, t = _sorted_order(a.ravel())
    inv = np.empty(N, dtype=it)
    inv[order] = np.arange(N, dtype=it)
    inv = inv.reshape(n, R)                  # inv[p, c]: position of M[p, c] in the order
    prev = np.full((n, R), -1, dtype=it)
    prev[:, 1:] = inv[:, :-1]
    prv = np.empty(N, dtype=it)
    prv[inv.ravel()] = prev.ravel()
    left = np.empty(N, dtype=it)             # left[j] = min(prv[j+1:], last positions)
    left[-1] = inv[:, -1].min()
    np.minimum.accumulate(prv[:0:-1], out=left[-2::-1])
    np.minimum(left, left[-1], out=left)
    j0 = int(np.argmax(left >= 0))           # first complete window; later ones stay complete
    spread = t[j0:] - t[left[j0:]]
    score = spread if origin is None else spread / np.maximum(t[j0:] - origin, 1e-300)
    j = j0 + int(np.argmin(score))           # the first minimum
    return _barrier(a, (inv <= j).sum(axis=1) - 1, spread[j - j0])


def zipline(M) -> Barrier:
    """The paper's Algorithm 2 (Sec. IV), pure Python, O(R n^2).

    Z is kept in sorted order, so min(Z) = Z[0] and max(Z) = Z[-1]; adding an element drops
    Z's old element of the same worker (the O(n) scan); d_Z is evaluated whenever Z holds n
    workers (Fig. 3) and only a strictly smaller one replaces Z* (line 17).
    """
    a = _check(M)
    n, R = a.shape
    flat = a.ravel().tolist()
    omega = sorted(range(n * R), key=flat.__getitem__)  # stable: (value, worker, column)
    Z, Zw = [], []                                       # positions in omega, their workers
    best, best_Z = None, None
    for pos, k in enumerate(omega):
        w = k // R
        if w in Zw:                                      # line 6: replace the duplicate
            i = Zw.index(w)
            del Z[i], Zw[i]
        Z.append(pos)
        Zw.append(w)
        if len(Z) == n:
            d = flat[omega[Z[-1]]] - flat[omega[Z[0]]]   # max(Z) - min(Z)
            if best is None or d < best:
                best, best_Z = d, [omega[p] for p in Z]
            del Z[0], Zw[0]                              # line 11: Z <- Z - min(Z)
    cols = [0] * n
    for k in best_Z:
        cols[k // R] = k % R
    return _barrier(a, cols, best)


def _scan_row(a: np.ndarray, q: int, chunk_elems: int = 1 << 22):
    """Alg. 1 lines 5-14 with row q designated: (d_Z*, columns) over q's R points."""
    n, R = a.shape
    best_d, best_cols = np.inf, None
    step = max(1, chunk_elems // (n * R))
    for s in range(0, R, step):
        e = a[q, s:s + step]                                       # designated points
        cols = np.abs(a[None, :, :] - e[:, None, None]).argmin(axis=2)  # nearest per row
        cols[:, q] = np.arange(s, s + e.size)
        z = np.take_along_axis(a[None, :, :], cols[:, :, None], axis=2)[..., 0]
        d = z.max(axis=1) - z.min(axis=1)
        i = int(np.argmin(d))
        if d[i] < best_d:
            best_d, best_cols = float(d[i]), cols[i]
    return best_d, best_cols


def grid_scan(M) -> Barrier:
    """GridScan (Sec. IV, Alg. 1): heuristic, O(R^2 n); the row with the earliest first
    point is designated and every other row takes its point nearest to each designated one."""
    a = _check(M)
    d, cols = _scan_row(a, int(np.argmin(a[:, 0])))
    return _barrier(a, cols, d)


def full_grid_scan(M) -> Barrier:
    """FullGridScan (Sec. IV): GridScan with every row designated in turn; heuristic,
    O(R^2 n^2); its spread is never worse than GridScan's."""
    a = _check(M)
    best_d, best_cols = np.inf, None
    for q in range(a.shape[0]):
        d, cols = _scan_row(a, q)
        if d < best_d:
            best_d, best_cols = d, cols
    return _barrier(a, best_cols, best_d)


def brute_force(M) -> Barrier:
    """Naive search (Sec. IV) over all R^n combinations, with the exact searches' tie-break:
    minimise (spread, sorted position of max(Z)), then the latest column for every worker."""
    a = _check(M)
    n, R = a.shape
    if R ** n > BRUTE_FORCE_LIMIT:
        raise ValueError(f"brute_force needs R**n <= {BRUTE_FORCE_LIMIT}, got {R}**{n}")
    if R == 1:
        return _barrier(a, [0] * n, a[:, 0].max() - a[:, 0].min())
    inv = np.empty(n * R, dtype=np.int64)
    inv[np.argsort(a.ravel(), kind="stable")] = np.arange(n * R)
    inv = inv.reshape(n, R)
    shape = (R,) * n
    hi = np.full(shape, -np.inf)
    lo = np.full(shape, np.inf)
    top = np.full(shape, -1, dtype=np.int64)
    for p in range(n):  # broadcast row p along axis p
        view = (1,) * p + (R,) + (1,) * (n - p - 1)
        hi = np.maximum(hi, a[p].reshape(view))
        lo = np.minimum(lo, a[p].reshape(view))
        top = np.maximum(top, inv[p].reshape(view))
    spread, top = (hi - lo).ravel(), top.ravel()
    cand = np.flatnonzero(spread == spread.min())
    cand = cand[top[cand] == top[cand].min()]
    cols = np.unravel_index(int(cand.max()), shape)  # C order: largest index = latest columns
    return _barrier(a, cols, spread[cand.max()])


SEARCHES = {
    "zipline_fast": zipline_fast,
    "zipline": zipline,
    "grid_scan": grid_scan,
    "full_grid_scan": full_grid_scan,
    "brute_force": brute_force,
}

__all__ = ["Barrier", "SEARCHES", "brute_force", "full_grid_scan", "grid_scan", "zipline",
           "zipline_fast"]
