"""The one check of what a command asks of the policies, whichever way it came.

A switch or a set of batch sizes reaches a running job from ``tfsync switch`` /
``tfsync batch-sizes`` (through the manager), from the manager's gRPC API, or from a
``Controller`` of the engine's Python API. The command line and the manager carry it; the
manager answers a bad one at once, and the engine checks again before it acts (a
Controller needs no manager). All three call these functions, so a bad command gets the
same one line wherever it was sent. What depends on the running job (its worker count,
whether its policy sizes its own batches, the input pipeline's largest batch) is checked
by the running policy (``Policy.set_batch_sizes``) and the engine.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from ..base.exits import BadInput, shown
from .base import MAX_LR_SCALE
from .catalogue import find, get, names


class InvalidCommand(BadInput, ValueError):
    """A command that cannot be carried out as given (its own fault, not the job's state):
    the manager answers INVALID_ARGUMENT, the command line exits 2."""

SWITCH_METHODS = ("hot", "restart")
MAX_NAME = 256  # characters of a protocol name
MAX_OPTION = 2.0**53  # an option's magnitude: larger floats are not whole numbers any more


def check_switch(protocol: str, options: Mapping, method: str = "hot", lr_scale: float | None = None) -> dict:
    """``options`` for a switch to ``protocol`` by ``method`` at learning rate x ``lr_scale``
    (None: the configuration policy's), each in its declared type; InvalidCommand naming the
    field that cannot be honoured: the protocol, the method, the factor, an option that
    ``protocol`` does not take, or a value its declaration or constructor refuses."""
    found = find(protocol) if len(str(protocol)) <= MAX_NAME else None
    if found is None or not found.nameable:
        raise InvalidCommand(f"unknown protocol {shown(protocol)}; valid: {', '.join(names())}")
    if method not in SWITCH_METHODS:
        raise InvalidCommand(f"switch method {shown(method)}; expected {' or '.join(SWITCH_METHODS)}")
    if lr_scale is not None and not (math.isfinite(lr_scale) and 0 < lr_scale <= MAX_LR_SCALE):
        raise InvalidCommand(f"lr_scale {lr_scale}; expected a finite number > 0 (and at most {MAX_LR_SCALE:g})")
    for key, value in options.items():
        if key not in found.options:
            raise InvalidCommand(f"protocol {found.name!r} has no option {shown(key)}; options: "
                             + (", ".join(found.options) or "none"))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                not (math.isfinite(value) and abs(value) <= MAX_OPTION):
            raise InvalidCommand(f"protocol {found.name!r}: {key} = {value:.6g}: expected a finite number of magnitude "
                             f"at most {MAX_OPTION:.0f}")
    options = found.check(options)
    try:
        get(found.name, **options)  # what only the constructor knows (options that must agree)
    except TypeError as e:
        raise InvalidCommand(f"protocol {found.name!r}: {e}") from None
    return options


def check_batch_sizes(sizes: Sequence[int], workers: int) -> None:
    """InvalidCommand unless ``sizes`` is one whole number >= 1 per worker."""
    if len(sizes) != workers or min(sizes, default=0) < 1:
        text = str(list(sizes)) if len(sizes) <= 8 else f"[{', '.join(map(str, sizes[:8]))}, ... ({len(sizes)} in all)]"
        raise InvalidCommand(f"batch sizes {text}: expected {workers} integers >= 1, one per worker")


MAX_WORKERS = 1024   # a scale's worker count: more task processes than any one job here starts


def check_workers(workers: int, low: int | None = None, high: int | None = None) -> None:
    """InvalidCommand unless a scale's ``workers`` is a whole number within the job's bounds,
    ``cluster.min_workers`` (``low``; None: 1) and ``cluster.max_workers`` (``high``; None:
    ``MAX_WORKERS``), naming the bound it passes."""
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise InvalidCommand(f"workers = {shown(workers)}: expected a whole number of workers")
    if workers < (low or 1):
        raise InvalidCommand(f"workers = {workers}: below cluster.min_workers = {low}" if low and low > 1 else
                         f"workers = {workers}: a job needs at least 1 worker")
    if workers > (high or MAX_WORKERS):
        raise InvalidCommand(f"workers = {workers}: above cluster.max_workers = {high} (raise it in the job file; "
                         "`tfsync resume` takes it)" if high else
                         f"workers = {workers}: above {MAX_WORKERS}, the most tfsync starts for one job")
