"""What a job trains, from its JobConfig: data, model, loss and optimizer, the user's own
functions (``usercode`` references) or those a short name stands for (``data.name``,
``model.name``: ``tfsync.job.schema.DATASETS``, ``MODELS``), checked on one batch before any
task starts.

    work = Workload.from_config(cfg, data_path=None)
    work.model_fn(), work.optimizer_fn(), work.loss_fn(y, outputs), work.x_train, ...

A data function returns ``(x_train, y_train)``, ``(x_train, y_train, x_test, y_test)``,
``((x_train, y_train), (x_test, y_test))`` (tf_keras.datasets' form) or a dict with those
keys (and optionally ``source``, a line saying where the data came from, for the
summary): NumPy arrays of any shape, labels of any dtype the engine carries
(tfsync.engine.generation.RECORD_DTYPES; float targets stay float). Features or labels
may be tuples, lists or dicts of arrays for several inputs or outputs (``tfsync.base.arrays``).
A model function returns a tf_keras Model (called under the strategy's scope, so its
variables go to the parameter servers); ``model.fn`` gets ``model.args`` and nothing else,
``model.name``'s function the data's ``input_shape`` and ``classes`` and ``seed`` =
``job.seed``; ``data.name``'s function gets ``path`` = ``data.path``.

The test_* numbers of a run (``eval_data`` says which) are on the test arrays the data
function returns; where it returns none, ``data.validation`` holds a share of the
training arrays out of training (``hold_out``). ``train.metrics`` are resolved
(``tfsync.job.metrics``) and run on the one batch too.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Callable

import numpy as np

from ..base import arrays, usercode
from ..job.config import JobConfig
from ..job.schema import OPTIMIZER_CLASSES
from ..base.pipeline import DatasetFactory
from ..base.usercode import UserCodeError

logger = logging.getLogger(__name__)

# short names accepted for train.loss, as tf_keras.losses.get knows them
_LOSS_ALIASES = {"mse": "MeanSquaredError", "mae": "MeanAbsoluteError", "huber": "Huber",
                 "sparse_categorical_crossentropy": "SparseCategoricalCrossentropy",
                 "categorical_crossentropy": "CategoricalCrossentropy",
                 "binary_crossentropy": "BinaryCrossentropy"}


@dataclasses.dataclass
class Workload:
    model_fn: Callable
    optimizer_fn: Callable
    loss_fn: Callable  # (y, outputs) -> per-example losses
    x_train: np.ndarray | DatasetFactory
    y_train: np.ndarray | None
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    source: str  # where the data came from, for the summary
    model_name: str
    metrics: list | None = None  # tfsync.job.metrics.MetricSpec; None: accuracy for class ids
    eval_data: str = ""  # what the test_* numbers are computed on, for the summary
    model_field: str = "model.fn"  # the job-file fields that name the functions, for errors
    data_field: str = "data.fn"

    @classmethod
    def from_config(cls, cfg: JobConfig, data_path: str | None = None) -> "Workload":
        from ..job import metrics

        data = _data(cfg, data_path)
        x, y, xt, yt, eval_data = _evaluation_data(cfg, *data[:4])
        work = cls(_model_fn(cfg, *data[:4]), _optimizer_fn(cfg), _loss_fn(cfg), x, y, xt, yt, data[4],
                   model_name=cfg.model.fn or cfg.model.name, eval_data=eval_data,
                   metrics=metrics.resolve(cfg.train.metrics and list(cfg.train.metrics)),
                   model_field=cfg.model.function[0], data_field=cfg.data.function[0])
        work.check()
        return work

    @property
    def train_examples(self) -> int:
        """The examples in one epoch."""
        return self.x_train.examples if isinstance(self.x_train, DatasetFactory) else arrays.length(self.y_train)

    def sample(self, n: int = 2) -> tuple:
        """The first ``n`` training examples and labels (arrays, or nests of them)."""
        if isinstance(self.x_train, DatasetFactory):
            try:
                return self.x_train.sample(n)
            except (TypeError, ValueError) as e:
                raise UserCodeError(self.data_field, f"the DatasetFactory's dataset: {e}") from None
        return arrays.take(self.x_train, slice(0, n)), arrays.take(self.y_train, slice(0, n))

    def check(self) -> None:
        """Build the model here and run one small batch through it and the loss: a shape
        or dtype that does not fit fails now, in one line, not on a worker later."""
        import tensorflow as tf
        import tf_keras as keras

        model = self.model_fn()
        if not isinstance(model, keras.Model):
            raise UserCodeError(self.model_field, f"returned a {type(model).__name__}, expected a tf_keras Model "
                                                  "(import tf_keras as keras, not keras 3)")
        x, y = self.sample()
        try:
            out = model(x, training=False)
        except Exception as e:
            raise UserCodeError(self.model_field, f"the model does not take the data's x_train (examples of "
                                                  f"{arrays.describe(x)}): {usercode._one_line(e)}") from None
        try:
            loss = self.loss_fn(tf.nest.map_structure(tf.constant, y), out)
        except Exception as e:
            several = "" if isinstance(y, np.ndarray) else (
                '; for several outputs name a loss of your own ("module:function" taking the labels and '
                "outputs as the model gives them, returning one loss per example)")
            shapes = tf.nest.map_structure(lambda t: tuple(t.shape), out)
            raise UserCodeError("train.loss", f"the loss does not take y_train (labels of {arrays.describe(y)}) "
                                              f"with the model's output (shape {shapes}): "
                                              f"{usercode._one_line(e)}{several}") from None
        if tuple(loss.shape) != (2,):
            raise UserCodeError("train.loss", f"returned shape {tuple(loss.shape)} for a batch of 2; expected one "
                                              "loss per example, shape (2,) (a loss class gets reduction='none')")
        from ..job.metrics import check
        check(self.metrics, y, out)
        self.optimizer_fn()  # its own errors, before any task starts


def _data(cfg: JobConfig, data_path: str | None):
    """(x_train, y_train, x_test, y_test, source) from the data function: ``data.fn``, or the
    one ``data.name`` stands for, called with ``path`` (``data_path`` or ``data.path``)."""
    field, ref = cfg.data.function
    got = usercode.call(ref, cfg.data.args if cfg.data.fn else {"path": data_path or cfg.data.path}, field)
    if isinstance(got, DatasetFactory):
        return got, None, None, None, ref
    if isinstance(got, tuple) and got and isinstance(got[0], DatasetFactory):  # (factory, x_test, y_test)
        if len(got) != 3 or any(arrays.problem(a, "") for a in got[1:]) or \
                arrays.length(got[1]) != arrays.length(got[2]):
            raise UserCodeError(field, "returned a DatasetFactory with something else; expected the factory "
                                       "alone or (factory, x_test, y_test) with test arrays of one length")
        return got[0], None, got[1], got[2], ref
    source = ref
    if isinstance(got, dict):
        missing = [k for k in ("x_train", "y_train") if k not in got]
        if missing:
            raise UserCodeError(field, f"returned a dict without {', '.join(missing)}; expected keys x_train, "
                                       "y_train and optionally x_test, y_test, source")
        parts = [got.get(k) for k in ("x_train", "y_train", "x_test", "y_test")]
        source = got.get("source", ref)
        if not isinstance(source, str):
            raise UserCodeError(field, f"source is a {type(source).__name__}, expected a string (where the data "
                                       "came from, for the summary)")
    elif isinstance(got, tuple) and len(got) == 2 and all(isinstance(p, tuple) and len(p) == 2 for p in got):
        parts = [*got[0], *got[1]]
    elif isinstance(got, tuple) and len(got) in (2, 4):
        parts = [*got, None, None][:4]
    else:
        raise UserCodeError(field, f"returned a {type(got).__name__}; expected (x_train, y_train), "
                                   "(x_train, y_train, x_test, y_test), ((x_train, y_train), (x_test, y_test)) "
                                   "or a dict with those keys, of NumPy arrays, or a tfsync.DatasetFactory")
    for name, a in zip(("x_train", "y_train", "x_test", "y_test"), parts):
        if a is not None and arrays.problem(a, name):
            raise UserCodeError(field, arrays.problem(a, name))
    x, y, xt, yt = parts
    if (xt is None) != (yt is None):
        raise UserCodeError(field, "returned x_test without y_test or the other way round")
    for xs, ys, what in ((x, y, "train"), (xt, yt, "test")):
        if xs is not None and arrays.length(xs) != arrays.length(ys):
            raise UserCodeError(field, f"x_{what} has {arrays.length(xs)} examples but y_{what} {arrays.length(ys)}")
    if arrays.length(x) == 0:
        raise UserCodeError(field, "returned no training examples")
    return x, y, xt, yt, source


def hold_out(n: int, fraction: float) -> np.ndarray:
    """The indices of the ``fraction`` of ``n`` training examples that ``data.validation``
    holds out: a fixed pseudo-random choice (the same for every run and seed, so sorted
    arrays still give a fair sample), in their order."""
    k = int(round(fraction * n))
    return np.sort(np.random.default_rng(0).permutation(n)[:k])


def _evaluation_data(cfg: JobConfig, x, y, xt, yt):
    """(x_train, y_train, x_test, y_test, what the test_* numbers are on)."""
    v = cfg.data.validation
    if xt is not None:
        if v is not None:
            logger.warning("data.validation = %s not used: the data gives test arrays, which the test_* numbers "
                           "are computed on", v)
        return x, y, xt, yt, f"test arrays ({arrays.length(yt)} examples)"
    if v is None:
        return x, y, None, None, "none (no test arrays; data.validation holds a share of the training arrays out)"
    if isinstance(x, DatasetFactory):
        raise UserCodeError("data.validation", "cannot hold out from a tfsync.DatasetFactory; return "
                                               "(factory, x_test, y_test) for validation data")
    n = arrays.length(y)
    held = hold_out(n, v)
    if not 0 < len(held) < n:
        raise UserCodeError("data.validation", f"{v} of {n} training examples holds out {len(held)}; "
                                               "expected at least one, and one left to train on")
    keep = np.ones(n, bool)
    keep[held] = False
    return (arrays.take(x, keep), arrays.take(y, keep), arrays.take(x, held), arrays.take(y, held),
            f"validation: {len(held)} of the {n} training examples held out (data.validation = {v})")


def _model_fn(cfg: JobConfig, x, y, xt, yt) -> Callable:
    """The model function: ``model.fn`` with ``model.args``, or the one ``model.name``
    stands for with the data's input shape and classes (``_short_name_args``)."""
    field, ref = cfg.model.function
    args = cfg.model.args if cfg.model.fn else _short_name_args(cfg.model.name, cfg.job.seed, x, y, yt)
    fn = usercode.resolve(ref, field)

    def model_fn():
        try:
            return fn(**args)
        except Exception as e:
            raise UserCodeError(field, f"{ref} raised {usercode._one_line(e)}") from None
    return model_fn


