"""FluentPS synchronization (FluentPS): pull and push conditions (§III-B, Algorithm 1,
Table III), lazy execution of delayed pull requests versus the soft barrier (§III-C),
and probabilistic SSP (PSSP, §III-E) with a constant or a dynamic pause probability.

The paper's server, in our terms: a worker's *pull* after it pushed iteration
``progress`` (0-based; ``push.step - 1``) is the permit for its next step, i.e. a grant.
``V`` (V_train) is the training progress: it advances past iteration i once
``Count[i]`` workers (the push condition's quorum, N by default) have pushed i.
- pull condition: ``progress < V + s``, or, under PSSP, ``rand(0,1) >= P(k)`` with the
  gap ``k = progress - V``; a pull that fails is a delayed pull request (DPR);
- a DPR waits in ``callbacks[progress]`` (lazy: answered once every worker has pushed
  the requester's iteration, so it reads fresh weights) or ``callbacks[V]`` (soft
  barrier: answered as soon as V advances once, possibly with stale weights);
- every push is applied on arrival (Algorithm 1 line 15).
Table III's models are parameter choices: BSP ``s=0``, ASP ``s=None``, SSP ``s`` with
``probability=1``, PSSP ``probability=c`` or ``"dynamic"``, drop-stragglers ``s=0`` with
``quorum=N_t < N`` (late pushes are applied, not dropped, as Algorithm 1 does).

The draw is made at every pull whose gap reached s (Table III: ``rand(0,1) > P`` is part
of each pull's condition). With lazy execution a delayed pull resets its worker's gap to
0, so PSSP(s, c) pauses whenever a worker comes back to gap s: in our simulator it makes
more delayed pulls than SSP(s' = s + 1/c - 1), unlike the paper's Fig. 9; with the soft
barrier it makes fewer, as there (experiments/bench_sim_protocols.py).

Steps whose pull condition already holds whatever the others do (``progress < V + s``;
V never goes back) are granted ahead, up to ``depth`` per worker, so the engine keeps
workers busy without a coordinator round trip. Draws happen only at a real pull.

State (``save_state``): the random stream's position (a restored PSSP draws what the saved
one would have drawn next) and the counters (delayed pulls, draws and pauses by gap,
pushes). V, Count and the waiting pulls are not in it: ``start`` rebuilds V and Count from
the clocks, as after a switch, and a restart leaves no pull waiting.
"""

from __future__ import annotations

import collections
import math
import random

from ..base import plainstate
from .base import NOTHING, BatchSizer, ClusterView, Decision, Policy, Push
from .options import Option

_OPTIONS = (
    Option("staleness", int, lo=0, help="s of the pull condition (None in Python: ASP)"),
    Option("probability", (float, str), lo=0, hi=1, choices=("dynamic",),
           help="pause probability c once a worker is s ahead, or the dynamic P(k)"),
    Option("alpha", float, lo=0, hi=1, lo_open=True, help="the dynamic P(k)'s scale"),
    Option("execution", str, choices=("lazy", "soft"), help="how delayed pulls are answered"),
    Option("quorum", int, lo=1, help="pushes that advance V_train (default: every member)"),
    Option("depth", int, lo=1, help="steps granted ahead per worker"),
    Option("average", bool, help="learning rate / N"),
)


