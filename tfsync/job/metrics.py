"""Evaluation metrics: named in a job file (``train.metrics``) or given to ``TrainSetup``
(``metrics=[...]``), computed on the test (or validation) data by the background
evaluator and at the end of a run, next to the loss.

Forms (a job file's, also accepted by the API):

    "accuracy"                      # as model.compile picks it: binary, sparse or categorical
    "mae", "mse", "top_k_categorical_accuracy", ...   # a tf_keras metric function: its mean
    "AUC", "RootMeanSquaredError"   # a tf_keras.metrics class, default options
    {metric = "SparseTopKCategoricalAccuracy", k = 5, name = "top5"}   # with options
    "module:function"               # fn(y_true, y_pred, **options) -> per-example values
                                    # (their mean is reported), or a tf_keras Metric class

The API also takes tf_keras Metric objects and callables ``fn(y_true, y_pred)``. A metric
is reported under its name: the string as written for a function ("mae"), the class's
own name for a class ("auc", "root_mean_squared_error"), the function's ``__name__`` for
a reference, or the ``name`` option. Labels meet the outputs as in ``model.evaluate``
(a ``(N,)`` target against ``(N, 1)`` outputs gets its last axis).

Metric objects are made afresh for every evaluation (``MetricSpec.build``): a restart
switch reconnects the coordinator's eager context, which invalidates variables made
before it, and the background evaluator runs in its own thread.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..base import usercode
from ..base.usercode import UserCodeError

FIELD = "train.metrics"
ACCURACY = ("accuracy", "acc")  # chosen from the labels and outputs, as model.compile does
RESERVED = ("loss",)  # test_loss is the loss


@dataclass(frozen=True)
class MetricSpec:
    """A named metric; ``build(y, out)`` makes a fresh tf_keras Metric for labels and outputs
    like ``y`` and ``out`` (a first batch)."""

    name: str
    build: Callable[[Any, Any], Any]


def resolve(items, field: str = FIELD) -> list[MetricSpec] | None:
    """The metrics ``items`` names (job-file forms, Metric objects or classes, callables);
    None stays None (the default: loss, and accuracy where labels are class ids). A name
    that is unknown, reserved or given twice is a one-line UserCodeError naming ``field``."""
    if items is None:
        return None
    out: list[MetricSpec] = []
    for i, item in enumerate(items):
        spec = item if isinstance(item, MetricSpec) else _one(item, f"{field}[{i}]")
        if spec.name in RESERVED:
            raise UserCodeError(f"{field}[{i}]", f"a metric named {spec.name!r}: test_{spec.name} is the loss; "
                                                 "give it another name (name = ...)")
        if spec.name in [s.name for s in out]:
            raise UserCodeError(f"{field}[{i}]", f"two metrics named {spec.name!r}; give one another name "
                                                 "(name = ...)")
        out.append(spec)
    return out


def _one(item, field: str) -> MetricSpec:
    import tf_keras as keras

    if isinstance(item, keras.metrics.Metric):
        try:
            type(item).from_config(item.get_config())
        except Exception as e:
            raise UserCodeError(field, f"{type(item).__name__} cannot be copied with from_config(get_config()) "
                                       f"({usercode._one_line(e)}); pass its class or a function") from None
        return MetricSpec(item.name, lambda y, out: type(item).from_config(item.get_config()))
    if isinstance(item, type) and issubclass(item, keras.metrics.Metric):
        return _class(item, {}, None, field, item.__name__)
    if isinstance(item, dict):
        options = dict(item)
        what = options.pop("metric", None)
        if not isinstance(what, str):
            raise UserCodeError(field, 'a table needs metric = "a tf_keras metric name or module:function", '
                                       "with its options beside it")
        return _named(what, options, field)
    if isinstance(item, str):
        return _named(item, {}, field)
    if callable(item):
        name = getattr(item, "__name__", None)
        if not name or name == "<lambda>":
            raise UserCodeError(field, f"{item!r} has no name to report it under; wrap it: "
                                       "tf_keras.metrics.MeanMetricWrapper(fn, name=...)")
        return _function(item, {}, name)
    raise UserCodeError(field, f"a {type(item).__name__}; expected a metric name, \"module:function\", a table "
                               "{metric = ..., options}, a tf_keras Metric or a function (y_true, y_pred)")


def _named(what: str, options: dict, field: str) -> MetricSpec:
    import tf_keras as keras

    name = options.pop("name", None)
    if name is not None and (not isinstance(name, str) or not name):
        raise UserCodeError(field, f"name = {name!r}: must be a non-empty string")
    if usercode.check(what):
        obj = usercode.resolve(what, field)
        if isinstance(obj, type) and issubclass(obj, keras.metrics.Metric):
            return _class(obj, options, name, field, what)
        return _function(obj, options, name or what.rsplit(":", 1)[1].rsplit(".", 1)[-1])
    if what in ACCURACY:
        if options:
            raise UserCodeError(field, f"{what!r} takes no options (only name)")
        return MetricSpec(name or what, lambda y, out: _accuracy(y, out, name or what))
    cls = getattr(keras.metrics, what, None)
    if isinstance(cls, type) and issubclass(cls, keras.metrics.Metric) and _takes_labels(cls):
        return _class(cls, options, name, field, what)
    try:
        fn = keras.metrics.get(what)
    except (ValueError, TypeError):
        fn = None
    if not callable(fn) or isinstance(fn, keras.metrics.Metric) or isinstance(fn, type):
        raise UserCodeError(field, f"{what!r} is not a tf_keras metric; expected e.g. \"accuracy\", \"mae\", "
                                   "\"AUC\", \"SparseTopKCategoricalAccuracy\" or \"module:function\"")
    return _function(fn, options, name or what)


def _takes_labels(cls) -> bool:
    """Whether a Metric class compares labels and outputs (not Mean or Sum over values)."""
    params = inspect.signature(cls.update_state).parameters
    return "y_true" in params and "y_pred" in params


def _class(cls, options: dict, name: str | None, field: str, what: str) -> MetricSpec:
    if not _takes_labels(cls):
        raise UserCodeError(field, f"{what}: update_state takes no (y_true, y_pred); expected a metric of "
                                   "labels and outputs")
    kwargs = {**options, "name": name or _default_name(cls)}  # never Keras's unique "auc_1"
    try:
        first = cls(**kwargs)
    except Exception as e:
        given = [*options, *(["name"] if name else [])]
        raise UserCodeError(field, f"{what}({', '.join(f'{k}=...' for k in given)}) raised "
                                   f"{usercode._one_line(e)}") from None
    return MetricSpec(first.name, lambda y, out: cls(**kwargs))


def _default_name(cls) -> str:
    """The class's own default name ("root_mean_squared_error"), else its name in snake case."""
    default = inspect.signature(cls.__init__).parameters.get("name")
    if default is not None and isinstance(default.default, str):
        return default.default
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", cls.__name__).lower()


