"""The learned synchronization policy, RLP (§3.2), and the static policies in
its three-action form (RLP §3.1), which pre-train it.

After every push the policy picks one of three actions (§3.2 "Action"):
``NONE`` (idle workers stay idle), ``SUBMITTER`` (the worker that pushed runs on) or
``ALL`` (every idle worker runs). Pushes are applied on arrival (Algorithm 1 line 6),
and a worker is granted one step at a time, so "idle" means exactly what it does in
the paper.

State (§3.2 "State"): the last H = 10 tuples T_n = (n, L(w), L(w') - L(w), l_n), zero
padded at the start. ``l_n`` is the number of updates other workers applied while the
submitter's step ran (``Push.pushes_during``). The loss L is estimated from the pushed
minibatch losses (an exponential moving average): the engine cannot afford a
global-model evaluation per push, and a policy must see the same features in the
simulator it is trained in and on the cluster it runs on. Features are scaled to
order 1 (n / 1000, 10 * dL, l_n / 10).

Reward (§3.2 "Reward"): -dt, the time between consecutive pushes.

One fix to the framework: ``NONE`` with no step running anywhere would stall the
cluster for ever; it then acts as ``ALL`` (and is counted in ``stats()``).

State (``save_state``): the tracker's last H rows and loss estimate, the previous
decision (for the next transition's reward; its time is shifted by the time a restored
job was down, tfsync.base.plainstate.Rebase) and the action counts. The network is not in it:
RLP does not learn while it runs (training agents, tfsync.rl, learn from ``observer``), and
the job file names its model again.

The decision network is an :class:`Agent`; this module only needs ``act``. Training
agents (``tfsync.rl``) also ``observe`` transitions. No TensorFlow here: the trained
network is evaluated with NumPy from its saved weights (``QNetwork``).
"""

from __future__ import annotations

import collections
import json
import math
import re
from typing import Callable, Protocol

import numpy as np

from ..base import plainstate
from ..base.exits import BadInput
from . import catalogue
from .actions import ACTIONS, ALL, NONE, SUBMITTER, Teacher
from .base import BatchSizer, ClusterView, Decision, Policy, Push
from .options import Option

__all__ = ["ACTIONS", "ALL", "FEATURES", "HISTORY", "NONE", "RLP", "SUBMITTER", "Agent", "QNetwork",
           "StateTracker", "Teacher", "static_names", "teacher"]

HISTORY = 10  # H
FEATURES = 4  # (n, L, dL, l_n)


class Agent(Protocol):
    def act(self, state: np.ndarray) -> int: ...


class PolicyFileError(BadInput, ValueError):
    """A file that is not a policy of `tfsync policy train`, or not one for this state and these actions."""


class QNetwork:
    """A feed-forward Q-network evaluated in NumPy: ``weights`` = [W1, b1, W2, b2, ...],
    LeakyReLU (slope ``alpha``) after every layer but the last; output = one Q-value
    per action. ``act`` is greedy."""

    def __init__(self, weights, alpha: float = 0.3, meta: dict | None = None):
        self.weights = [np.asarray(w, np.float64) for w in weights]
        self.alpha, self.meta = float(alpha), dict(meta or {})

    def q(self, states: np.ndarray) -> np.ndarray:
        h = np.asarray(states, np.float64)
        last = len(self.weights) - 2
        for k in range(0, len(self.weights), 2):
            h = h @ self.weights[k] + self.weights[k + 1]
            if k < last:
                h = np.where(h > 0, h, self.alpha * h)
        return h

    def act(self, state: np.ndarray) -> int:
        return int(np.argmax(self.q(state[None])[0]))

    def save(self, path: str) -> None:
        arrays = {f"w{i}": w for i, w in enumerate(self.weights)}
        np.savez(path, meta=json.dumps({**self.meta, "alpha": self.alpha}), **arrays)

    @classmethod
    def load(cls, path: str) -> "QNetwork":
        try:
            with np.load(path) as f:
                meta = json.loads(str(f["meta"]))
                weights = [f[f"w{i}"] for i in range(sum(k.startswith("w") for k in f.files))]
        except (OSError, KeyError, ValueError) as e:
            raise PolicyFileError(f"{path}: not a tfsync policy file ({e}); make one with "
                                  "`tfsync policy train`") from None
        if not weights or weights[0].shape[0] != HISTORY * FEATURES or weights[-1].shape[-1] != len(ACTIONS):
            raise PolicyFileError(f"{path}: network shape {[w.shape for w in weights]} does not take "
                                  f"{HISTORY * FEATURES} state features to {len(ACTIONS)} actions")
        return cls(weights, meta.pop("alpha", 0.3), meta)


