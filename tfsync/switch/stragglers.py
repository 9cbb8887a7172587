"""Transient-straggler detection (Sync-Switch §IV-B2).

"A worker k is identified as a straggler if its training throughput over a sliding window
S_k is lower than the difference between the cluster average and standard deviation
S - sigma, for a number of consecutive detection windows." We add the symmetric exit
rule: a straggler recovers after ``k`` consecutive windows at or above the threshold.

Throughput of a worker in a window: the samples of its pushes that *ended* in the window
divided by the time those steps took, i.e. samples per busy second. Under BSP every
worker pushes once per round, so samples per wall second are equal for all and cannot
show a straggler; per-busy-second throughput can. A step's time, for a ``Push``, is its
``turnaround`` on the coordinator's clock: from when it could start (granted, and the
worker's previous push in) to its arrival. A worker that is slow to *begin* its steps (paused or preempted
before it reads its token, or behind a slow link) is slow there, where ``end - start``,
taken on the worker after its gate opened, misses it (seen: a worker paused to a fifth of
its speed went undetected on a loaded machine, its short steps fitting between pauses).
Other records (``metrics.jsonl`` dicts) use ``end - start``; records without a start
time fall back to samples per window second.

Two guards, both documented deviations:
- ``min_drop``: a worker must also be at least this fraction below the mean
  (threshold = mean - max(sigma, min_drop * mean)). On a steady cluster about 16 % of
  workers sit below mean - sigma in any window by chance alone; without a floor
  ``k`` consecutive windows happen regularly. ``min_drop=0`` is the paper's rule.
- a window is judged only when at least ``min_workers`` workers pushed in it; a worker
  with no push in a window keeps its counters (neither straggling nor recovered).

Windows are fixed, back to back, of ``window_s`` seconds from ``origin`` (default: the
first time seen); a window is
closed once a record ends ``lag_s`` after it (or ``advance(now)`` passes it), so records
that arrive slightly out of order still count. Records of a closed window are ignored.

State (``save_state``): the window grid (origin, the open window), what the open windows
have accumulated, each worker's consecutive-window counters, the stragglers and the
events; not the closed windows' rates (``windows``), a record of this process only.
``shift(seconds)`` moves the grid after a restore (tfsync.base.plainstate.Rebase).
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..base import plainstate
from ..policy.base import Push

logger = logging.getLogger(__name__)

BECAME = "became"
RECOVERED = "recovered"


@dataclass(frozen=True)
class StragglerEvent:
    time: float  # end of the window that decided it
    worker: int
    kind: str  # BECAME or RECOVERED


@dataclass(frozen=True)
class Sample:
    """One push as the detector needs it."""

    worker: int
    end: float
    samples: int
    busy: float | None  # seconds the step took; None when the record has no start time


def as_sample(record) -> Sample:
    """A :class:`Sample` from a :class:`Push` or a ``metrics.jsonl`` dict
    (keys ``worker``, ``end`` or ``time``, ``batch_size`` or ``samples``, optional
    ``start`` / ``compute_s``). Note: in metrics.jsonl ``samples`` is the run's running
    total, so ``batch_size`` is preferred when both are present."""
    if isinstance(record, Push):
        return Sample(record.worker, record.end, record.batch_size, record.turnaround)
    if not isinstance(record, Mapping):
        raise TypeError(f"straggler record {record!r}: expected a Push or a dict with keys "
                        "worker, end (or time), batch_size (or samples)")
    try:
        worker = int(record["worker"])
        end = float(record["end"] if "end" in record else record["time"])
        samples = int(record["batch_size"] if "batch_size" in record else record["samples"])
    except KeyError as e:
        raise ValueError(f"straggler record is missing key {e.args[0]!r} (has {sorted(record)}); "
                         "expected worker, end or time, batch_size or samples") from None
    busy = record.get("compute_s")
    if busy is None and "start" in record and "end" in record:
        busy = float(record["end"]) - float(record["start"])
    return Sample(worker, end, samples, None if busy is None else max(float(busy), 0.0))


def too_few_to_detect(policy: str, workers: int, needed: int) -> str:
    """The warning for a straggler policy run with fewer workers than detection needs."""
    return (f"{policy} with {workers} workers: straggler detection compares a worker with the others' mean and "
            f"spread and needs >= {needed} workers; no straggler is found until the job has them")


class StragglerDetector:
    """``StragglerDetector(window_s=10, k=3)``; feed it with ``observe(record)`` (returns
    the events that closing windows produced) and ``advance(now)``; read ``stragglers``
    and ``events``."""

    def __init__(self, window_s: float, k: int = 3, *, min_drop: float = 0.1, min_workers: int = 3,
                 origin: float | None = None, lag_s: float = 0.0):
        if not window_s > 0:
            raise ValueError(f"window_s = {window_s!r}: must be > 0 seconds; pick a few step times")
        if int(k) < 1:
            raise ValueError(f"k = {k!r}: must be an integer >= 1 (consecutive windows)")
        if not 0.0 <= min_drop < 1.0:
            raise ValueError(f"min_drop = {min_drop!r}: must be in [0, 1); 0 is the paper's rule")
        if int(min_workers) < 2:
            raise ValueError(f"min_workers = {min_workers!r}: must be >= 2 (a standard deviation needs two)")
        self.window_s, self.k, self.min_drop = float(window_s), int(k), float(min_drop)
        self.min_workers, self.lag_s = int(min_workers), float(lag_s)
        # None: the first time seen (a push's end or advance's now); the engine's clock is
        # epoch seconds, from which windows back to 0 would be billions
        self.origin = None if origin is None else float(origin)
        self.events: list[StragglerEvent] = []
        self.windows: list[tuple[float, dict[int, float]]] = []  # (window end, throughput per worker)
        self._index = 0  # the open window
        self._acc: dict[int, dict[int, list[float]]] = {}  # window -> worker -> [samples, busy]
        self._bad: dict[int, int] = {}  # consecutive windows below threshold, per worker
        self._good: dict[int, int] = {}  # consecutive windows at or above, per straggler
        self._stragglers: set[int] = set()

    @property
    def stragglers(self) -> frozenset[int]:
        return frozenset(self._stragglers)

    def window_of(self, t: float) -> int:
        if self.origin is None:
            self.origin = float(t)
        return max(int(math.floor((t - self.origin) / self.window_s)), 0)

    def window_end(self, index: int) -> float:
        return (self.origin or 0.0) + (index + 1) * self.window_s

    def next_close(self) -> float:
        """The time at which the open window closes."""
        return self.window_end(self._index) + self.lag_s

    def observe(self, record) -> list[StragglerEvent]:
        s = as_sample(record)
        events = self.advance(s.end)
        i = self.window_of(s.end)
        if i < self._index:
            logger.debug("straggler record of worker %d at %.3f is late for closed window %d", s.worker, s.end, i)
            return events
        acc = self._acc.setdefault(i, {}).setdefault(s.worker, [0.0, 0.0, 0.0])
        acc[0] += s.samples
        if s.busy is not None:
            acc[1] += s.busy
        else:
            acc[2] = 1.0  # no busy time: fall back to samples per window second
        return events

    def observe_all(self, records: Iterable) -> list[StragglerEvent]:
        out = []
        for r in records:
            out += self.observe(r)
        return out

    def advance(self, now: float) -> list[StragglerEvent]:
        """Close every window that ended ``lag_s`` or more before ``now``."""
        out = []
        if self.origin is None:
            self.origin = float(now)
        while self.next_close() <= now:
            out += self._close(self._index)
            self._index += 1
        return out

    def forget(self, worker: int) -> None:
        """Drop a worker's counters and straggler mark (e.g. when it is readmitted)."""
        self._bad.pop(worker, None)
        self._good.pop(worker, None)
        self._stragglers.discard(worker)

    def resize(self, workers: int) -> None:
        """The job now has ``workers`` workers: workers >= ``workers`` leave the open
        windows, the counters and the straggler marks (the events, a record, stay). A new
        worker starts as a worker never seen: no counts, not a straggler."""
        self._acc = {i: {w: a for w, a in per.items() if w < workers} for i, per in self._acc.items()}
        for d in (self._bad, self._good):
            for w in [w for w in d if w >= workers]:
                del d[w]
        self._stragglers = {w for w in self._stragglers if w < workers}

    # -- state ----------------------------------------------------------------------------
    def save_state(self) -> dict:
        acc = plainstate.str_keys(self._acc, lambda per: plainstate.str_keys(per, list))
        return {"window_s": self.window_s, "origin": self.origin, "index": self._index, "open": acc,
                "bad": plainstate.str_keys(self._bad), "good": plainstate.str_keys(self._good),
                "stragglers": sorted(self._stragglers),
                "events": [[e.time, e.worker, e.kind] for e in self.events]}

    def load_state(self, state: dict) -> plainstate.Apply:
        """Check ``save_state``'s dict; return what applies it, changing nothing before."""
        if state.get("window_s") != self.window_s:
            raise ValueError(f"the straggler detector's saved windows are of {state.get('window_s')!r} s, "
                             f"this one's of {self.window_s} s")
        try:
            origin = state["origin"]
            acc = {int(i): plainstate.int_keys(per, lambda a: [float(x) for x in a])
                   for i, per in state["open"].items()}
            if any(len(a) != 3 for per in acc.values() for a in per.values()):
                raise ValueError("an open window's sums are not [samples, busy, no-busy flag]")
            values = dict(origin=None if origin is None else float(origin), _index=int(state["index"]), _acc=acc,
                          _bad=plainstate.int_keys(state["bad"], int), _good=plainstate.int_keys(state["good"], int),
                          _stragglers={int(w) for w in state["stragglers"]},
                          events=[StragglerEvent(float(t), int(w), str(k)) for t, w, k in state["events"]])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"the straggler detector's saved state is malformed ({type(e).__name__}: {e})") from None
        return lambda: self.__dict__.update(values)

    def restore_state(self, state: dict) -> None:
        self.load_state(state)()

    def shift(self, seconds: float) -> None:
        """Move the window grid ``seconds`` later (the time a restored job was down)."""
        if self.origin is not None:
            self.origin += seconds

    def _close(self, index: int) -> list[StragglerEvent]:
        per = self._acc.pop(index, {})
        rates = {w: (a[0] / a[1] if a[1] > 0 and not a[2] else a[0] / self.window_s) for w, a in per.items()}
        end = self.window_end(index)
        self.windows.append((end, rates))
        if len(rates) < self.min_workers:
            return []
        values = list(rates.values())
        mean = statistics.fmean(values)
        threshold = mean - max(statistics.pstdev(values), self.min_drop * mean)  # §IV-B2: S - sigma
        out = []
        for w, rate in sorted(rates.items()):
            if rate < threshold:
                self._good[w] = 0
                self._bad[w] = self._bad.get(w, 0) + 1
                if w not in self._stragglers and self._bad[w] >= self.k:
                    self._stragglers.add(w)
                    out.append(StragglerEvent(end, w, BECAME))
            else:
                self._bad[w] = 0
                if w in self._stragglers:
                    self._good[w] = self._good.get(w, 0) + 1
                    if self._good[w] >= self.k:
                        self._stragglers.discard(w)
                        self._good[w] = 0
                        out.append(StragglerEvent(end, w, RECOVERED))
        for e in out:
            logger.debug("window ending %.3f: worker %d %s a straggler (threshold %.3f, mean %.3f)",
                         e.time, e.worker, "became" if e.kind == BECAME else "is no longer", threshold, mean)
        self.events += out
        return out


def detect(records: Iterable, window_s: float, k: int = 3, **options) -> list[StragglerEvent]:
    """Every straggler event in a finished run's records (pushes or metrics.jsonl dicts)."""
    records = list(records)
    d = StragglerDetector(window_s, k, **options)
    d.observe_all(records)
    if records:
        d.advance(max(as_sample(r).end for r in records) + d.window_s + d.lag_s)
    return d.events
