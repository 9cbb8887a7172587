"""What the switch-point search costs (Sync-Switch §VI-C1, Table II, Appendix C Tables
IV-VI): replay Algorithm 1 many times on recorded runs, drawing each trial from the runs
recorded at that switch fraction, and report per search setting (recurring job or not,
number of BSP runs to measure the target A, candidate runs R per switch point):

- cost: summed time of every run the search trains, in units of one mean BSP training;
- amortization: cost / (1 - T(s*) / T_BSP), the recurrences whose saving (switching at
  the found s* instead of BSP) pays the search back; the paper's numbers fit this with s*
  the full-information answer (e.g. setup 1: 12.71 / 15.79 = 0.805 = 1 - 0.195);
- effective training: trained sessions / cost (the paper: 25 sessions / 12.71 = 1.97);
- success probability: share of replays that find the same switch point as the search
  on the mean of every recorded run (the paper compares with its baseline setting).

Our reading of the paper's simulation (it does not spell it out): a recurring job knows
A (mean of all recorded BSP runs) and trains no BSP run; runs are drawn without
replacement when enough are recorded, else with replacement; a switch point with no
recorded runs uses the nearest recorded fraction (ties: the larger); runs recorded
without a time get the mean (or median) time of their fraction. ``time_stat="median"``
also makes the cost unit the median BSP time: some recorded wall-clock spans include
pauses (setup 1's bsp_1 took twice as long as its five siblings).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecordedRun:
    fraction: float  # BSP share of the workload (1.0 = BSP only, 0.0 = ASP only)
    accuracy: float  # converged test accuracy
    time: float | None  # seconds; None: unknown (imputed)
    name: str = ""


@dataclass(frozen=True)
class CostRow:
    recurring: bool
    bsp_runs: int
    candidate_runs: int
    settings: int  # M
    cost: float  # x one BSP training
    amortization: float  # recurrences
    effective: float  # sessions per BSP-training of cost
    success: float  # probability
    reference: float  # the full-information switch point
    found: dict  # switch point -> share of replays

    def label(self) -> str:
        return f"({'Yes' if self.recurring else 'No'}, {self.bsp_runs}, {self.candidate_runs})"


class RunBank:
    """Recorded runs grouped by fraction, with times imputed and BSP runs required."""

    def __init__(self, runs: Sequence[RecordedRun], time_stat: str = "mean"):
        if time_stat not in ("mean", "median"):
            raise ValueError(f"time_stat = {time_stat!r}: must be 'mean' or 'median' (robust to paused runs)")
        self.stat = statistics.fmean if time_stat == "mean" else statistics.median
        by: dict[float, list[RecordedRun]] = {}
        for r in runs:
            by.setdefault(round(float(r.fraction), 9), []).append(r)
        if 1.0 not in by:
            raise ValueError(f"no BSP run (fraction 1.0) among the recorded fractions {sorted(by)}; "
                             "the cost unit and the target need BSP runs")
        self.runs: dict[float, tuple[RecordedRun, ...]] = {}
        for f, rs in sorted(by.items()):
            known = [r.time for r in rs if r.time is not None]
            if not known:
                raise ValueError(f"no run at fraction {f} has a time; record at least one")
            fill = self.stat(known)
            self.runs[f] = tuple(r if r.time is not None else RecordedRun(f, r.accuracy, fill, r.name) for r in rs)
        self.fractions = np.array(sorted(self.runs))
        self.bsp_time = self.stat([r.time for r in self.runs[1.0]])  # the cost unit

    def at(self, fraction: float) -> tuple[RecordedRun, ...]:
        d = np.abs(self.fractions - fraction)
        best = np.flatnonzero(d <= d.min() + 1e-12)
        return self.runs[float(self.fractions[best[-1]])]  # ties: the larger fraction

    def mean_accuracy(self, fraction: float) -> float:
        return statistics.fmean(r.accuracy for r in self.at(fraction))

    def mean_time(self, fraction: float) -> float:
        return self.stat([r.time for r in self.at(fraction)])


def _draw(rng: np.random.Generator, runs: tuple[RecordedRun, ...], n: int) -> list[RecordedRun]:
    idx = rng.choice(len(runs), size=n, replace=n > len(runs))
    return [runs[i] for i in idx]


def _bisect(accuracy_of, target: float, beta: float, settings: int) -> tuple[float, list[float]]:
    """Algorithm 1's loop (accumulator reset per setting; accept mean >= A - beta)."""
    upper, lower, tried = 1.0, 0.0, []
    for _ in range(settings):
        s = (upper + lower) / 2.0
        tried.append(s)
        if accuracy_of(s) >= target - beta:
            upper = s
        else:
            lower = s
    return upper, tried