class StateTracker:
    """Builds S_n from pushes (see the module docstring)."""

    def __init__(self, history: int = HISTORY, loss_ema: float = 0.1):
        self.rows = collections.deque([np.zeros(FEATURES)] * history, maxlen=history)
        self.loss_ema, self.loss = loss_ema, math.nan

    def update(self, push: Push, pushes: int) -> np.ndarray:
        before = self.loss
        if math.isfinite(push.loss):
            self.loss = push.loss if math.isnan(before) else before + self.loss_ema * (push.loss - before)
        if math.isnan(before):
            before = self.loss
        after = self.loss if math.isfinite(self.loss) else 0.0
        before = before if math.isfinite(before) else 0.0
        self.rows.appendleft(np.array([pushes / 1000.0, before, 10.0 * (after - before),
                                       push.pushes_during / 10.0]))
        return self.state()

    def state(self) -> np.ndarray:
        return np.concatenate(self.rows)

    def save_state(self) -> dict:
        return {"rows": [r.tolist() for r in self.rows], "loss": plainstate.num(self.loss)}

    def load_state(self, state: dict) -> plainstate.Apply:
        """Check ``save_state``'s dict; return what applies it, changing nothing before."""
        try:
            rows = [np.asarray(r, dtype=np.float64) for r in state["rows"]]
            loss = plainstate.unnum(state["loss"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"RLP's saved state history is malformed ({type(e).__name__}: {e})") from None
        if len(rows) != self.rows.maxlen or any(r.shape != (FEATURES,) for r in rows):
            raise ValueError(f"RLP's saved state history has {len(rows)} rows of shapes "
                             f"{sorted({r.shape for r in rows})}, this one takes {self.rows.maxlen} of ({FEATURES},)")

        def apply():
            self.rows.clear()
            self.rows.extend(rows)
            self.loss = loss
        return apply


def static_names(staleness=("<s>",)) -> tuple[str, ...]:
    """The names ``teacher`` takes: every catalogue protocol with a three-action form
    (``three_action``), once per ``staleness`` value appended where it takes one."""
    out = []
    for name in catalogue.names():
        spec = catalogue.find(name)
        if spec.cls.three_action is not None:
            out += [f"{name}{s}" for s in staleness] if "staleness" in spec.options else [name]
    return tuple(out)


def teacher(name: str) -> Teacher:
    """A static protocol's three-action form (§3.1) by name: ``"bsp"``, ``"asp"``, or a
    protocol that takes a staleness with it appended (``"ssp2"``)."""
    base, digits = re.fullmatch(r"(.*?)(\d*)", name).groups()
    spec = catalogue.find(base)
    form = spec.cls.three_action if spec is not None else None
    if form is None or bool(digits) != ("staleness" in spec.options):
        raise ValueError(f"unknown static policy {name!r}; expected one of {', '.join(static_names())} "
                         "(<s>: a staleness, such as 2)")
    return form(staleness=int(digits)) if digits else form()


class RLP(Policy):
    """``RLP(agent=QNetwork.load(path))``; or ``RLP(teacher=teacher("ssp2"))`` for a
    static policy in the same action space. ``observer(s, a, r, s2)`` (training) receives
    every transition; ``record`` keeps (state, action, arrival) per push."""

    name = "rlp"
    options = (Option("model", str, required=True, help="the policy file written by `tfsync policy train`"),)

    def __init__(self, agent: Agent | None = None, sizer: BatchSizer | None = None, *,
                 model: str | None = None, teacher: Teacher | None = None,
                 observer: Callable | None = None, record: bool = False, seed: int | None = None):
        super().__init__(sizer, seed)
        if agent is None and model is not None:
            agent = QNetwork.load(model)
        if agent is None and teacher is None:
            raise ValueError("RLP needs a trained network (model=PATH or agent=...) or a teacher")
        self.agent, self.teacher, self.observer, self.model = agent, teacher, observer, model
        if teacher is not None:
            self.name = getattr(teacher, "__name__", "static").replace("_teacher", "")
        self.tracker = StateTracker()
        self.trajectory: list[tuple[np.ndarray, int, float]] | None = [] if record else None
        self._prev = None  # (state, action, arrival) of the last decision
        self.counts = [0, 0, 0]
        self.forced = 0
        self._clock = plainstate.Rebase()

    def _see(self, view: ClusterView) -> None:
        shift = self._clock.seen(view.now)
        if shift and self._prev is not None:
            s, a, t = self._prev
            self._prev = (s, a, t + shift)

    def start(self, view: ClusterView) -> Decision:
        self._see(view)
        return super().start(view)

    def finish(self, view: ClusterView) -> Decision:
        self._see(view)
        return super().finish(view)

    def on_push(self, push: Push, view: ClusterView) -> Decision:
        self._see(view)
        state = self.tracker.update(push, view.pushes)
        if self._prev is not None and self.observer is not None:
            s, a, t = self._prev
            self.observer(s, a, -(push.arrival - t), state)
        action = self.teacher(push, view) if self.teacher else self.agent.act(state)
        self.counts[action] += 1
        self._prev = (state, action, push.arrival)
        if self.trajectory is not None:
            self.trajectory.append(self._prev)
        if action == NONE and view.in_flight == 0:
            self.forced += 1
            action = ALL
        if action == NONE:
            workers = []
        elif action == ALL:
            workers = sorted(view.idle)
        else:
            workers = [push.worker] if push.worker in view.members else []
        return Decision(self.grants_for(workers, view))

    def stats(self) -> dict:
        return {"actions": dict(zip(ACTIONS, self.counts)), "forced_all": self.forced}

    def _save_state(self) -> dict:
        prev = None if self._prev is None else [self._prev[0].tolist(), self._prev[1], self._prev[2]]
        return {"now": self._clock.now, "tracker": self.tracker.save_state(), "previous": prev,
                "counts": list(self.counts), "forced": self.forced}

    def _load_state(self, state: dict, workers: int | None) -> plainstate.Apply:
        what = f"protocol {self.name!r}"
        try:
            tracker = self.tracker.load_state(plainstate.field(state, "tracker", what))
            prev = state.get("previous")
            if prev is not None:
                s, a, t = prev
                prev = (np.asarray(s, dtype=np.float64), int(a), float(t))
                if prev[0].shape != (HISTORY * FEATURES,) or prev[1] not in (NONE, SUBMITTER, ALL):
                    raise ValueError(f"the saved previous decision (state of shape {prev[0].shape}, "
                                     f"action {prev[1]}) does not fit")
            counts = [int(c) for c in state.get("counts", [0, 0, 0])]
            if len(counts) != len(ACTIONS):
                raise ValueError(f"the saved action counts {counts} are not one per action")
            now, forced = state.get("now"), int(state.get("forced", 0))
            now = None if now is None else float(now)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{what}: {e}") from None

        def apply():
            tracker()
            self._prev, self.counts, self.forced = prev, counts, forced
            self._clock.owe(now)
        return apply

    def describe(self) -> dict:
        return {**super().describe(), "model": self.model,
                "teacher": getattr(self.teacher, "__name__", None)}
