"""Training data as one NumPy array or a nest of them: a tuple, list or dict of arrays for
a model's several inputs or outputs, as ``model.fit`` and ``tf.nest`` take them. NumPy only.

    leaves(y)              # the arrays, in tf.nest.flatten's order (dict values by sorted key)
    length(y)              # the examples (every array's first axis)
    take(x, slice(0, 2))   # the same structure, each array indexed
"""

from __future__ import annotations

import numpy as np


def leaves(a) -> list:
    """The arrays of ``a`` in tf.nest.flatten's order."""
    if isinstance(a, dict):
        return [leaf for k in sorted(a) for leaf in leaves(a[k])]
    if isinstance(a, (tuple, list)):
        return [leaf for v in a for leaf in leaves(v)]
    return [a]


def length(a) -> int:
    """The examples in ``a`` (checked by ``problem``: every array has as many)."""
    return len(leaves(a)[0])


def take(a, index):
    """``a`` with every array indexed by ``index`` (a slice, indices or a mask)."""
    if isinstance(a, dict):
        return {k: take(v, index) for k, v in a.items()}
    if isinstance(a, (tuple, list)):
        return (tuple if isinstance(a, tuple) else list)(take(v, index) for v in a)
    return a[index]


def describe(a) -> str:
    """One example's shape and dtype per array, e.g. ``shape (20,) float32`` or
    ``{'kind': shape () int64, 'price': shape (1,) float32}``, for messages."""
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {describe(v)}" for k, v in a.items()) + "}"
    if isinstance(a, (tuple, list)):
        inner = ", ".join(describe(v) for v in a)
        return f"({inner})" if isinstance(a, tuple) else f"[{inner}]"
    return f"shape {tuple(np.shape(a))[1:]} {getattr(a, 'dtype', type(a).__name__)}"


def problem(a, name: str) -> str | None:
    """What is wrong with ``a`` as the data ``name`` (x_train, ...), or None: every leaf a
    NumPy array with a first axis, as many examples in each, at least one array."""
    found = []

    def walk(v, where):
        if isinstance(v, dict):
            for k in v:
                walk(v[k], f"{where}[{k!r}]")
        elif type(v) in (tuple, list) and v and all(isinstance(w, (np.ndarray, dict, tuple, list)) for w in v):
            for i, w in enumerate(v):  # a list of numbers is not a nest: it is reported whole
                walk(w, f"{where}[{i}]")
        elif not isinstance(v, np.ndarray) or v.ndim == 0:
            found.append(f"{where} is a {type(v).__name__ if not isinstance(v, np.ndarray) else 'scalar array'}, "
                         "expected a NumPy array (or a tuple, list or dict of them)")
        else:
            found.append((where, len(v)))

    walk(a, name)
    bad = [f for f in found if isinstance(f, str)]
    if bad:
        return bad[0]
    if not found:
        return f"{name} holds no arrays"
    if len({n for _, n in found}) > 1:
        return f"{name} has arrays of different lengths: " + ", ".join(f"{w} {n}" for w, n in found)
    return None
