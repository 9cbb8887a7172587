"""Issue 19 study: how much better than EMA can *any* one-step speed predictor be, given the
inputs NARX gets? A rolling ridge ARX (linear, closed form, refit every 50 steps on the
last 1000, like NARX's schedule) on lags of the speed, the CPU reading and the EMA, per
worker, RMSE from step 500 divided by EMA's. If this linear probe cannot get below
~0.9 x EMA, the limit is the information in the inputs, not NARX's training.

Inputs: the Alibaba 2018 machines as `tfsync predict score` turns a trace into steps
(tfsync.predict.score.series_from_trace; readings "last" = a monitor's, "next" = the
oracle of the load the next step runs under), the recorded 2-core series of
bench_predictors.py, and, with --exo, the Alibaba file's other columns (memory,
network, disk; mpki is empty there) at the raw samples as extra inputs.

The interpolation bound (printed as "interp"): a ridge fit of step k's speed on the
speeds *and* readings of the L steps before and the L steps after it (k itself left out),
fitted in-sample on the whole series, RMSE from step 500 / EMA's. It sees the future and
its own test data, so no causal predictor with these inputs (linear in them) does better;
where it stays near 1, what EMA misses is step-to-step noise that nothing predicts.

    OPENBLAS_NUM_THREADS=1 python experiments/probe_predictability.py [--exo]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))
from tfsync.predict.score import load_series, series_from_trace  # noqa: E402
from tfsync.base.traces import load_cpu_traces  # noqa: E402

TRACES = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "data", "traces"))
SERIES = os.path.join(HERE, "..", "results", "bench_predictors_series.csv")


def ema_before(v, alpha=0.2):
    """EMA of steps 0..k-1, the prediction for step k (nan for k = 0)."""
    out, e = np.full(len(v), np.nan), v[0]
    for k in range(1, len(v)):
        out[k] = e
        e = alpha * v[k] + (1 - alpha) * e
    return out


def ratio_to_ema(v, extra=None, lags=2, start=500, window=1000, every=50, lam=1e-3) -> float:
    """RMSE(ARX) / RMSE(EMA) from ``start``; inputs known before step k: speeds and
    ``extra`` columns (readings given with steps < k) at lags 1..lags, the EMA."""
    e, n, scale = ema_before(v), len(v), float(np.mean(v))
    lag = lambda x, i: np.r_[[np.nan] * i, x[:-i]]  # noqa: E731 - x of step k - i, at row k
    cols = [np.ones(n)] + [(lag(v, i) - e) / scale for i in range(1, lags + 1)]  # speeds relative to the EMA
    cols += [lag(x, i) for x in ([] if extra is None else extra.T) for i in range(1, lags + 2)]
    X, y = np.column_stack(cols), (v - e) / scale  # the target: what EMA misses
    pred, w = np.full(n, np.nan), None
    for k in range(start, n):
        if w is None or (k - start) % every == 0:
            j = np.arange(max(lags + 1, k - window), k)
            a = np.nan_to_num(X[j])
            w = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ y[j])
        pred[k] = e[k] + scale * (np.nan_to_num(X[k]) @ w)
    rmse = lambda p: np.sqrt(np.mean((p[start:] - v[start:]) ** 2))  # noqa: E731
    return float(rmse(pred) / rmse(e))


def interp_ratio(v, extra=None, lags=5, start=500, lam=1e-3) -> float:
    """RMSE(two-sided in-sample ridge interpolator) / RMSE(EMA) from ``start`` (see the
    module docstring): inputs the speeds and ``extra`` columns of steps k-lags..k+lags but k."""
    e, n, scale = ema_before(v), len(v), float(np.mean(v))
    shift = lambda x, i: np.roll(x, i)  # noqa: E731 - x of step k - i, at row k (ends cut below)
    series = [v / scale - 1] + ([] if extra is None else list(extra.T))
    cols = [np.ones(n)] + [shift(x, i) for x in series for i in range(-lags, lags + 1) if i]
    X, y = np.column_stack(cols)[lags:n - lags], (v / scale - 1)[lags:n - lags]
    w = np.linalg.solve(X.T @ X + lam * np.eye(X.shape[1]), X.T @ y)
    pred = np.r_[[np.nan] * lags, scale * (1 + X @ w), [np.nan] * lags]
    rmse = lambda p: np.sqrt(np.nanmean((p[start:] - v[start:]) ** 2))  # noqa: E731
    return float(rmse(pred) / rmse(e))


def alibaba_raw():
    """{machine: (util %, other columns)} of the raw Alibaba rows, time order."""
    rows: dict[str, list] = {}
    with open(os.path.join(TRACES, "alibaba2018", "machine_usage.csv"), newline="") as f:
        for r in csv.reader(f):
            if r[2]:
                rows.setdefault(r[0], []).append([float(r[1]), float(r[2])] + [float(x) if x else np.nan
                                                                              for x in (r[3], r[5], r[6], r[7], r[8])])
    out = {}
    for name, rs in sorted(rows.items()):
        a = np.array(sorted(rs))[:3000]
        exo = a[:, 2:]
        exo = exo[:, ~np.all(np.isnan(exo), axis=0)]  # mpki is empty in this file
        exo = np.where(np.isnan(exo), np.nanmean(exo, axis=0), exo)  # a missing value: the column mean
        out[name] = (a[:, 1], exo / 100)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exo", action="store_true", help="also the Alibaba trace's other columns as inputs")
    args = p.parse_args(argv)
    path = os.path.join(TRACES, "alibaba2018", "machine_usage.csv")
    for readings in ("last", "next"):
        traces = load_cpu_traces(path, gaps="hold")
        ratios, interp = [], []
        for w, t in enumerate(traces):
            d = series_from_trace(t, readings=readings, steps=3000, seed=w)
            v, c = np.array(d["speed"]), np.array(d["cpu"])[:, None] / 100
            ratios.append(ratio_to_ema(v, c))
            interp.append(interp_ratio(v, c))
        print(f"alibaba, {len(traces)} machines, readings={readings}: ARX / EMA mean {np.mean(ratios):.3f} "
              f"({' '.join(f'{r:.2f}' for r in ratios)}); interp {np.mean(interp):.3f}")
    series = load_series(SERIES) if os.path.exists(SERIES) else {}
    inputs = [(np.array(d["speed"]), np.array([c or 0.0 for c in d["cpu"]])[:, None] / 100)
              for d in series.values()]
    if inputs:
        print(f"real 2-core recording, contention readings: ARX / EMA "
              f"{' '.join(f'{ratio_to_ema(v, c):.3f}' for v, c in inputs)}; interp "
              f"{' '.join(f'{interp_ratio(v, c):.3f}' for v, c in inputs)}")
        # The co-located load itself (the burner's duty as set), the best a run-queue length
        # or process count could tell, as the input instead of the monitor's reading.
        with open(SERIES, newline="") as f:
            rows = list(csv.DictReader(f))
        duty = [np.array([float(r["burner_duty"]) for r in rows if int(r["worker"]) == w])[:, None]
                for w in sorted(series)] if rows and "burner_duty" in rows[0] else []
        if duty and all(len(x) == len(v) for x, (v, _) in zip(duty, inputs)):
            print(f"real 2-core recording, the co-located load (burner duty) as input: ARX / EMA "
                  f"{' '.join(f'{ratio_to_ema(v, x):.3f}' for x, (v, _) in zip(duty, inputs))}; interp "
                  f"{' '.join(f'{interp_ratio(v, x):.3f}' for x, (v, _) in zip(duty, inputs))}")
    if args.exo:
        rng = np.random.default_rng(0)
        for label, with_exo in (("cpu reading", False), ("cpu + mem, mpki, net, disk", True)):
            ratios = []
            for util, exo in alibaba_raw().values():
                share = np.maximum(1 - util / 100, 0.05)
                v = 1000 * share * np.exp(rng.normal(0, 0.05, len(util)))
                extra = np.column_stack([1 - share] + ([exo] if with_exo else []))
                ratios.append(ratio_to_ema(v, extra))
            print(f"alibaba raw samples, inputs {label}: ARX / EMA mean {np.mean(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
