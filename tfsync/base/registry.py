"""Look-up by name, dict or instance, shared by every registry (protocols, predictors):
unknown names and unknown options are refused with the valid ones listed."""

from __future__ import annotations

import inspect

from .exits import BadInput


class RegistryError(BadInput, ValueError):
    """A name or an option no registry entry has (exit 2); the message lists the valid ones."""


def split(spec, options: dict) -> tuple:
    """(name, options) of a name or of a dict with ``name`` and options (``options`` win)."""
    if isinstance(spec, dict):
        spec = dict(spec)
        return spec.pop("name", None), {**spec, **options}
    return spec, options


def params(cls) -> set[str]:
    """The keyword arguments ``cls`` takes (subclasses may pass **options up to their base)."""
    out = set()
    for klass in cls.__mro__:
        if "__init__" in klass.__dict__ and klass is not object:
            out |= set(inspect.signature(klass.__init__).parameters)
    return out - {"self", "options", "args", "kwargs"}


def build(registry: dict, spec, base: type, what: str, **options):
    """``spec``: a name (``"ssp"``), a dict with ``name`` and options, or a ready ``base``
    instance (returned as is, with no options allowed)."""
    if isinstance(spec, base):
        if options:
            raise RegistryError(f"options {sorted(options)} given with a ready {what} instance")
        return spec
    name, options = split(spec, options)
    cls = registry.get(str(name).lower()) if name is not None else None
    if cls is None:
        raise RegistryError(f"unknown {what} {name!r}; valid: {', '.join(sorted(registry))}")
    takes = params(cls)
    unknown = sorted(set(options) - takes)
    if unknown:
        raise RegistryError(f"{what} {name!r} takes no option {unknown[0]!r}; valid: {', '.join(sorted(takes))}")
    return cls(**options)
