"""A policy's declared options: the constructor arguments a job file (or ``tfsync switch``)
may set, with their types, bounds and choices (``Option``), for the catalogue.

``Option.clean(value)`` returns the value in its declared type or raises
:class:`OptionError` saying what is allowed, e.g. ``must be an integer >= 0``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterable
from ..base.exits import BadInput


class _FromSignature:
    def __repr__(self):
        return "FROM_SIGNATURE"


FROM_SIGNATURE = _FromSignature()  # Option.default: the constructor's default

_NOUNS = {int: "an integer", float: "a number"}


class OptionError(BadInput, ValueError):
    """A value an option does not allow; ``allowed`` says what it does."""

    def __init__(self, value: Any, allowed: str, type_ok: bool):
        got = "" if type_ok else f" (got {type(value).__name__})"
        super().__init__(f"must be {allowed}{got}")
        self.allowed, self.type_ok = allowed, type_ok


@dataclass(frozen=True)
class Option:
    """One option: ``type`` is int, float, bool or str, or a tuple of them (e.g. a number
    or ``"dynamic"``); numbers lie in [lo, hi] (``lo_open``: lo itself excluded); a string
    is one of ``choices`` (a tuple, or a function giving them when asked) or any
    non-empty one. ``default``: the constructor's unless given. ``required``: a job file
    must set it; ``help`` then says what it is."""

    name: str
    type: type | tuple[type, ...]
    default: Any = FROM_SIGNATURE
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple[str, ...] | Callable[[], Iterable[str]] = ()
    required: bool = False
    help: str = ""

    @property
    def kinds(self) -> tuple[type, ...]:
        return self.type if isinstance(self.type, tuple) else (self.type,)

    def names(self) -> tuple[str, ...]:
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def _kind(self, v: Any) -> type | None:
        """The declared type ``v`` is an instance of (bool is not a number here)."""
        for k in self.kinds:
            if k is bool and isinstance(v, bool) or k is str and isinstance(v, str):
                return k
            if k in (int, float) and not isinstance(v, bool) and \
                    isinstance(v, numbers.Integral if k is int else numbers.Real):
                return k
        return None

    def clean(self, v: Any) -> Any:
        kind = self._kind(v)
        if kind is None or not self._in_range(kind, v):
            raise OptionError(v, self.allowed(), kind is not None)
        return kind(v)

    def _in_range(self, kind: type, v: Any) -> bool:
        if kind is str:
            return v in self.names() if self.choices else v != ""
        if kind is bool:
            return True
        try:
            finite = math.isfinite(v)
        except OverflowError:  # an integer too large for a float
            return False
        return finite and (self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)) \
            and (self.hi is None or v <= self.hi)

    def allowed(self) -> str:
        """What the option takes, in words: ``a number in [0, 1] or "dynamic"``."""
        return " or ".join(self._words(k) for k in self.kinds)

    def _words(self, kind: type) -> str:
        if kind is bool:
            return "true or false"
        if kind is str:
            quoted = [f'"{c}"' for c in self.names()]
            if not self.choices:
                return "a non-empty string"
            return quoted[0] if len(quoted) == 1 else "one of " + ", ".join(quoted)
        noun = _NOUNS[kind]
        if self.lo is not None and self.hi is not None:
            return f"{noun} in {'(' if self.lo_open else '['}{self.lo}, {self.hi}]"
        if self.lo is not None:
            return f"{noun} {'>' if self.lo_open else '>='} {self.lo}"
        return f"{noun} <= {self.hi}" if self.hi is not None else noun
