"""LB-BSP's sizes kept only where they pay: the round times they bring, measured, against
the even split's (beyond paper 002; issue 54).

LB-BSP's sizes are only as good as its model of a step's time. Where the model is wrong,
the sizes it balances make rounds slower than BSP's even split: a container's CPU quota
lets a step run at full speed until the period's quota is spent and then stops it (a
cliff, not a line), and noise between alike workers looks like speed. So the sizes are
tried, not trusted:

- a *trial* starts when the sizes move away from the even split; its *baseline* is the
  median round time of the last ``baseline`` rounds at the even split before it;
- after ``trial`` rounds at uneven sizes (or ``MIN_BASELINE`` of them already ``CLEARLY``
  slower), their median round time is compared with the baseline: not slower, and the
  sizes are kept; slower, and the even split holds for
  ``backoff`` rounds (doubling at each failed trial, up to ``max_backoff``; back to
  ``backoff`` after a trial that paid), after which the sizes may move again.

A round's time is its slowest push's ``turnaround`` (all of a round's steps start when it
opens, so the slowest one is the round: on the PS's rounds, from the release to the last
landing). A round counts as even when every push of it ran the even batch. The sizes leave
the even split only once ``MIN_BASELINE`` even rounds are measured (at the start, and after
a resize). ``checks`` keeps every
verdict (round count, the trial's and the baseline's median seconds, kept or not) for the
policy's stats. Plain numbers; no TensorFlow.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Mapping

MIN_BASELINE = 3   # even rounds measured before the sizes may leave the even split
CLEARLY = 1.25     # a trial this much slower after MIN_BASELINE rounds ends there


class EvenGuard:
    def __init__(self, even: int, trial: int = 8, baseline: int = 6, backoff: int = 16, max_backoff: int = 256):
        if min(trial, baseline, backoff) < 1 or max_backoff < backoff:
            raise ValueError(f"EvenGuard: trial {trial}, baseline {baseline}, backoff {backoff} must be >= 1 and "
                             f"max_backoff {max_backoff} >= backoff")
        self.even = int(even)
        self.trial, self.baseline, self.backoff, self.max_backoff = trial, baseline, backoff, max_backoff
        self.next_backoff = backoff
        self._open: dict[int, list] = {}            # round -> [pushes seen, slowest turnaround, uneven]
        self.even_rounds: deque[float] = deque(maxlen=baseline)
        self.tried: list[float] | None = None       # the trial's round times, while one runs
        self.base: float | None = None              # its baseline
        self.hold = 0                               # rounds left at the even split
        self.rounds = 0                             # complete rounds seen
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
        if not uneven:
            self.even_rounds.append(seconds)
            return
        if self.tried is None:
            return
        self.tried.append(seconds)
        tried = statistics.median(self.tried)
        clearly_worse = len(self.tried) >= MIN_BASELINE and tried > CLEARLY * self.base
        if len(self.tried) < self.trial and not clearly_worse:
            return
        kept = tried <= self.base
        self.checks.append({"round": self.rounds, "sizes_s": round(tried, 5), "even_s": round(self.base, 5),
                            "kept": kept})
        if kept:
            self.next_backoff = self.backoff
        else:
            self.hold, self.next_backoff = self.next_backoff, min(2 * self.next_backoff, self.max_backoff)
        self.tried = self.base = None

    def allow(self, current: Mapping[int, int] | None, proposed: Mapping[int, int]) -> dict[int, int]:
        """``proposed``, or the even split while a failed trial's hold lasts; starts a trial
        when the sizes leave the even split."""
        even = {w: self.even for w in proposed}
        proposed = dict(proposed)
        if self.hold > 0:
            return even
        if proposed == even:   # back to the even split: a trial in progress is moot
            self.tried = self.base = None
            return proposed
        if len(self.even_rounds) < MIN_BASELINE:   # nothing to check a trial against yet
            return even
        was_even = current is None or all(v == self.even for v in current.values())
        if was_even and self.tried is None:
            self.tried, self.base = [], statistics.median(self.even_rounds)
        return proposed

    def reset(self) -> None:
        """Another worker count: nothing measured applies."""
        self._open.clear()
        self.even_rounds.clear()
        self.tried = self.base = None
        self.hold = 0

    def save_state(self) -> dict:
        """What it measured and decided, for a restart of the same worker count."""
        return {"even_rounds": list(self.even_rounds), "tried": self.tried, "base": self.base, "hold": self.hold,
                "next_backoff": self.next_backoff, "rounds": self.rounds, "checks": list(self.checks)}

    def load_state(self, state: dict) -> None:
        self.even_rounds.clear()
        self.even_rounds.extend(float(v) for v in state.get("even_rounds", []))
        tried = state.get("tried")
        self.tried = None if tried is None else [float(v) for v in tried]
        self.base = None if state.get("base") is None else float(state["base"])
        self.hold, self.next_backoff = int(state.get("hold", 0)), int(state.get("next_backoff", self.backoff))
        self.rounds, self.checks = int(state.get("rounds", 0)), list(state.get("checks", []))
        self._open.clear()

    def describe(self) -> dict:
        return {"trial": self.trial, "baseline": self.baseline, "backoff": self.backoff,
                "max_backoff": self.max_backoff}
