"""Offline scoring of speed predictors: one-step-ahead RMSE on a recorded series or on a
CPU trace, with no cluster (``tfsync predict score``; LB-BSP Table 3).

Series CSV (``load_series``): a header line naming ``speed`` (samples/s, required) and
optionally ``cpu`` and ``mem`` (the monitor's readings in percent given with that step,
as LB-BSP gives them: tfsync.sim.monitor; empty = missing), ``worker`` (default 0) and
``step`` (order within a worker; default file order). Other columns are ignored, so
``experiments/bench_predictors.py``'s series files are series too.

Trace (``series_from_trace``): any file ``tfsync.sim.load_cpu_traces`` reads, one worker
per trace. The worker runs a step every ``every`` trace seconds (default the trace's
step) at ``speed * share * exp(N(0, jitter))`` samples/s, share the CPU share the trace
leaves it (``max(1 - util / 100, min_share)``, as ``SpeedModel``) at the step's start.
The reading given with step k is the contention that step ran under (``readings="last"``,
what a real monitor has at push time) or, for studies only, the one step k+1 will run
under (``"next"``, an oracle).

Scoring (``score``): per predictor and worker, a fresh predictor is fed the worker's
steps in order and asked for step k after steps 0..k-1 (``one_step_ahead``); RMSE over
steps k >= ``skip`` (default 500, the learned predictors' warm-up, §4.2), per worker and
pooled (``worker`` = ``all``). Configurations as Table 3: EMA alpha 0.2, ARIMA (2, 2, 1),
NARX / SimpleRNN / LSTM look-back 2, trained inline with the predictor's fixed seed: the
same input gives the same numbers. Output rows (``write_csv``): ``predictor, worker,
steps, rmse, nrmse_pct, mean_speed, ratio_to_ema, fits, fit_s`` (``fit_s``: the seconds
the learned predictors' fits took, inline).
"""

from __future__ import annotations

import csv
import math
import os
import random

import numpy as np

from ..base.exits import BadInput
from ..base.traces import TraceError, number
from . import get
from .trainer import NarxTrainer

NAMES = ("last", "ema", "arima", "narx", "rnn", "lstm")
PAPER = {"ema": {"alpha": 0.2}, "arima": {"order": (2, 2, 1)}}  # Table 3's configurations
LEARNED = ("narx", "rnn", "lstm")
COLUMNS = ["predictor", "worker", "steps", "rmse", "nrmse_pct", "mean_speed", "ratio_to_ema", "fits", "fit_s"]


class SeriesError(TraceError):
    """A series file cannot be scored: one line ``file:line: problem``."""


class ScoreError(BadInput, ValueError):
    """What was asked of the scoring cannot be (exit 2): a predictor's spec or options, a
    series too short for ``skip``, a trace's step settings."""


# -- inputs -------------------------------------------------------------------------------------
def is_series(path: str) -> bool:
    """Whether ``path`` is a series: a header line with a ``speed`` column."""
    with open(path, newline="") as f:
        head = f.readline()
    return "speed" in [c.strip().lower() for c in head.split(",")]


