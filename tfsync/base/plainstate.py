"""Plain-data state of the decision objects (policies, predictors, detectors) that must
survive a restart: the header every such dict starts with, its checks, and the
conversions to and from JSON's types.

A state dict holds only ints, floats, strings, None, lists and dicts with string keys
(numpy arrays as nested lists; NaN as None), so it is written as strict JSON. Nothing is
pickled: run directories may be shared, and loading a state must never execute code.

Header: ``{<kind>: name, "version": int}``, e.g. ``{"protocol": "lbbsp", "version": 1}``,
plus ``"workers"`` where the state is per worker. ``check`` refuses, with one line, a
state of another name, another format version or another worker count.

Coordinator times (``Rebase``): a policy that keeps absolute times (a straggler's removal
time, a detection window's origin) saves them as they are with the latest time it saw;
after a restore, in another process, its first view's time is later by the time the job
was down. ``Rebase`` shifts the restored times by that gap, so time the job was not
running does not count: a worker removed 80 s before a checkpoint is readmitted 20 s
after the resume, not at once, and the open detection window goes on where it stopped.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

Apply = Callable[[], None]  # what a checked state is applied by (changes nothing until called)


def header(kind: str, name: str, version: int, **extra) -> dict:
    return {kind: name, "version": int(version), **extra}


def check(state, kind: str, name: str, version: int, *, what: str, workers: int | None = None) -> dict:
    """``state`` if its header is ``kind = name`` at ``version`` (and ``workers``, where both
    know it); ValueError with the reason otherwise. ``what`` names the reader in messages."""
    if not isinstance(state, Mapping):
        raise ValueError(f"{what}: a saved state is a dict, got {type(state).__name__}")
    if state.get(kind) != name:
        raise ValueError(f"{what}: the saved state is of {kind} {state.get(kind)!r}, not {name!r}; "
                         "it cannot be restored here")
    if state.get("version") != version:
        raise ValueError(f"{what}: the saved state has format version {state.get('version')!r}, "
                         f"this tfsync reads version {version}")
    saved = state.get("workers")
    if workers is not None and saved is not None and int(saved) != int(workers):
        raise ValueError(f"{what}: the saved state is of {saved} workers, this job has {workers}")
    return dict(state)


def field(state: Mapping, key: str, what: str):
    """``state[key]``; ValueError naming the missing field."""
    try:
        return state[key]
    except KeyError:
        raise ValueError(f"{what}: the saved state has no {key!r} (it has {sorted(state)})") from None


def num(x: float | None) -> float | None:
    """A float for JSON: NaN as None."""
    return None if x is None or math.isnan(x) else float(x)


def unnum(x) -> float:
    """The float ``num`` saved (None: NaN)."""
    return math.nan if x is None else float(x)


def str_keys(d: Mapping, value=lambda v: v) -> dict[str, object]:
    """A dict keyed by ints (workers, windows) with JSON's string keys."""
    return {str(w): value(v) for w, v in sorted(d.items())}


def int_keys(d: Mapping, value=lambda v: v) -> dict[int, object]:
    """The dict ``str_keys`` saved, keys as ints again."""
    return {int(w): value(v) for w, v in d.items()}


class Rebase:
    """The latest coordinator time a policy saw, and the shift owed to the times it
    restored (see the module docstring). Call ``seen(now)`` with every view's time: it
    returns 0.0, except at the first view after ``owe(saved_now)``, where it returns
    ``now - saved_now`` for the policy to add to its restored absolute times."""

    def __init__(self):
        self.now: float | None = None
        self._saved: float | None = None

    def seen(self, now: float) -> float:
        shift = 0.0 if self._saved is None else float(now) - self._saved
        self._saved, self.now = None, float(now)
        return shift

    def owe(self, saved_now: float | None) -> None:
        self._saved = self.now = None if saved_now is None else float(saved_now)
