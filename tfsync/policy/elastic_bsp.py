"""ElasticBSP: a barrier whose time varies, with a different number of
iterations per worker in each superstep.

At every barrier (§II, §III): predict each worker's next R iteration end times from its
recent iteration intervals (measured, as in Fig. 2, between consecutive push
arrivals), find the set Z* with one end time per worker that minimises the spread
max(Z) - min(Z) (ZipLine, §IV Alg. 2; ours is ``barrier_search.zipline_fast``, exact in
O(R n log n)), and let worker p run its j_p steps. Pushes in between are applied on
arrival; each worker's last step of the superstep is aggregated and applied at the
barrier "similarly to BSP" (§II), so every worker restarts from the same weights.

The first superstep runs one step per worker to measure speeds.

State (``save_state``): each worker's recent iteration intervals, so a restored policy
plans its first superstep from them instead of measuring again. The plan in progress and
the interval start times are not in it: ``start`` makes a new superstep from the live clocks.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import numpy as np

from ..base import plainstate
from .barrier_search import SEARCHES
from .base import NOTHING, BatchSizer, ClusterView, Decision, Policy, Push, PushMode
from .options import Option


def predict(now: float, intervals, lookahead: int) -> np.ndarray:
    """The next ``lookahead`` end times of each worker: row p is now + i * interval_p."""
    return now + np.outer(intervals, np.arange(1, lookahead + 1))


class ElasticBSP(Policy):
    name = "elastic_bsp"
    options = (Option("lookahead", int, lo=1, help="predicted iterations R per worker"),
               Option("window", int, lo=1, help="recent iteration intervals a prediction uses"),
               Option("search", str, choices=lambda: tuple(SEARCHES), help="the barrier search"),
               Option("estimator", str, choices=("mean", "median"), help="of the recent intervals"),
               Option("objective", str, choices=("spread", "share"),
                      help="the smallest wait, or wait per unit of superstep"),
               Option("depth", int, lo=1, help="steps granted ahead per worker"))

    def __init__(self, lookahead: int = 15, window: int = 5, search: str = "zipline_fast",
                 estimator: str = "mean", objective: str = "spread", depth: int = 2,
                 sizer: BatchSizer | None = None, seed: int | None = None):
        super().__init__(sizer, seed)
        if int(lookahead) < 1:
            raise ValueError(f"lookahead R must be >= 1, got {lookahead!r}")
        if int(window) < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        if search not in SEARCHES:
            raise ValueError(f"unknown barrier search {search!r}; valid: {', '.join(sorted(SEARCHES))}")
        if objective not in ("spread", "share"):
            raise ValueError(f"objective must be 'spread' or 'share', got {objective!r}")
        if objective == "share" and search != "zipline_fast":
            raise ValueError("objective 'share' needs search 'zipline_fast'")
        if estimator not in ("mean", "median"):
            raise ValueError(f"estimator must be 'mean' or 'median', got {estimator!r}")
        if int(depth) < 1:
            raise ValueError(f"depth must be >= 1, got {depth!r}")
        self.estimator, self.objective = estimator, objective
        self.lookahead, self.window, self.search, self.depth = int(lookahead), int(window), search, int(depth)
        self.intervals: dict[int, collections.deque] = {}
        self.last_end: dict[int, float] = {}
        self.target: dict[int, int] = {}  # clock each worker runs to in this superstep
        self.barriers: collections.deque = collections.deque(maxlen=1000)  # recent plans
        self._superstep_ends: list[float] = []
        self.search_seconds = 0.0
        self.workers: int | None = None  # the cluster's size, from the views seen

    # -- prediction and search ------------------------------------------------------------
    def interval(self, w: int) -> float | None:
        """Worker w's predicted iteration interval: the mean of its recent ones (the
        paper), or their median, which one transient straggler step does not move."""
        d = self.intervals.get(w)
        if not d:
            return None
        return float(np.median(d)) if self.estimator == "median" else sum(d) / len(d)

    def plan(self, view: ClusterView) -> dict[int, int]:
        """Steps per worker until the next barrier (ElasticBSP §III: Z* = argmin d_Z)."""
        members = sorted(view.members)
        taus = [self.interval(w) for w in members]
        if any(t is None for t in taus):
            return {w: 1 for w in members}  # measure first
        m = predict(view.now, taus, self.lookahead)
        t0 = time.perf_counter()
        if self.objective == "share":  # wait per unit of superstep (ours, see zipline_fast)
            found = SEARCHES[self.search](m, origin=view.now)
        else:  # the paper: the smallest wait
            found = SEARCHES[self.search](m)
        self.search_seconds += time.perf_counter() - t0
        self.barriers.append({"time": view.now, "workers": members, "intervals": tuple(taus),
                              "steps": found.steps, "spread": found.spread})
        return dict(zip(members, found.steps))

    # -- events --------------------------------------------------------------------------
    def start(self, view: ClusterView) -> Decision:
        self.workers = view.num_workers
        return self._superstep(view, barrier=view.pending > 0)

    def _superstep(self, view: ClusterView, barrier: bool) -> Decision:
        for w in view.members:
            self.last_end[w] = view.now  # intervals restart after the wait at the barrier
        self.target = {w: view.clocks[w] + j for w, j in self.plan(view).items()}
        self._superstep_ends = []
        grants = []
        for w in sorted(view.members):
            grants += self._top_up(w, view)
        return Decision(grants, barrier=barrier)

    def _top_up(self, w: int, view: ClusterView) -> list:
        granted, target = view.granted[w], self.target.get(w, view.clocks[w])
        n = max(0, min(target, view.clocks[w] + self.depth) - granted)
        grants = list(self.grants_for([w] * n, view))
        if grants and granted + n == target:  # the superstep's last step waits for the barrier
            grants[-1] = dataclasses.replace(grants[-1], mode=PushMode.AGGREGATE)
        return grants

    def on_push(self, push: Push, view: ClusterView) -> Decision:
        w = push.worker
        if w in self.last_end:
            self.intervals.setdefault(w, collections.deque(maxlen=self.window)).append(
                push.arrival - self.last_end[w])
        self.last_end[w] = push.arrival
        if w not in view.members:
            return NOTHING
        if view.clocks[w] == self.target.get(w):
            self._superstep_ends.append(push.arrival)
        if view.in_flight == 0 and len(self._superstep_ends) >= len(self.target):
            if self._superstep_ends and self.barriers:
                self.barriers[-1]["wait"] = max(self._superstep_ends) - min(self._superstep_ends)
            return self._superstep(view, barrier=True)
        return Decision(self._top_up(w, view))

    def stats(self) -> dict:
        waits = [b["wait"] for b in self.barriers if "wait" in b]
        spreads = [b["spread"] for b in self.barriers]
        return {"barriers": len(self.barriers), "search_seconds": self.search_seconds,
                "mean_predicted_spread": float(np.mean(spreads)) if spreads else 0.0,
                "mean_barrier_wait": float(np.mean(waits)) if waits else 0.0}

    def _prepare_resize(self, workers: int) -> plainstate.Apply:
        """Workers >= ``workers`` lose their intervals and targets. Prior: a new worker has
        no interval yet, so the first superstep after a grow runs one step per worker to
        measure it (as at the job's start); the kept workers' intervals stay."""
        sizer = super()._prepare_resize(workers)
        kept = (lambda d: {w: v for w, v in d.items() if w < workers})
        values = dict(intervals=kept(self.intervals), last_end=kept(self.last_end), target=kept(self.target),
                      _superstep_ends=[], workers=workers)

        def apply():
            sizer()
            self.__dict__.update(values)
        return apply

    def _save_state(self) -> dict:
        return {"workers": self.workers, "intervals": plainstate.str_keys(self.intervals, list),
                "search_seconds": self.search_seconds}

    def _load_state(self, state: dict, workers: int | None) -> plainstate.Apply:
        saved = plainstate.field(state, "intervals", f"protocol {self.name!r}")
        try:  # a shorter window now keeps the newest intervals
            intervals = plainstate.int_keys(saved, lambda d: collections.deque((float(x) for x in d), maxlen=self.window))
            seconds = float(state.get("search_seconds", 0.0))
        except (TypeError, ValueError) as e:
            raise ValueError(f"protocol {self.name!r}: the saved intervals are malformed ({e})") from None
        values = dict(intervals=intervals, search_seconds=seconds, workers=state.get("workers"))
        return lambda: self.__dict__.update(values)

    def describe(self) -> dict:
        return {**super().describe(), "lookahead": self.lookahead, "window": self.window,
                "search": self.search, "estimator": self.estimator, "objective": self.objective,
                "depth": self.depth}
