"""Sync-Switch's offline timing policy for recurring jobs: the binary search of Sync-Switch
§IV-B1, Algorithm 1 (Appendix B), driving a ``run_trial(fraction, seed) -> TrialResult``
callback. ``fraction``: share of the workload trained with BSP before switching to ASP.

Algorithm 1: if the target accuracy A is not given, train with BSP R times and take the
mean converged accuracy. Then, from upper = 1, lower = 0, for M settings: try
s = (upper + lower) / 2 R times; if the mean converged accuracy is acceptable,
upper = s (switch earlier), else lower = s. The answer is ``upper``: the earliest
switch point found acceptable (1.0, i.e. BSP only, if none was).

Beyond the paper (``ends=True``, the default): Algorithm 1 never answers ASP only, and it
answers a switch even where BSP alone trains as fast (with BSP's rounds on the PS, it
often does) or where the switch's restart costs more than ASP saves. So ASP only (fraction
0) is also tried R times, and the answer is whichever acceptable plan trained fastest on
the mean of its trials: ASP only, the switch point found, or BSP only (when the BSP runs
that set the target were made). ``SearchResult.searched`` keeps Algorithm 1's answer and
``times`` every candidate's mean training time.

Deviations from the printed pseudo-code, each switchable for reproduction:
- the printed accumulator alpha' is never reset, so from the second setting on the
  "mean" alpha'/R adds every earlier setting's accuracies. We reset it per setting
  (``paper_accumulation=True`` restores the flaw).
- acceptance: the pseudo-code accepts mean in [A - beta, A + beta], which rejects a
  switch point *better* than BSP by more than beta; §IV-B1 asks for accuracy "similar"
  to BSP's. Default ``accept="at_least"``: mean >= A - beta; ``"interval"`` is literal.

Trials are kept in a store keyed by (signature, fraction, run), so a search interrupted
by a failure resumes where it stopped; run r of every setting uses seed ``seed + r``.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
from dataclasses import dataclass
from typing import Callable

from ..base.exits import BadInput
from .trials import MemoryTrials, TrialKey, TrialResult

logger = logging.getLogger(__name__)

ACCEPT_RULES = ("at_least", "interval")


class SettingsError(BadInput, ValueError):
    """A search setting out of its range (exit 2: `tfsync search`'s options)."""


@dataclass(frozen=True)
class SearchSettings:
    beta: float = 0.01  # accuracy margin (§VI-C1 uses 0.01)
    settings: int = 4  # M: switch points tried
    runs: int = 3  # R: trials per switch point (and BSP runs when no target)
    target: float | None = None  # A; None: measured from R BSP runs
    accept: str = "at_least"
    paper_accumulation: bool = False  # True: the printed, never-reset accumulator
    seed: int = 0
    ends: bool = True  # also try ASP only; answer the fastest acceptable plan (module doc)

    def __post_init__(self):
        if not self.beta >= 0:
            raise SettingsError(f"beta = {self.beta!r}: must be >= 0 (an accuracy margin, e.g. 0.01)")
        if int(self.settings) < 1 or int(self.runs) < 1:
            raise SettingsError(f"settings = {self.settings!r}, runs = {self.runs!r}: both must be >= 1")
        if self.accept not in ACCEPT_RULES:
            raise SettingsError(f"accept = {self.accept!r}: must be one of {', '.join(ACCEPT_RULES)}")


@dataclass(frozen=True)
class Setting:
    fraction: float
    accuracies: tuple[float, ...]
    score: float  # the mean compared with the target (alpha' / R)
    accepted: bool


@dataclass(frozen=True)
class SearchResult:
    fraction: float  # the switch point found (upper)
    target: float
    bsp: tuple[float, ...]  # accuracies of the BSP runs that set the target (empty if given)
    settings: tuple[Setting, ...]
    trials_run: int  # run_trial calls made by this search
    trials_reused: int  # found in the store
    time: float  # summed time of every trial the search used (its cost)
    searched: float | None = None  # Algorithm 1's answer (``fraction`` unless ``ends`` chose an end)
    times: dict = dataclasses.field(default_factory=dict)  # acceptable fraction -> mean trial time (``ends``)


def binary_search(run_trial: Callable[[float, int], TrialResult], signature: str,
                  settings: SearchSettings = SearchSettings(), store=None,
                  progress: Callable[[dict], None] | None = None) -> SearchResult:
    """Algorithm 1 of Sync-Switch (Appendix B) with the fixes above; see the module doc."""
    store = store if store is not None else MemoryTrials()
    counts = {"run": 0, "reused": 0, "time": 0.0}

    def trial(fraction: float, r: int) -> TrialResult:
        key = TrialKey(signature, fraction, r)
        result = store.get(key)
        reused = result is not None
        if not reused:
            result = run_trial(key.fraction, settings.seed + r)
            if not isinstance(result, TrialResult):
                raise TypeError(f"run_trial({key.fraction}, {settings.seed + r}) returned {result!r}; "
                                "expected a TrialResult(converged_accuracy, time)")
            store.put(key, result)
        counts["reused" if reused else "run"] += 1
        counts["time"] += result.time
        logger.debug("trial fraction %.6g run %d: accuracy %.4f, %.1f s%s", key.fraction, r,
                     result.converged_accuracy, result.time, " (stored)" if reused else "")
        if progress is not None:
            progress({"fraction": key.fraction, "run": r, "result": result, "reused": reused,
                      "trials": counts["run"] + counts["reused"]})
        return result

    R = int(settings.runs)
    bsp: tuple[float, ...] = ()
    times: dict[float, list[float]] = {}   # fraction -> its trials' times

    def trials(fraction: float) -> tuple[float, ...]:
        results = [trial(fraction, r) for r in range(R)]
        times[fraction] = [t.time for t in results]
        return tuple(t.converged_accuracy for t in results)

    if settings.target is None:  # Algorithm 1 lines 2-5
        bsp = trials(1.0)
        target = statistics.fmean(bsp)
    else:
        target = float(settings.target)
    upper, lower, alpha = 1.0, 0.0, 0.0
    tried = []
    for _ in range(int(settings.settings)):  # lines 7-22
        s = (upper + lower) / 2.0
        if not settings.paper_accumulation:
            alpha = 0.0  # the fix: the printed algorithm never resets alpha' between settings
        accs = trials(s)
        alpha += sum(accs)
        score = alpha / R
        ok = acceptable(score, target, settings)
        tried.append(Setting(s, accs, score, ok))
        logger.debug("switch at %.6g: mean accuracy %.4f vs target %.4f -> %s", s, score, target,
                     "accept" if ok else "reject")
        if ok:
            upper = s
        else:
            lower = s
    answer, candidates = upper, {}
    if settings.ends:
        asp = trials(0.0)
        tried.append(Setting(0.0, asp, statistics.fmean(asp), acceptable(statistics.fmean(asp), target, settings)))
        candidates = {s.fraction: statistics.fmean(times[s.fraction]) for s in tried if s.accepted
                      and s.fraction in (0.0, upper)}
        if bsp:
            candidates[1.0] = statistics.fmean(times[1.0])
        if candidates:
            answer = min(candidates, key=lambda f: (candidates[f], -f))   # a tie: the more BSP
    logger.info("switch-point search for %s: BSP for %.4g of the workload (target %.4f, %d trials run, "
                "%d reused)", signature, answer, target, counts["run"], counts["reused"])
    return SearchResult(answer, target, bsp, tuple(tried), counts["run"], counts["reused"], counts["time"],
                        upper, candidates)


def acceptable(score: float, target: float, settings: SearchSettings) -> bool:
    """Whether a setting's mean score is acceptable (``settings.accept``)."""
    ok = score >= target - settings.beta
    return ok and score <= target + settings.beta if settings.accept == "interval" else ok
