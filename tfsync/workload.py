"""What a job trains, from its JobConfig: data, model, loss and optimizer, bundled by name
or the user's own (``usercode`` references), checked on one batch before any task starts.

    work = Workload.from_config(cfg, data_path=None)
    work.model_fn(), work.optimizer_fn(), work.loss_fn(y, outputs), work.x_train, ...

A user's data function returns ``(x_train, y_train)``, ``(x_train, y_train, x_test,
y_test)``, ``((x_train, y_train), (x_test, y_test))`` (tf_keras.datasets' form) or a dict
with those keys: NumPy arrays of any shape, labels of any dtype the engine carries
(tfsync.engine.generation.RECORD_DTYPES; float targets stay float). A model function
returns a tf_keras Model (called under the strategy's scope, so its variables go to the
parameter servers); it gets ``model.args`` and nothing else.

The test_* numbers of a run (``eval_data`` says which) are on the test arrays the data
function returns (or the bundled set's test set); where it returns none, ``data.validation``
holds a share of the training arrays out of training (``hold_out``). ``train.metrics`` are
resolved (``tfsync.metrics``) and run on the one batch too.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Callable

import numpy as np

from . import usercode
from .config import OPTIMIZER_CLASSES, JobConfig
from .pipeline import DatasetFactory
from .usercode import UserCodeError

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
    metrics: list | None = None  # tfsync.metrics.MetricSpec; None: accuracy for class ids
    eval_data: str = ""  # what the test_* numbers are computed on, for the summary

    @classmethod
    def from_config(cls, cfg: JobConfig, data_path: str | None = None) -> "Workload":
        from . import metrics

        data = _data(cfg, data_path)
        x, y, xt, yt, eval_data = _evaluation_data(cfg, *data[:4])
        work = cls(_model_fn(cfg, data), _optimizer_fn(cfg), _loss_fn(cfg), x, y, xt, yt, data[4],
                   model_name=cfg.model.fn or cfg.model.name, eval_data=eval_data,
                   metrics=metrics.resolve(cfg.train.metrics and list(cfg.train.metrics)))
        work.check()
        return work

    @property
    def train_examples(self) -> int:
        """The examples in one epoch."""
        return self.x_train.examples if isinstance(self.x_train, DatasetFactory) else len(self.y_train)

    def sample(self, n: int = 2) -> tuple[np.ndarray, np.ndarray]:
        """The first ``n`` training examples and labels."""
        if isinstance(self.x_train, DatasetFactory):
            try:
                return self.x_train.sample(n)
            except (TypeError, ValueError) as e:
                raise UserCodeError("data.fn", f"the DatasetFactory's dataset: {e}") from None
        return self.x_train[:n], self.y_train[:n]

    def check(self) -> None:
        """Build the model here and run one small batch through it and the loss: a shape
        or dtype that does not fit fails now, in one line, not on a worker later."""
        import tensorflow as tf
        import tf_keras as keras

        model = self.model_fn()
        if not isinstance(model, keras.Model):
            raise UserCodeError("model.fn", f"returned a {type(model).__name__}, expected a tf_keras Model "
                                            "(import tf_keras as keras, not keras 3)")
        x, y = self.sample()
        try:
            out = model(x, training=False)
        except Exception as e:
            raise UserCodeError("model.fn", f"the model does not take the data's x_train (examples of shape "
                                            f"{x.shape[1:]}, {x.dtype}): {usercode._one_line(e)}") from None
        try:
            loss = self.loss_fn(tf.constant(y), out)
        except Exception as e:
            raise UserCodeError("train.loss", f"the loss does not take y_train (labels of shape {y.shape[1:]}, "
                                              f"{y.dtype}) with the model's output (shape "
                                              f"{tuple(out.shape)}): {usercode._one_line(e)}") from None
        if tuple(loss.shape) != (2,):
            raise UserCodeError("train.loss", f"returned shape {tuple(loss.shape)} for a batch of 2; expected one "
                                              "loss per example, shape (2,) (a loss class gets reduction='none')")
        from .metrics import check
        check(self.metrics, y, out)
        self.optimizer_fn()  # its own errors, before any task starts


def _data(cfg: JobConfig, data_path: str | None):
    if not cfg.data.fn:
        from .data import load
        d = load(cfg.data.name, data_path or cfg.data.path)
        return d.x_train, d.y_train, d.x_test, d.y_test, d.source, d.num_classes
    got = usercode.call(cfg.data.fn, cfg.data.args, "data.fn")
    if isinstance(got, DatasetFactory):
        return got, None, None, None, cfg.data.fn, None
    if isinstance(got, tuple) and got and isinstance(got[0], DatasetFactory):  # (factory, x_test, y_test)
        if len(got) != 3 or not all(isinstance(a, np.ndarray) for a in got[1:]) or len(got[1]) != len(got[2]):
            raise UserCodeError("data.fn", "returned a DatasetFactory with something else; expected the factory "
                                           "alone or (factory, x_test, y_test) with test arrays of one length")
        return got[0], None, got[1], got[2], cfg.data.fn, None
    if isinstance(got, dict):
        missing = [k for k in ("x_train", "y_train") if k not in got]
        if missing:
            raise UserCodeError("data.fn", f"returned a dict without {', '.join(missing)}; expected keys x_train, "
                                           "y_train and optionally x_test, y_test")
        parts = [got.get(k) for k in ("x_train", "y_train", "x_test", "y_test")]
    elif isinstance(got, tuple) and len(got) == 2 and all(isinstance(p, tuple) and len(p) == 2 for p in got):
        parts = [*got[0], *got[1]]
    elif isinstance(got, tuple) and len(got) in (2, 4):
        parts = [*got, None, None][:4]
    else:
        raise UserCodeError("data.fn", f"returned a {type(got).__name__}; expected (x_train, y_train), "
                                       "(x_train, y_train, x_test, y_test), ((x_train, y_train), (x_test, y_test)) "
                                       "or a dict with those keys, of NumPy arrays, or a tfsync.DatasetFactory")
    arrays = []
    for name, a in zip(("x_train", "y_train", "x_test", "y_test"), parts):
        if a is not None and not isinstance(a, np.ndarray):
            raise UserCodeError("data.fn", f"{name} is a {type(a).__name__}, expected a NumPy array")
        arrays.append(a)
    x, y, xt, yt = arrays
    if (xt is None) != (yt is None):
        raise UserCodeError("data.fn", "returned x_test without y_test or the other way round")
    for xs, ys, what in ((x, y, "train"), (xt, yt, "test")):
        if xs is not None and len(xs) != len(ys):
            raise UserCodeError("data.fn", f"x_{what} has {len(xs)} examples but y_{what} {len(ys)}")
    if len(x) == 0:
        raise UserCodeError("data.fn", "returned no training examples")
    return x, y, xt, yt, cfg.data.fn, None


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
        return x, y, xt, yt, f"test arrays ({len(yt)} examples)"
    if v is None:
        return x, y, None, None, "none (no test arrays; data.validation holds a share of the training arrays out)"
    if isinstance(x, DatasetFactory):
        raise UserCodeError("data.validation", "cannot hold out from a tfsync.DatasetFactory; return "
                                               "(factory, x_test, y_test) for validation data")
    held = hold_out(len(y), v)
    if not 0 < len(held) < len(y):
        raise UserCodeError("data.validation", f"{v} of {len(y)} training examples holds out {len(held)}; "
                                               "expected at least one, and one left to train on")
    keep = np.ones(len(y), bool)
    keep[held] = False
    return x[keep], y[keep], x[held], y[held], (f"validation: {len(held)} of the {len(y)} training examples "
                                                f"held out (data.validation = {v})")


def _model_fn(cfg: JobConfig, data) -> Callable:
    if cfg.model.fn:
        fn = usercode.resolve(cfg.model.fn, "model.fn")

        def model_fn():
            try:
                return fn(**cfg.model.args)
            except Exception as e:
                raise UserCodeError("model.fn", f"{cfg.model.fn} raised {usercode._one_line(e)}") from None
        return model_fn

    from .engine.models import build_model
    x, y, classes = data[0], data[1], data[5]
    if isinstance(x, DatasetFactory):
        raise UserCodeError("model.name", f"the bundled {cfg.model.name} is built from arrays; with a "
                                          "DatasetFactory name your own model with model.fn")
    if classes is None:  # a bundled model on the user's data: integer classes 0 .. max
        if not np.issubdtype(y.dtype, np.integer):
            raise UserCodeError("model.name", f"the bundled {cfg.model.name} classifies: it needs integer class "
                                              f"labels, got {y.dtype}; name your own model with model.fn")
        classes = int(np.max(y)) + 1

    def bundled():
        return build_model(cfg.model.name, x.shape[1:], classes, seed=cfg.job.seed)
    return bundled


def _loss_fn(cfg: JobConfig) -> Callable:
    import tf_keras as keras

    name, args = cfg.train.loss, dict(cfg.train.loss_args)
    if name is None:  # the bundled models: logits over classes
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
    from .engine.control import check_optimizer
    try:
        check_optimizer(opt)
    except (TypeError, ValueError) as e:
        raise UserCodeError("train.optimizer", str(e)) from None
    return opt