def load_series(path: str) -> dict[int, dict[str, list]]:
    """``{worker: {"speed": [...], "cpu": [...], "mem": [...]}}`` in step order (None
    where a reading is missing); see the module docstring."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        cols = [c.strip().lower() for c in (reader.fieldnames or [])]
        if "speed" not in cols:
            raise SeriesError(path, 1, f"no 'speed' column in the header ({', '.join(cols[:8]) or 'empty'})")
        reader.fieldnames = cols
        rows = []
        for r in reader:
            n = reader.line_num
            speed = _value(path, n, r, "speed", required=True)
            if speed < 0:
                raise SeriesError(path, n, f"speed {speed:g} is negative")
            worker = _value(path, n, r, "worker")
            step = _value(path, n, r, "step")
            rows.append((0 if worker is None else int(worker), step if step is not None else len(rows), len(rows),
                         speed, _value(path, n, r, "cpu"), _value(path, n, r, "mem")))
    if not rows:
        raise SeriesError(path, None, "no rows after the header")
    out: dict[int, dict[str, list]] = {}
    for w, _, _, speed, cpu, mem in sorted(rows):
        d = out.setdefault(w, {"speed": [], "cpu": [], "mem": []})
        d["speed"].append(speed)
        d["cpu"].append(cpu)
        d["mem"].append(mem)
    return out


def _value(path: str, line: int, row: dict, key: str, required: bool = False) -> float | None:
    raw = (row.get(key) or "").strip()
    if raw == "":
        if required:
            raise SeriesError(path, line, f"{key} is empty")
        return None
    return number(path, line, raw, key, SeriesError)


def series_from_trace(trace, *, every: float | None = None, speed: float = 1000.0, jitter: float = 0.05,
                      readings: str = "last", min_share: float = 0.05, steps: int | None = None,
                      seed: int = 0) -> dict[str, list]:
    """One worker's steps under ``trace`` (a ``CpuTrace``); see the module docstring."""
    if readings not in ("last", "next"):
        raise ScoreError(f"readings must be 'last' or 'next', got {readings!r}")
    every = trace.step if every is None else float(every)
    if not every > 0:
        raise ScoreError(f"every must be > 0 trace seconds, got {every!r}")
    n = int(trace.end // every)
    n = min(n, steps + (readings == "next")) if steps else n
    shares = [max(1.0 - trace.at(k * every) / 100.0, min_share) for k in range(n)]
    rng = random.Random(seed)
    speeds = [speed * s * math.exp(rng.gauss(0.0, jitter)) if jitter else speed * s for s in shares]
    contention = [100.0 * (1.0 - s) for s in shares]
    if readings == "next":  # the load the next step runs under: an oracle, not a monitor
        contention = contention[1:] + contention[-1:]
    m = n - 1 if readings == "next" else n
    return {"speed": speeds[:m], "cpu": contention[:m], "mem": [None] * m}


# -- scoring ------------------------------------------------------------------------------------
def parse_spec(text: str) -> tuple[str, dict]:
    """``"narx"`` or ``"narx:units=4:window=300"`` -> (name, options) over Table 3's."""
    name, *opts = text.strip().split(":")
    name = name.strip().lower()
    options = dict(PAPER.get(name, {}))
    for o in opts:
        key, sep, raw = o.partition("=")
        if not sep or not key:
            raise ScoreError(f"predictor {text!r}: options are key=value, got {o!r}")
        options[key.strip()] = _literal(raw.strip())
    return name, options


def _literal(raw: str):
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(raw.lower(), raw)


def make(spec: str, warmup: int | None = None):
    """A fresh predictor for ``spec`` (learned ones train inline, with ``warmup``)."""
    name, options = parse_spec(spec)
    if name in LEARNED:
        options.setdefault("trainer", NarxTrainer(threads=0))
        if warmup is not None:
            options.setdefault("warmup", int(warmup))
    try:
        return get(name, **options)
    except BadInput:
        raise
    except (TypeError, ValueError) as e:  # an option out of range, or of the wrong kind (a number for a tuple)
        raise ScoreError(f"predictor {spec!r}: {e}") from None


def one_step_ahead(predictor, speeds, cpus, mems) -> np.ndarray:
    """Prediction of step k made after steps 0..k-1 (nan for k = 0)."""
    out = [math.nan]
    for k, v in enumerate(speeds):
        if k:
            out.append(predictor.predict())
        predictor.update(v, cpus[k], mems[k])
    return np.array(out)


def rmse_row(label: str, worker, errors: np.ndarray, speeds) -> dict:
    """One output row (``ratio_to_ema``, ``fits`` and ``fit_s`` filled by ``score``)."""
    rmse = float(np.sqrt(np.mean(errors ** 2))) if len(errors) else math.nan
    mean = float(np.mean(speeds)) if len(speeds) else math.nan
    return {"predictor": label, "worker": worker, "steps": int(len(errors)), "rmse": rmse,
            "nrmse_pct": 100 * rmse / mean if mean else math.nan, "mean_speed": mean, "ratio_to_ema": "",
            "fits": "", "fit_s": ""}


def score(series: dict, predictors=NAMES, *, skip: int = 500, warmup: int | None = None,
          progress=None) -> tuple[list[dict], dict]:
    """(rows, predictions): RMSE rows per predictor (per worker, then ``all``) and
    ``{(predictor, worker): predictions}``; see the module docstring."""
    for spec in predictors:
        make(spec, warmup)  # unknown names and options fail before any work
    short = {w: len(d["speed"]) for w, d in series.items() if len(d["speed"]) <= skip}
    if short:
        raise ScoreError(f"worker(s) {sorted(short)} have {min(short.values())} steps or fewer, nothing to "
                         f"score from step {skip}: lower skip or give a longer series")
    rows, preds = [], {}
    for spec in predictors:
        errors, actual, fits, fit_s = [], [], [], []
        for w, d in series.items():
            p = make(spec, warmup)
            pred = one_step_ahead(p, d["speed"], d["cpu"], d["mem"])
            preds[(spec, w)] = pred
            e = (pred - np.array(d["speed"]))[skip:]
            errors.append(e)
            actual += d["speed"][skip:]
            row = rmse_row(spec, w, e, d["speed"][skip:])
            row["fits"] = getattr(p, "fits", "")
            trainer = getattr(p, "trainer", None)
            row["fit_s"] = trainer.seconds if trainer is not None else ""
            fits.append(row["fits"])
            fit_s.append(row["fit_s"])
            rows.append(row)
        pooled = rmse_row(spec, "all", np.concatenate(errors), actual)
        pooled["fits"] = sum(fits) if all(isinstance(f, int) for f in fits) else ""
        pooled["fit_s"] = sum(fit_s) if all(isinstance(f, float) for f in fit_s) else ""
        rows.append(pooled)
        if progress is not None:
            progress(pooled)
    ema = {r["worker"]: r["rmse"] for r in rows if r["predictor"] == "ema"}
    for r in rows:
        if ema.get(r["worker"]):
            r["ratio_to_ema"] = r["rmse"] / ema[r["worker"]]
    return rows, preds


def write_csv(path: str, rows: list[dict]) -> None:
    """``rows`` as CSV (``COLUMNS``), numbers rounded to 6 significant digits."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=COLUMNS)
        out.writeheader()
        for r in rows:
            out.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()})


def plot(path: str, rows: list[dict], preds: dict, series: dict, skip: int, window: int = 300) -> None:
    """Actual vs predicted speeds of the first worker and the pooled RMSE per predictor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    w = min(series)
    speeds = series[w]["speed"]
    lo, hi = skip, min(len(speeds), skip + window)
    x = np.arange(lo, hi)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 7), gridspec_kw={"height_ratios": [3, 2]})
    a1.plot(x, speeds[lo:hi], color="black", lw=1.2, label="actual")
    for spec in dict.fromkeys(r["predictor"] for r in rows):
        a1.plot(x, preds[(spec, w)][lo:hi], lw=1, label=spec)
    a1.set_ylabel("samples/s")
    a1.set_xlabel(f"step of worker {w}")
    a1.legend(loc="upper left", fontsize=8, ncol=4)
    a1.set_title(f"one-step-ahead prediction, worker {w}, steps {lo}-{hi - 1}")
    pooled = [r for r in rows if r["worker"] == "all"]
    a2.barh([r["predictor"] for r in pooled], [r["rmse"] for r in pooled], color="#4878a8")
    a2.invert_yaxis()
    a2.set_xlabel(f"RMSE (samples/s), steps >= {skip}, all workers")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