def _short_name_args(name: str, seed: int, x, y, yt) -> dict:
    """A short-named model classifies one input array: ``input_shape``, ``classes`` (the
    integer labels are class ids 0 .. the largest) and ``seed``."""
    if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
        raise UserCodeError("model.name", f"{name} is built for one input array and class labels; for a "
                                          "DatasetFactory or several inputs or outputs name your own model with "
                                          "model.fn")
    if not np.issubdtype(y.dtype, np.integer):
        raise UserCodeError("model.name", f"{name} classifies: it needs integer class labels, got {y.dtype}; "
                                          "name your own model with model.fn")
    labels = [y] + ([yt] if isinstance(yt, np.ndarray) and yt.size else [])
    return {"input_shape": tuple(x.shape[1:]), "classes": int(max(np.max(a) for a in labels)) + 1, "seed": seed}


def _loss_fn(cfg: JobConfig) -> Callable:
    import tf_keras as keras

    name, args = cfg.train.loss, dict(cfg.train.loss_args)
    if name is None:  # model.name's classifiers: logits over classes
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    if usercode.check(name):
        fn = usercode.resolve(name, "train.loss")
        return (lambda y, out: fn(y, out, **args)) if args else fn
    cls = getattr(keras.losses, _LOSS_ALIASES.get(name, name), None)
    if not (isinstance(cls, type) and issubclass(cls, keras.losses.Loss)):
        raise UserCodeError("train.loss", f"{name!r} is not a tf_keras.losses class; expected e.g. "
                                          '"MeanSquaredError", "SparseCategoricalCrossentropy", or "module:function"')
    if "reduction" in args:
        raise UserCodeError("train.loss_args", "reduction is tfsync's to set (per-example losses, averaged "
                                               "over each worker's batch and weighted by batch size)")
    try:
        loss = cls(reduction="none", **args)
    except TypeError as e:
        raise UserCodeError("train.loss_args", f"{cls.__name__}: {e}") from None
    return as_in_fit(loss)