def reference_point(bank: RunBank, settings: int, beta: float = 0.01) -> float:
    """The switch point the search finds on the mean of every recorded run."""
    return _bisect(bank.mean_accuracy, bank.mean_accuracy(1.0), beta, settings)[0]


def simulate_setting(bank: RunBank, *, recurring: bool, bsp_runs: int, candidate_runs: int, settings: int,
                     beta: float = 0.01, sims: int = 1000, seed: int = 0) -> CostRow:
    """Replay the search ``sims`` times for one search setting; see the module doc."""
    if recurring and bsp_runs:
        raise ValueError(f"a recurring job knows its target: bsp_runs must be 0, got {bsp_runs}")
    if not recurring and bsp_runs < 1:
        raise ValueError("a new job needs bsp_runs >= 1 to measure the target accuracy")
    if candidate_runs < 1 or settings < 1 or sims < 1:
        raise ValueError(f"candidate_runs = {candidate_runs}, settings = {settings}, sims = {sims}: all must be >= 1")
    rng = np.random.default_rng(seed)
    reference = reference_point(bank, settings, beta)
    costs, effective, hits, found = [], [], 0, {}
    for _ in range(sims):
        spent, sessions = 0.0, 0
        if recurring:
            target = bank.mean_accuracy(1.0)
        else:
            drawn = _draw(rng, bank.runs[1.0], bsp_runs)
            target = statistics.fmean(r.accuracy for r in drawn)
            spent += sum(r.time for r in drawn)
            sessions += len(drawn)

        def accuracy_of(s: float) -> float:
            nonlocal spent, sessions
            drawn = _draw(rng, bank.at(s), candidate_runs)
            spent += sum(r.time for r in drawn)
            sessions += len(drawn)
            return statistics.fmean(r.accuracy for r in drawn)

        point, _ = _bisect(accuracy_of, target, beta, settings)
        cost = spent / bank.bsp_time
        costs.append(cost)
        effective.append(sessions / cost)
        hits += point == reference
        found[point] = found.get(point, 0) + 1
    cost = statistics.fmean(costs)
    saving = 1.0 - bank.mean_time(reference) / bank.bsp_time
    amortization = cost / saving if saving > 0 else float("inf")
    return CostRow(recurring, bsp_runs, candidate_runs, settings, cost, amortization, statistics.fmean(effective),
                   hits / sims, reference, {k: v / sims for k, v in sorted(found.items())})


# The settings of the paper's Tables IV-VI: (recurring, BSP runs, candidate runs).
PAPER_SETTINGS = ((False, 5, 5), (False, 4, 4), (False, 3, 3), (False, 2, 2), (False, 1, 1), (False, 1, 5),
                  (False, 1, 4), (False, 1, 3), (False, 1, 2), (True, 0, 5), (True, 0, 4), (True, 0, 3),
                  (True, 0, 2), (True, 0, 1))


def cost_table(bank: RunBank, settings: int, rows: Sequence[tuple[bool, int, int]] = PAPER_SETTINGS,
               beta: float = 0.01, sims: int = 1000, seed: int = 0) -> list[CostRow]:
    return [simulate_setting(bank, recurring=rec, bsp_runs=b, candidate_runs=c, settings=settings, beta=beta,
                             sims=sims, seed=seed + i) for i, (rec, b, c) in enumerate(rows)]


def bank_from_results(results: Mapping[tuple[float, int], tuple[float, float]]) -> RunBank:
    """A bank from our own runs: {(fraction, run): (time, converged accuracy)}."""
    return RunBank([RecordedRun(f, acc, t, f"run{r}") for (f, r), (t, acc) in sorted(results.items())])
