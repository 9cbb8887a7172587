"""Look-up by name, dict or instance, shared by every registry (protocols, predictors):
unknown names and unknown options are refused with the valid ones listed."""

from __future__ import annotations

import inspect


def build(registry: dict, spec, base: type, what: str, **options):
    """``spec``: a name (``"ssp"``), a dict with ``name`` and options, or a ready ``base``
    instance (returned as is, with no options allowed)."""
    if isinstance(spec, base):
        if options:
            raise ValueError(f"options {sorted(options)} given with a ready {what} instance")
        return spec
    if isinstance(spec, dict):
        spec = dict(spec)
        name = spec.pop("name", None)
        options = {**spec, **options}
    else:
        name = spec
    cls = registry.get(str(name).lower()) if name is not None else None
    if cls is None:
        raise ValueError(f"unknown {what} {name!r}; valid: {', '.join(sorted(registry))}")
    params = set()
    for klass in cls.__mro__:  # subclasses may pass **options up to their base
        if "__init__" in klass.__dict__ and klass is not object:
            params |= set(inspect.signature(klass.__init__).parameters)
    params -= {"self", "options", "args", "kwargs"}
    unknown = sorted(set(options) - params)
    if unknown:
        raise ValueError(f"{what} {name!r} takes no option {unknown[0]!r}; valid: {', '.join(sorted(params))}")
    return cls(**options)