def as_in_fit(loss: Callable) -> Callable:
    """``loss`` given targets as ``model.fit`` gives them (tf_keras compile_utils'
    match_dtype_and_rank): targets of shape (N,) against outputs (N, k) get a last axis,
    float targets take the outputs' dtype. Without it a (N,) regression target against
    (N, 1) outputs gives one loss for the whole batch."""
    import tensorflow as tf

    def per_example(y, out):
        y, out = tf.convert_to_tensor(y), tf.convert_to_tensor(out)
        if y.shape.rank == 1 and out.shape.rank == 2:
            y = tf.expand_dims(y, -1)
        if y.dtype.is_floating and out.dtype.is_floating and y.dtype != out.dtype:
            y = tf.cast(y, out.dtype)
        return loss(y, out)
    return per_example


def _optimizer_fn(cfg: JobConfig) -> Callable:
    t = cfg.train
    return lambda: build_optimizer(t.optimizer, t.learning_rate, t.base_momentum, t.optimizer_args)


def _learning_rate(lr):
    """``train.learning_rate`` as the optimizer takes it: a number, a tf_keras schedule by
    name with its options, or what a "module:function" (with the table's options) returns."""
    import tf_keras as keras

    field = "train.learning_rate"
    if isinstance(lr, str):
        lr = usercode.call(lr, {}, field)
    elif isinstance(lr, dict):
        config = {k: v for k, v in lr.items() if k != "schedule"}
        if usercode.check(lr["schedule"]):
            lr = usercode.call(lr["schedule"], config, field)
        else:
            try:
                lr = getattr(keras.optimizers.schedules, lr["schedule"])(**config)
            except (TypeError, ValueError) as e:
                raise UserCodeError(field, f"{lr['schedule']}: {usercode._one_line(e)}") from None
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        return lr
    if isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) and lr > 0:
        return float(lr)
    raise UserCodeError(field, f"got {type(lr).__name__} {lr!r:.60}; expected a number > 0 or a "
                               "tf_keras.optimizers.schedules.LearningRateSchedule (a callable of the step "
                               "is not one: subclass LearningRateSchedule, so checkpoints and the engine "
                               "can evaluate it)")


def build_optimizer(name: str, learning_rate, momentum: float, options: dict):
    """A tf_keras optimizer by name (or "module:function"), with ``learning_rate`` a
    number or a schedule table; refused where the engine could not honour it."""
    import tf_keras as keras

    lr = _learning_rate(learning_rate)
    if usercode.check(name):
        opt = usercode.call(name, {"learning_rate": lr, **options}, "train.optimizer")
    else:
        kwargs = {"learning_rate": lr, **options}
        if name == "sgd":
            kwargs.setdefault("momentum", momentum)
        try:
            opt = getattr(keras.optimizers, OPTIMIZER_CLASSES[name])(**kwargs)
        except (TypeError, ValueError) as e:
            raise UserCodeError("train.optimizer_args", f"{name}: {usercode._one_line(e)}") from None
    from .control import check_optimizer
    try:
        check_optimizer(opt)
    except (TypeError, ValueError) as e:
        raise UserCodeError("train.optimizer", str(e)) from None
    return opt
