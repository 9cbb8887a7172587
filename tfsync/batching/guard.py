"""LB-BSP's sizes kept only where they pay: the round times they bring, measured, against
the even split's (beyond LB-BSP; issue 54).

LB-BSP's sizes are only as good as its model of a step's time. Where the model is wrong,
the sizes it balances make rounds slower than BSP's even split: a container's CPU quota
lets a step run at full speed until the period's quota is spent and then stops it (a
cliff, not a line), and noise between alike workers looks like speed. So the sizes are
tried, not trusted, and tried again from time to time:

- a *trial* starts when the sizes move away from the even split; its *baseline* is the
  round times of the last ``baseline`` rounds at the even split before it, or of as
  many more as span ``WINDOW_S``;
- after ``trial`` rounds at uneven sizes spanning ``WINDOW_S`` (or ``MIN_BASELINE`` of
  them already ``CLEARLY`` slower), their mean round time (the mean: a round's stall is
  what it costs) is compared with the baseline's: at least ``margin`` faster, and faster by
  ``SIGNIFICANCE`` standard errors of the difference of the two means (Welch's), and the
  sizes are kept; faster but within the noise, the trial runs on (up to
  ``MAX_TRIAL_WINDOWS`` seconds, then judged as it stands); else the even split holds for
  ``backoff`` rounds (doubling at each failed check, up to ``max_backoff``; back to
  ``backoff`` after one that paid), and at least ``HOLD_PER_TRIAL`` times as many as the
  check measured (where a second holds many rounds, failed trials then take at most a
  quarter of them), after which the sizes may move again;
- sizes kept are checked again after ``recheck`` rounds (doubling at each check that keeps
  them, up to ``max_recheck``): a *probe* of ``baseline`` rounds at the even split (and
  ``WINDOW_S``), whose mean is compared with the last uneven rounds' as above. What made
  the sizes pay (a slow worker) may have passed, and a trial may have passed by luck;
- sizes kept that then move far from those first granted after the verdict (a worker's
  batch by more than ``DRIFT`` of the even batch) are checked by a probe at once (at most
  one such probe each ``recheck`` rounds): the sizes kept are not the sizes tried.

Why the standard error: with alike workers the uneven sizes LB-BSP proposes are noise,
and on a busy machine the noise between two means of a second of rounds is larger than a
fixed margin (the tiny model on 2 cores kept 18 / 12 / 4 / 30 of 64 at 4 alike workers);
a CPU quota's stalls make it larger still, hence the longer trial where the gain is
promising.

A round's time is its slowest push's ``turnaround`` (all of a round's steps start when it
opens, so the slowest one is the round: on the PS's rounds, from the release to the last
landing). A round counts as even when every push of it ran the even batch. The first
``WARMUP`` rounds are not measured (a cluster's first steps are slow); the sizes leave the
even split only once ``MIN_BASELINE`` even rounds are measured after them (at the start,
and after a resize). ``checks`` keeps every verdict (round count, the sizes' and the even
split's mean seconds and the standard error of their difference, kept or not, trial or
probe) for the policy's stats. Plain numbers; no TensorFlow.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import fmean, stdev
from typing import Mapping, NamedTuple

WARMUP = 5         # first rounds not measured
WINDOW_S = 1.0     # a baseline, a trial or a probe spans at least this long (a slowdown by pauses or a CPU
                   # quota comes and goes within it: a few rounds may all fall between two pauses)
MIN_BASELINE = 3   # even rounds measured before the sizes may leave the even split
CLEARLY = 1.25     # a trial this much slower after MIN_BASELINE rounds ends there
SIGNIFICANCE = 2.0  # standard errors by which the sizes' mean round must beat the even split's
DRIFT = 0.25       # kept sizes that move a batch this share of the even one away are probed
HOLD_PER_TRIAL = 3  # a failed check holds the even split at least this many times its rounds
MAX_TRIAL_WINDOWS = 4  # a trial faster but within the noise runs on up to this many WINDOW_S


class Compared(NamedTuple):
    """The sizes' and the even split's mean round, the standard error of their
    difference, whether the sizes are ``margin`` faster, and whether that by
    ``SIGNIFICANCE`` standard errors too (kept)."""
    sizes_s: float
    even_s: float
    se_s: float
    faster: bool
    kept: bool


class EvenGuard:
    def __init__(self, even: int, trial: int = 8, baseline: int = 6, backoff: int = 16, max_backoff: int = 256,
                 recheck: int = 64, max_recheck: int = 1024, margin: float = 0.03):
        if min(trial, baseline, backoff, recheck) < 1 or max_backoff < backoff or max_recheck < recheck:
            raise ValueError(f"EvenGuard: trial {trial}, baseline {baseline}, backoff {backoff} and recheck "
                             f"{recheck} must be >= 1, max_backoff and max_recheck at least backoff and recheck")
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"EvenGuard: margin {margin} must be in [0, 1)")
        self.even = int(even)
        self.trial, self.baseline, self.backoff, self.max_backoff = trial, baseline, backoff, max_backoff
        self.recheck, self.max_recheck, self.margin = recheck, max_recheck, margin
        self.next_backoff, self.next_recheck = backoff, recheck
        self._open: dict[int, list] = {}             # round -> [pushes seen, slowest turnaround, uneven]
        self.even_rounds: deque[float] = deque(maxlen=256)
        self.uneven_rounds: deque[float] = deque(maxlen=256)
        self.tried: list[float] | None = None        # a trial's round times, while one runs
        self.base: list[float] | None = None         # its baseline's
        self.probe: list[float] | None = None        # a probe's even rounds, while one runs
        self.hold = 0                                # rounds left at the even split
        self.kept_at: int | None = None              # round count when the sizes were last kept
        self.anchor: dict[int, int] | None = None    # the sizes first granted after they were
        self.drift_at = -recheck                     # round count of the last probe for drift
        self.rounds = 0                              # complete rounds seen
        self.checks: list[dict] = []

    def observe(self, round_: int, batch: int, turnaround: float, members: int) -> None:
        """One push of round ``round_``; a round is complete at its ``members``-th push."""
        r = self._open.setdefault(round_, [0, 0.0, False])
        r[0] += 1
        r[1] = max(r[1], turnaround)
        r[2] = r[2] or batch != self.even
        if r[0] < members:
            return
        del self._open[round_]
        for old in [k for k in self._open if k < round_]:   # rounds a lost push never completes
            del self._open[old]
        self._complete(r[1], r[2])

    def _complete(self, seconds: float, uneven: bool) -> None:
        self.rounds += 1
        self.hold = max(0, self.hold - 1)
        if self.rounds <= WARMUP:
            return
        if not uneven:
            self.even_rounds.append(seconds)
            if self.probe is not None:
                self.probe.append(seconds)
                if len(self.probe) >= self.baseline and sum(self.probe) >= WINDOW_S:
                    even, self.probe = self.probe, None
                    if len(self.uneven_rounds) >= MIN_BASELINE:
                        sizes = recent(self.uneven_rounds, self.trial)
                        self._verdict(sizes, self._compare(sizes, even), "probe")
            return
        self.uneven_rounds.append(seconds)
        if self.tried is None:
            return
        self.tried.append(seconds)
        clearly_worse = len(self.tried) >= MIN_BASELINE and fmean(self.tried) > CLEARLY * fmean(self.base)
        if clearly_worse:
            self._verdict(self.tried, self._compare(self.tried, self.base), "trial")
        elif len(self.tried) >= self.trial and sum(self.tried) >= WINDOW_S:
            compared = self._compare(self.tried, self.base)
            if compared.kept or not compared.faster or sum(self.tried) >= MAX_TRIAL_WINDOWS * WINDOW_S:
                self._verdict(self.tried, compared, "trial")

    def _compare(self, sizes: list[float], even: list[float]) -> Compared:
        sizes_s, even_s, se = fmean(sizes), fmean(even), noise(sizes, even)
        faster = even_s - sizes_s >= self.margin * even_s
        return Compared(sizes_s, even_s, se, faster, faster and even_s - sizes_s >= SIGNIFICANCE * se)

    def _verdict(self, sizes: list[float], compared: Compared, kind: str) -> None:
        self.checks.append({"round": self.rounds, "kind": kind, "sizes_s": round(compared.sizes_s, 5),
                            "even_s": round(compared.even_s, 5), "se_s": round(compared.se_s, 5),
                            "kept": compared.kept})
        self.anchor = None
        if compared.kept:
            self.next_backoff, self.kept_at = self.backoff, self.rounds
            if kind == "probe":
                self.next_recheck = min(2 * self.next_recheck, self.max_recheck)
        else:
            self.hold = max(self.next_backoff, HOLD_PER_TRIAL * len(sizes))
            self.next_backoff = min(2 * self.next_backoff, self.max_backoff)
            self.kept_at, self.next_recheck = None, self.recheck
        self.tried = self.base = None

    def allow(self, current: Mapping[int, int] | None, proposed: Mapping[int, int]) -> dict[int, int]:
        """``proposed``, or the even split while a failed check's hold or a probe lasts;
        starts a trial when the sizes leave the even split, a probe when kept sizes are due
        for a check."""
        even = {w: self.even for w in proposed}
        proposed = dict(proposed)
        if self.hold > 0 or self.probe is not None:
            return even
        if proposed == even:   # back to the even split: a trial in progress is moot
            self.tried = self.base = None
            return proposed
        if len(self.even_rounds) < MIN_BASELINE:   # nothing to check the sizes against yet
            return even
        if self.kept_at is not None:
            if self.anchor is None:
                self.anchor = proposed
            drifted = max(abs(v - self.anchor.get(w, self.even)) for w, v in proposed.items()) > DRIFT * self.even
            if drifted and self.rounds - self.drift_at >= self.recheck:
                self.drift_at = self.rounds
            elif self.rounds - self.kept_at < self.next_recheck:
                return proposed
            self.kept_at, self.probe = self.rounds, []   # (the probe's verdict sets them again)
            return even
        was_even = current is None or all(v == self.even for v in current.values())
        if was_even and self.tried is None:
            self.tried, self.base = [], recent(self.even_rounds, self.baseline)
        return proposed

    def reset(self) -> None:
        """Another worker count: nothing measured applies."""
        self._open.clear()
        self.even_rounds.clear()
        self.uneven_rounds.clear()
        self.tried = self.base = self.kept_at = self.anchor = None
        self.hold, self.probe, self.drift_at = 0, None, -self.recheck

    def save_state(self) -> dict:
        """What it measured and decided, for a restart of the same worker count."""
        return {"even_rounds": list(self.even_rounds), "uneven_rounds": list(self.uneven_rounds),
                "tried": self.tried, "base": self.base, "probe": self.probe, "hold": self.hold,
                "kept_at": self.kept_at, "next_backoff": self.next_backoff, "next_recheck": self.next_recheck,
                "rounds": self.rounds, "checks": list(self.checks), "drift_at": self.drift_at,
                "anchor": None if self.anchor is None else [[w, v] for w, v in self.anchor.items()]}

    def load_state(self, state: dict) -> None:
        number = (lambda v, kind=float: None if v is None else kind(v))
        self.even_rounds.clear()
        self.even_rounds.extend(float(v) for v in state.get("even_rounds", []))
        self.uneven_rounds.clear()
        self.uneven_rounds.extend(float(v) for v in state.get("uneven_rounds", []))
        numbers = (lambda v: None if v is None else [float(x) for x in (v if isinstance(v, list) else [v])])
        self.tried, self.base = numbers(state.get("tried")), numbers(state.get("base"))   # (a mean before 2026-11-30)
        self.kept_at = number(state.get("kept_at"), int)
        anchor = state.get("anchor")
        self.anchor = None if anchor is None else {int(w): int(v) for w, v in anchor}
        self.drift_at = int(state.get("drift_at", -self.recheck))
        probe = state.get("probe")
        self.probe = [float(v) for v in probe] if isinstance(probe, list) else None
        self.hold = int(state.get("hold", 0))
        self.next_backoff = int(state.get("next_backoff", self.backoff))
        self.next_recheck = int(state.get("next_recheck", self.recheck))
        self.rounds, self.checks = int(state.get("rounds", 0)), list(state.get("checks", []))
        self._open.clear()

    def fresh(self) -> "EvenGuard":
        """A guard of the same settings that has measured nothing."""
        return EvenGuard(self.even, **self.describe())

    def describe(self) -> dict:
        return {"trial": self.trial, "baseline": self.baseline, "backoff": self.backoff,
                "max_backoff": self.max_backoff, "recheck": self.recheck, "max_recheck": self.max_recheck,
                "margin": self.margin}


def noise(a, b) -> float:
    """The standard error of the difference of ``a``'s and ``b``'s means (Welch's; a list
    of fewer than two adds none)."""
    return math.sqrt(sum(stdev(v) ** 2 / len(v) for v in (a, b) if len(v) > 1))


def recent(rounds, count: int) -> list[float]:
    """The last rounds of ``rounds``: at least ``count`` of them spanning at least
    ``WINDOW_S`` seconds (all of them where they span less)."""
    out: list[float] = []
    total = 0.0
    for seconds in reversed(rounds):
        out.append(seconds)
        total += seconds
        if len(out) >= count and total >= WINDOW_S:
            break
    return out
