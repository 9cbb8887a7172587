"""Worker-speed predictors (LB-BSP §3.2.1, §4.2, Table 3): one object per worker,
``update(speed, cpu, mem)`` after every step, ``predict()`` before the next.

``get(spec, **options)`` builds one by name (``"last"``, ``"ema"``, ``"arima"``,
``"narx"``, ``"rnn"``, ``"lstm"``), from a dict (``{"name": "ema", "alpha": 0.3}``), or
passes an instance through; unknown names or options raise ValueError listing the valid
ones. Only the learned predictors touch TensorFlow, lazily, when they first train.
"""

from __future__ import annotations

from ..base.registry import build

from .arima import ARIMAPredictor
from .base import EMA, LastValue, NoObservation, Predictor
from .learned import NARX, LearnedPredictor, LSTMPredictor, RNNPredictor
from .trainer import NarxTrainer, default_trainer, training_with

REGISTRY: dict[str, type[Predictor]] = {"last": LastValue, "ema": EMA, "arima": ARIMAPredictor,
                                        "narx": NARX, "rnn": RNNPredictor, "lstm": LSTMPredictor}


def get(spec, **options) -> Predictor:
    """A new predictor from a name, a dict with ``name``, or an instance (returned as is)."""
    return build(REGISTRY, spec, Predictor, "predictor", **options)


def factory(spec="ema", **options):
    """A zero-argument callable making a fresh predictor per call (one per worker)."""
    if isinstance(spec, type) and issubclass(spec, Predictor):
        return lambda: spec(**options)
    if callable(spec) and not isinstance(spec, (Predictor, type)):
        if options:
            raise ValueError(f"options {sorted(options)} given with a predictor factory")
        return spec
    if isinstance(spec, Predictor):
        raise ValueError("give a predictor name, dict or factory, not an instance: "
                         "every worker needs its own predictor")
    get(spec, **options)  # validate now, not at the first push
    return lambda: get(spec, **options)


__all__ = ["ARIMAPredictor", "EMA", "LSTMPredictor", "LastValue", "LearnedPredictor", "NARX",
           "NarxTrainer", "NoObservation", "Predictor", "REGISTRY", "RNNPredictor",
           "default_trainer", "factory", "get", "training_with"]
