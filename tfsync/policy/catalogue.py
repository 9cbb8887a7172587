"""The protocol catalogue: every synchronization policy by name, with its options and
traits, looked up as tf_keras looks up optimizers.

A policy class declares (defaults in :class:`~tfsync.policy.base.Policy`):
- ``name``: what job files, ``tfsync switch --to``, logs and metrics call it;
- ``options``: :class:`~tfsync.policy.options.Option` s, the constructor arguments a job
  file may set, with types, bounds and choices (defaults: the constructor's);
- ``aggregating``: an update averages the members' gradients (the configuration policy
  scales the learning rate by n);
- ``self_sizing``: it makes its own sizer from ``batch_size`` (it takes no ``sizer``);
- ``nameable``: job files and ``tfsync switch --to`` may name it;
- ``max_batch(workers)``: the largest batch an instance can grant.

``register(cls)`` records a class. Job-file validation (``tfsync.job.fields``,
``tfsync.job.rules``), ``tfsync switch`` (choices, help, option conversion), the
configuration policy and RLP's static baselines read the catalogue, so a new protocol is
one module defining its class and calling ``register``.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
from types import MappingProxyType
from typing import Mapping

from ..base.exits import BadInput
from ..base.registry import build, params, split
from .base import BatchSizer, Policy
from .options import FROM_SIGNATURE, Option, OptionError

RESERVED = ("name", "until", "batch_sizes")  # a job file's phase keys that are not options

_classes: dict[str, type[Policy]] = {}
_specs: dict[str, Spec] = {}
CLASSES: Mapping[str, type[Policy]] = MappingProxyType(_classes)  # name -> class (register to add)


@dataclasses.dataclass(frozen=True)
class Spec:
    """A registered protocol: its name, class and options (defaults resolved)."""

    name: str
    cls: type[Policy]
    options: Mapping[str, Option]

    @property
    def aggregating(self) -> bool:
        return bool(self.cls.aggregating)

    @property
    def self_sizing(self) -> bool:
        return bool(self.cls.self_sizing)

    @property
    def nameable(self) -> bool:
        return bool(self.cls.nameable)

    def defaults(self) -> dict:
        """Each option's default; options without one (None) are left out."""
        return {k: o.default for k, o in self.options.items() if o.default is not None}

    def check(self, options: Mapping) -> dict:
        """``options`` with each declared option's plain value (number, boolean, string)
        checked and in its declared type; other values (None, objects) are the
        constructor's to judge."""
        out = dict(options)
        for key, value in options.items():
            opt = self.options.get(key)
            if opt is not None and isinstance(value, (bool, numbers.Number, str)):
                try:
                    out[key] = opt.clean(value)
                except OptionError as e:
                    raise ValueError(f"protocol {self.name!r}: {key} = {value!r}: {e}") from None
        return out


def register(cls, name: str | None = None) -> type:
    """Record ``cls`` under ``name`` (default ``cls.name``); returns ``cls``, so it also
    decorates."""
    name = (name or cls.name).lower()
    takes, options = params(cls), {}
    for opt in cls.options:
        if opt.name in RESERVED or opt.name not in takes:
            raise TypeError(f"{cls.__name__}.options: {opt.name!r} must be an argument of "
                            f"{cls.__name__}() other than {', '.join(RESERVED)}")
        if opt.default is FROM_SIGNATURE:
            opt = dataclasses.replace(opt, default=_default(cls, opt.name))
        if opt.default is not None:
            try:
                opt.clean(opt.default)
            except OptionError as e:
                raise TypeError(f"{cls.__name__}.options: default {opt.name} = {opt.default!r}: {e}") from None
        options[opt.name] = opt
    _classes[name] = cls
    _specs[name] = Spec(name, cls, MappingProxyType(options))
    return cls


def unregister(name: str) -> None:
    """Forget ``name`` (tests, plugins that replace a protocol)."""
    _classes.pop(name, None)
    _specs.pop(name, None)


def _default(cls, param: str):
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        p = inspect.signature(init).parameters.get(param) if init is not None else None
        if p is not None:
            return None if p.default is inspect.Parameter.empty else p.default
    return None


def names(every: bool = False) -> tuple[str, ...]:
    """Protocols job files may name, in registration order (``every``: all registered)."""
    return tuple(n for n, s in _specs.items() if every or s.nameable)


def find(name: str) -> Spec | None:
    return _specs.get(str(name).lower())


def spec(name: str) -> Spec:
    """The spec of a protocol job files may name; ValueError listing them otherwise."""
    found = find(name)
    if found is None or not found.nameable:
        raise ValueError(f"unknown protocol {name!r}; valid: {', '.join(names())}")
    return found


def taking(option: str) -> tuple[str, ...]:
    """The nameable protocols that take ``option``."""
    return tuple(n for n in names() if option in _specs[n].options)


def option_names() -> tuple[str, ...]:
    """Every option of a nameable protocol, each once, in registration order."""
    return tuple(dict.fromkeys(k for n in names() for k in _specs[n].options))


def aggregating(name: str | None) -> bool:
    """Whether ``name``'s updates average the members' gradients (False: unknown or None)."""
    found = find(name) if name is not None else None
    return found is not None and found.aggregating


class SwitchOptionError(BadInput, ValueError):
    """A switch option that is not a number (exit 2): set text options in the job file."""


def to_numbers(options: Mapping) -> dict[str, float]:
    """Options as the numbers a switch request carries (true = 1); what they mean is
    checked where the switch is (``tfsync.policy.checks.check_switch``)."""
    out = {}
    for key, value in options.items():
        if isinstance(value, str) or not isinstance(value, numbers.Real):
            raise SwitchOptionError(f"{key} = {value!r}: a switch carries numbers only; set text options in the "
                                    "job file")
        out[key] = float(value)
    return out


def from_numbers(name: str, values: Mapping[str, float]) -> dict:
    """A switch request's numbers in ``name``'s declared option types: booleans from 0 and
    1 (any other number is left as it is, for the option's check to refuse), whole numbers
    as integers where allowed; undeclared keys whole as integers."""
    found = find(name)
    declared = found.options if found is not None else {}
    out = {}
    for key, v in values.items():
        kinds = declared[key].kinds if key in declared else (int, float)
        if bool in kinds and v in (0, 1):
            out[key] = v == 1
        else:
            out[key] = int(v) if int in kinds and float(v).is_integer() else float(v)
    return out


def get(spec, **options) -> Policy:
    """A policy from a name (``"ssp"``), a dict (``{"name": "ssp", "staleness": 2}``) or an
    instance; declared options are checked first (one line naming the option).
    ``batch_size`` is taken by every protocol: a self-sizing one sizes from it, the others
    get ``sizer=BatchSizer(batch_size)``."""
    if not isinstance(spec, Policy):
        spec, options = split(spec, options)
        found = find(spec) if spec is not None else None
        if found is not None:
            options = found.check(options)
            if "batch_size" in options and not found.self_sizing:
                if "sizer" in options:
                    raise ValueError(f"protocol {found.name!r}: give batch_size or sizer, not both")
                options["sizer"] = BatchSizer(options.pop("batch_size"))
    return build(_classes, spec, Policy, "protocol", **options)


def make(name: str, sizer: BatchSizer, **options) -> Policy:
    """``name``'s policy granting ``sizer``'s batch sizes; a self-sizing one makes its own
    sizer from ``sizer.batch_size``."""
    found = find(name)
    if found is not None and found.self_sizing:
        return get(name, batch_size=sizer.batch_size, **options)
    return get(name, sizer=sizer, **options)