def _function(fn: Callable, options: dict, name: str) -> MetricSpec:
    import tf_keras as keras
    return MetricSpec(name, lambda y, out: keras.metrics.MeanMetricWrapper(fn, name=name, **options))


def _accuracy(y, out, name: str):
    """model.compile's choice for "accuracy": binary for one output, sparse for class ids,
    categorical for one-hot labels."""
    import tf_keras as keras

    y_rank, out_rank = len(np.shape(y)), len(np.shape(out))
    last = np.shape(out)[-1] if out_rank else None
    if last == 1:
        return keras.metrics.BinaryAccuracy(name=name)
    if y_rank < out_rank or (y_rank and np.shape(y)[-1] == 1 and (last or 0) > 1):
        return keras.metrics.SparseCategoricalAccuracy(name=name)
    return keras.metrics.CategoricalAccuracy(name=name)


def as_in_evaluate(y, out):
    """``(y, out)`` as model.evaluate gives them to its metrics: a ``(N,)`` target against
    ``(N, k)`` outputs gets its last axis; float targets take the outputs' dtype."""
    import tensorflow as tf

    y, out = tf.convert_to_tensor(y), tf.convert_to_tensor(out)
    if y.shape.rank == 1 and out.shape.rank == 2:
        y = tf.expand_dims(y, -1)
    if y.dtype.is_floating and out.dtype.is_floating and y.dtype != out.dtype:
        y = tf.cast(y, out.dtype)
    return y, out


def value(metric) -> float:
    """A metric's result as one number (ValueError for a vector, e.g. F1Score per class)."""
    r = np.asarray(metric.result())
    if r.size != 1:
        raise ValueError(f"its result has shape {r.shape}, expected one number (e.g. average='macro')")
    return float(r.reshape(()))


def check(specs: list[MetricSpec] | None, y, out, field: str = FIELD) -> None:
    """Each metric on one batch of labels ``y`` and outputs ``out``: a metric that cannot
    take them is a one-line UserCodeError naming ``field``."""
    import tensorflow as tf

    if not specs:
        return
    if not tf.is_tensor(out):
        raise UserCodeError(field, f"the model's output is a {type(out).__name__}; metrics need one output tensor")
    for i, spec in enumerate(specs):
        try:
            m = spec.build(y, out)
            m.update_state(*as_in_evaluate(y, out))
            value(m)
        except Exception as e:
            raise UserCodeError(f"{field}[{i}]", f"{spec.name} does not take the labels (shape "
                                f"{tuple(np.shape(y))[1:]}, {getattr(y, 'dtype', '?')}) with the model's output "
                                f"(shape {tuple(out.shape)}): {usercode._one_line(e)}") from None