class FluentPS(Policy):
    name = "fluentps"
    options = _OPTIONS

    def __init__(self, staleness: int | None = 3, probability: float | str = 1.0, alpha: float = 1.0,
                 execution: str = "lazy", quorum: int | None = None, depth: int = 2,
                 average: bool = False, sizer: BatchSizer | None = None, seed: int | None = None):
        super().__init__(sizer, seed)
        if staleness is not None and int(staleness) < 0:
            raise ValueError(f"staleness must be >= 0 or None (ASP), got {staleness!r}")
        if probability != "dynamic" and not 0.0 <= float(probability) <= 1.0:
            raise ValueError(f"probability must be in [0, 1] or 'dynamic', got {probability!r}")
        if not 0.0 < float(alpha) <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if execution not in ("lazy", "soft"):
            raise ValueError(f"execution must be 'lazy' or 'soft', got {execution!r}")
        if quorum is not None and int(quorum) < 1:
            raise ValueError(f"quorum must be >= 1, got {quorum!r}")
        if int(depth) < 1:
            raise ValueError(f"depth must be >= 1, got {depth!r}")
        self.staleness = None if staleness is None else int(staleness)
        self.probability = probability if probability == "dynamic" else float(probability)
        self.alpha = float(alpha)
        self.execution = execution
        self.quorum = None if quorum is None else int(quorum)
        self.depth = int(depth)
        self.average = bool(average)
        self.v = 0  # V_train
        self.count: collections.Counter[int] = collections.Counter()
        self.callbacks: dict[int, list[int]] = {}
        self.blocked: set[int] = set()
        self.delayed = 0  # DPRs
        self.draws: collections.Counter[int] = collections.Counter()  # pulls drawn, by gap k
        self.pauses: collections.Counter[int] = collections.Counter()  # of which delayed
        self.released: collections.deque = collections.deque(maxlen=100_000)  # (worker, step)
        self._pushes = 0
        self._n = 1

    # -- the paper's conditions ----------------------------------------------------------
    def pause_probability(self, k: int) -> float:
        """P(k) for a pull whose gap k = progress - V reached s (§III-E1, §III-E2)."""
        if self.probability == "dynamic":
            return self.alpha / (1.0 + math.exp(self.staleness - k))
        return self.probability

    def _sure(self, progress: int) -> bool:
        """The pull condition holds without a draw, now and later (V only grows)."""
        return self.staleness is None or progress < self.v + self.staleness

    # -- events --------------------------------------------------------------------------
    def start(self, view: ClusterView) -> Decision:
        """Begin, or resume after a switch: V and Count are rebuilt from the clocks."""
        self._n = len(view.members)
        self.v = view.min_clock
        self.count = collections.Counter(i for w in view.members for i in range(self.v, view.clocks[w]))
        self.callbacks, self.blocked = {}, set()
        grants = _Grants(self, view)
        for w in sorted(view.members):
            grants.top_up(w)
            if grants.idle(w):
                grants.extend(self._pull(w, view.clocks[w] - 1, view))
        return Decision(grants.list, lr_scale=1.0 / self._n if self.average else None)

    def on_push(self, push: Push, view: ClusterView) -> Decision:
        self._pushes = view.pushes
        self._n = len(view.members)
        progress = push.step - 1
        if progress >= self.v:
            self.count[progress] += 1
        released, v0 = [], self.v
        quorum = self.quorum or self._n
        while self.count[self.v] >= quorum:  # push condition (Alg. 1 l.17-22); `while`, not
            del self.count[self.v]  # `if`: V keeps up when several iterations complete at once
            released += self.callbacks.pop(self.v, [])
            self.v += 1
        grants = _Grants(self, view)
        for w in released:  # the delayed pulls answered now
            self.blocked.discard(w)
            if w in view.members:
                self.released.append((w, view.granted[w] + 1))
                grants.extend(self.grants_for([w], view))
        w = push.worker
        for u in (sorted(view.members) if self.v != v0 else [w] if w in view.members else []):
            grants.top_up(u)  # V moved: every worker may have more sure steps
        if w in view.members and grants.idle(w):  # nothing sure: a real pull
            grants.extend(self._pull(w, progress, view))
        return Decision(grants.list) if grants.list else NOTHING

    def _pull(self, w: int, progress: int, view: ClusterView) -> list:
        """The pull after ``progress``: answer it (a grant) or delay it (a DPR)."""
        if self._sure(progress):
            return list(self.grants_for([w], view))
        k = progress - self.v
        self.draws[k] += 1
        if self.rng.random() >= self.pause_probability(k):
            return list(self.grants_for([w], view))
        self.pauses[k] += 1
        self.delayed += 1
        self.blocked.add(w)
        self.callbacks.setdefault(progress if self.execution == "lazy" else self.v, []).append(w)
        return []

    def on_worker_lost(self, worker: int, view: ClusterView) -> Decision:
        self.blocked.discard(worker)
        for waiting in self.callbacks.values():
            if worker in waiting:
                waiting.remove(worker)
        return NOTHING

    # -- elastic workers -------------------------------------------------------------------
    def _prepare_resize(self, workers: int) -> plainstate.Apply:
        """Workers >= ``workers`` leave the waiting pulls and the record of released ones;
        V and Count are rebuilt from the clocks at ``start``, as after a switch. Prior: a
        new worker has nothing waiting; its pulls start from its clock (the driver's). The
        random stream and the counters by gap go on. Refused where a set ``quorum`` exceeds
        the new count (V_train could never advance)."""
        sizer = super()._prepare_resize(workers)
        if self.quorum is not None and self.quorum > workers:
            raise ValueError(f"protocol {self.name!r} cannot resize to {workers} workers: its quorum is "
                             f"{self.quorum} pushes per iteration, so V_train would never advance; switch "
                             "to a protocol with a smaller quorum first")
        callbacks = {i: [w for w in ws if w < workers] for i, ws in self.callbacks.items()}
        values = dict(callbacks={i: ws for i, ws in callbacks.items() if ws},
                      blocked={w for w in self.blocked if w < workers}, _n=workers,
                      released=collections.deque(((w, s) for w, s in self.released if w < workers),
                                                 maxlen=self.released.maxlen))

        def apply():
            sizer()
            self.__dict__.update(values)
        return apply

    # -- reporting -----------------------------------------------------------------------
    def stats(self) -> dict:
        iterations = self._pushes / max(self._n, 1)
        return {"delayed_pulls": self.delayed, "iterations": iterations,
                "dpr_per_100_iterations": 100.0 * self.delayed / iterations if iterations else 0.0,
                "pull_draws": sum(self.draws.values()), "v_train": self.v}

    def _save_state(self) -> dict:
        version, stream, gauss = self.rng.getstate()
        return {"rng": [version, list(stream), gauss], "delayed": self.delayed, "pushes": self._pushes,
                "draws": plainstate.str_keys(self.draws),
                "pauses": plainstate.str_keys(self.pauses)}

    def _load_state(self, state: dict, workers: int | None) -> plainstate.Apply:
        rng = random.Random()
        try:
            version, stream, gauss = plainstate.field(state, "rng", self.name)
            rng.setstate((int(version), tuple(int(x) for x in stream), None if gauss is None else float(gauss)))
            counters = dict(delayed=int(state.get("delayed", 0)), _pushes=int(state.get("pushes", 0)),
                            draws=collections.Counter(plainstate.int_keys(state.get("draws", {}), int)),
                            pauses=collections.Counter(plainstate.int_keys(state.get("pauses", {}), int)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"protocol {self.name!r}: the saved random stream or counters are malformed "
                             f"({type(e).__name__}: {e})") from None

        def apply():
            self.rng.setstate(rng.getstate())
            self.__dict__.update(counters)
        return apply

    def describe(self) -> dict:
        return {**super().describe(), "staleness": self.staleness, "probability": self.probability,
                "alpha": self.alpha, "execution": self.execution, "quorum": self.quorum,
                "depth": self.depth, "average": self.average}


class _Grants:
    """The grants of one decision, with each worker's count including them."""

    def __init__(self, policy: FluentPS, view: ClusterView):
        self.policy, self.view = policy, view
        self.list: list = []
        self.extra: collections.Counter[int] = collections.Counter()

    def extend(self, grants) -> None:
        for g in grants:
            self.list.append(g)
            self.extra[g.worker] += 1

    def granted(self, w: int) -> int:
        return self.view.granted[w] + self.extra[w]

    def idle(self, w: int) -> bool:
        return w not in self.policy.blocked and self.granted(w) == self.view.clocks[w]

    def top_up(self, w: int) -> None:
        """Grant ``w`` the steps whose pull is sure to pass, up to ``depth`` outstanding."""
        p, view = self.policy, self.view
        if w in p.blocked:
            return
        g, n = self.granted(w), 0
        while g + n - view.clocks[w] < p.depth and p._sure(g + n - 1):
            n += 1
        if n:
            self.extend(p.grants_for([w] * n, view))


class PSSP(FluentPS):
    """Probabilistic SSP (FluentPS §III-E): pause with probability c (or dynamic P(k))
    once a worker is s iterations ahead of V_train; lazy execution by default."""

    name = "pssp"
    options = tuple(o for o in _OPTIONS if o.name != "quorum")

    def __init__(self, staleness: int = 3, probability: float | str = 0.5, alpha: float = 1.0,
                 execution: str = "lazy", depth: int = 2, average: bool = False,
                 sizer: BatchSizer | None = None, seed: int | None = None):
        super().__init__(staleness, probability, alpha, execution, None, depth, average, sizer, seed)
