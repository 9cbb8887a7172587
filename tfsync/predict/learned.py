"""Learned speed predictors trained online: NARX (LB-BSP §3.2.1) and, for the
comparison of Table 3, SimpleRNN and LSTM with look-back 2.

NARX (eq. 4): v^k = F(v^{k-1}, v^{k-2}, c^k, c^{k-1}, c^{k-2}, m^k, m^{k-1}, m^{k-2}),
8 inputs, where c^k / m^k are the CPU / memory readings the step starts with (given to
``update`` together with the previous step's speed). RNN/LSTM see the last 2 speeds only
(the paper's point: they are blind to resources).

Inputs are normalised: speeds by a running scale s, the worker's mean speed over the
training window (refreshed at every fit and kept with the weights), as v/s - 1; CPU and
memory percentages by 1/100; then every input and the target are standardised with the
training set's statistics. Reused weights (§4.2) are applied with the new worker's own
mean speed so far, so a model trained on one worker transfers to another of different
absolute speed. (A scale that moved with every sample would make a constant trend look
like a changing one, which the network cannot see; one scale per fit keeps it constant.)

The network's output is the *change* from the last speed: v^k = v^{k-1} + s * G(...),
the same function class as eq. 4 with the last speed passed straight through. A steady
trend is then a constant output, not an extrapolation past the trained range, where a
tanh layer saturates and under-predicts.

Beyond the paper (issue 19's study, ``tfsync predict score``): NARX's ``lookback`` (L lags
of speed, L + 1 of each reading) and ``baseline="ema"``, where the output is the change from
the EMA (the network learns EMA's residual; the EMA is one more input).

``fit``: how a fit runs. ``"adam"`` is the paper's (tf_keras, Adam on mini-batches of 32,
early stopping at 1e-4 for 4 epochs; SimpleRNN and LSTM always). NARX's default, ``"lbfgs"``
(beyond the paper, issue 19), fits the same network to the same data by full-batch L-BFGS in
NumPy/SciPy, warm-started from the last weights: about 25 ms of CPU a fit instead of about a
second (the paper's fit took half a core beside a 4-worker run; this one about 1 %), the same
RMSE (results/issue19/), and no TensorFlow in the coordinator's predictor threads.

Schedule (§4.2): EMA until ``warmup`` observations (500 in the paper), then the model
once its first fit is done; given ``weights`` of an earlier model, the model is used at
once and refined after ``min_train`` observations. Refit every ``retrain_every``
observations on the last ``window``, by a :class:`NarxTrainer` (background threads).
Inference is NumPy on the trained weights, so ``predict()`` costs microseconds.

State (``save_state``): the observation windows, the EMA, the model (weights, input and
output statistics, speed scale) and the fit counters, as one snapshot taken under the lock
the training thread assigns a new model under, so it never pairs a new model with old
counters. A fit asked for and not finished at the snapshot is asked for again at the
restored predictor's next observation. The Adam fit's optimizer moments are not kept: its
next fit starts from the restored weights with fresh moments.
"""

from __future__ import annotations

import logging
import math
import threading

import numpy as np

from ..base import plainstate
from . import nets
from .base import EMA, Predictor
from .trainer import NarxTrainer, default_trainer

logger = logging.getLogger(__name__)


class LearnedPredictor(Predictor):
    """Shared machinery; subclasses set ``kind``, ``lag`` and ``_row``."""

    kind = "narx"
    lag = 3  # observations needed before the first input row exists

    def __init__(self, warmup: int = 500, weights=None, trainer: NarxTrainer | None = None,
                 units: int = 2, window: int = 1000, retrain_every: int = 50, min_train: int = 32,
                 alpha: float = 0.2, seed: int = 0, baseline: str = "last", fit: str | None = None):
        super().__init__()
        if baseline not in ("last", "ema"):
            raise ValueError(f"{self.name}: baseline must be 'last' (the paper's) or 'ema', got {baseline!r}")
        fits = ("lbfgs", "adam") if self.kind == "narx" else ("adam",)
        fit = fits[0] if fit is None else fit
        if fit not in fits:
            raise ValueError(f"{self.name}: fit must be one of {', '.join(fits)} ('adam' is the paper's, "
                             f"tf_keras), got {fit!r}")
        self.baseline, self.fit = baseline, fit
        if int(warmup) < 0 or int(units) < 1 or int(retrain_every) < 1:
            raise ValueError(f"{self.name}: warmup must be >= 0, units and retrain_every >= 1; got "
                             f"warmup={warmup}, units={units}, retrain_every={retrain_every}")
        if int(window) < int(min_train) or int(min_train) < self.lag + 2:
            raise ValueError(f"{self.name}: need {self.lag + 2} <= min_train <= window; got "
                             f"min_train={min_train}, window={window}")
        self.warmup, self.units, self.window = int(warmup), int(units), int(window)
        self.retrain_every, self.min_train, self.seed = int(retrain_every), int(min_train), int(seed)
        self.trainer = trainer
        self.ema = EMA(alpha)
        self.reused = weights is not None
        self._state = self._check_state(weights) if weights is not None else None
        self._model = None  # the tf_keras model, touched only by the training thread
        self._lock = threading.Lock()
        self._v: list[float] = []
        self._c: list[float] = []
        self._m: list[float] = []
        self._e: list[float] = []  # the EMA after each observation (baseline="ema")
        self._v_sum = 0.0  # sum of self._v: the reused-weights scale in O(1) per prediction
        self._since_train = 0
        self._requested = False
        self._asked = self._answered = 0  # fits asked for / the last ask a finished fit answered
        self.fits = 0
        self._warned = False

    # -- data -----------------------------------------------------------------------------
    def _update(self, speed, cpu, mem):
        self.ema.update(speed)
        with self._lock:
            # A missing reading repeats the last one (0 % before any); stored as fractions.
            c = cpu / 100.0 if cpu is not None else (self._c[-1] if self._c else 0.0)
            m = mem / 100.0 if mem is not None else (self._m[-1] if self._m else 0.0)
            self._v.append(speed)
            self._v_sum += speed
            self._c.append(c)
            self._m.append(m)
            self._e.append(self.ema.value)
            extra = len(self._v) - (self.window + self.lag)
            if extra > 0:
                self._v_sum -= sum(self._v[:extra])
                for series in (self._v, self._c, self._m, self._e):
                    del series[:extra]
        self._since_train += 1
        need = self.min_train if self.reused else max(self.warmup, self.min_train)
        if self.count >= need and (not self._requested or self._since_train >= self.retrain_every):
            self._requested, self._since_train = True, 0
            with self._lock:
                self._asked += 1
            (self.trainer or default_trainer()).request(self)

    def _row(self, j: int, s: float) -> np.ndarray:
        """Inputs predicting observation ``j`` (0-based in the kept series) from those before."""
        raise NotImplementedError

    def _dataset(self):
        """(inputs, targets, scale) of the last ``window`` observations."""
        with self._lock:
            n = len(self._v)
            first = max(self.lag, n - self.window)
            scale = max(float(np.mean(self._v[first - self.lag:])), 1e-12)
            rows = [self._row(j, scale) for j in range(first, n)]
            y = [(self._v[j] - self._base(j)) / scale for j in range(first, n)]
        return np.array(rows), np.array(y), scale

    def _inputs(self) -> int:
        """Length of a row's statistics: NARX's inputs, the RNNs' time steps."""
        return self.lag

    def _base(self, j: int) -> float:
        """What the network's output is added to when predicting observation ``j``: the
        last speed (the paper's form) or, with ``baseline="ema"``, the EMA of those before j."""
        return self._v[j - 1] if self.baseline == "last" else self._e[j - 1]

    # -- training (called by the trainer, in its thread) -------------------------------------
    def _train(self, trainer: NarxTrainer) -> None:
        asked = self._asked
        x, y, scale = self._dataset()
        if len(y) < 2:
            return
        # Standardise with this training set's statistics, so the loss has unit scale and
        # the paper's absolute early-stopping threshold (1e-4) means the same everywhere.
        xm, xs = x.mean(axis=0), x.std(axis=0)
        xs = np.where(xs > 1e-9, xs, 1.0)
        ym, ys = float(y.mean()), float(y.std()) or 1.0
        if self.fit == "lbfgs":  # warm start from the last (or reused) weights
            start = self._state["weights"] if self._state is not None \
                else nets.glorot(x.shape[1], self.units, self.seed)
            weights, epochs, loss = nets.fit_lbfgs(self.kind, start, (x - xm) / xs, (y - ym) / ys)
        else:
            weights, epochs, loss = self._fit_keras(trainer, x, y, xm, xs, ym, ys)
        # One assignment: predict() sees the old state or the new one, never a mix; under
        # the lock, so save_state sees the model and its counters together.
        with self._lock:
            self._state = {"kind": self.kind, "weights": weights, "x_mean": xm, "x_std": xs,
                           "y_mean": ym, "y_std": ys, "scale": scale, "baseline": self.baseline}
            self.fits += 1
            self._answered = asked
        logger.debug("%s trained on %d samples: %d epochs, loss %.3g", self.name, len(y), epochs, loss)

    def _fit_keras(self, trainer, x, y, xm, xs, ym, ys):
        nets.limit_tf_threads(trainer.tf_threads)
        if self._model is None:
            self._model = nets.build(self.kind, x.shape[1], self.units, trainer.learning_rate, self.seed)
            if self._state is not None:  # warm start from reused weights
                self._model.set_weights([w.astype(np.float32) for w in self._state["weights"]])
        return nets.fit(self._model, (x - xm) / xs, (y - ym) / ys, **trainer.fit_options,
                        seed=self.seed * 1_000_003 + self.fits)  # same data, same fit

    # -- prediction -------------------------------------------------------------------------
    def _check_state(self, state) -> dict:
        keys = {"kind", "weights", "x_mean", "x_std", "y_mean", "y_std"}
        if not isinstance(state, dict) or not keys <= set(state):
            raise ValueError(f"{self.name}: weights must be another predictor's .weights (a dict "
                             f"with {sorted(keys)}), got {type(state).__name__}")
        if state["kind"] != self.kind:
            raise ValueError(f"{self.name}: weights are of a {state['kind']!r} model, expected "
                             f"{self.kind!r}; reuse weights of the same predictor kind")
        if state.get("baseline", "last") != self.baseline or len(state["x_mean"]) != self._inputs():
            raise ValueError(f"{self.name}: weights are of a model with baseline {state.get('baseline', 'last')!r} "
                             f"and {len(state['x_mean'])} inputs, this one has baseline {self.baseline!r} and "
                             f"{self._inputs()}; reuse weights of the same configuration")
        # Another worker's scale does not apply here: use this worker's mean speed (None).
        return {**state, "weights": [np.array(w, dtype=np.float64) for w in state["weights"]],
                "scale": None}

    @property
    def weights(self) -> dict | None:
        """The current model (weights and input/output statistics), to reuse in another
        predictor as ``weights=``; None before the first fit."""
        st = self._state
        return None if st is None else {**st, "weights": [np.array(a) for a in st["weights"]]}

    @property
    def using_model(self) -> bool:
        return self._state is not None and (self.reused or self.count >= self.warmup) \
            and self.count >= self.lag

    def _predict(self):
        st = self._state
        if not self.using_model:
            return self.ema.predict()
        with self._lock:
            n = len(self._v)
            s = st["scale"] or max(self._v_sum / n, 1e-12)
            row, last = self._row(n, s), self._base(n)
        if self.kind == "narx":  # 8 inputs, 2 units: plain floats beat NumPy's per-call cost
            out = _narx_output(st, row)
        else:
            out = float(nets.forward(self.kind, st["weights"], ((row - st["x_mean"]) / st["x_std"])[None])[0])
        pred = last + (out * st["y_std"] + st["y_mean"]) * s
        if math.isfinite(pred) and pred > 0:
            return pred
        if not self._warned:
            self._warned = True
            logger.warning("%s predicted %r samples/s; using EMA for such predictions", self.name, pred)
        return self.ema.predict()

    # -- state ----------------------------------------------------------------------------
    def _save_state(self):
        with self._lock:  # one snapshot: the training thread assigns models under this lock
            series = {"v": list(self._v), "c": list(self._c), "m": list(self._m), "e": list(self._e)}
            v_sum, st, fits, pending = self._v_sum, self._state, self.fits, self._answered < self._asked
        model = None
        if st is not None:
            model = {"kind": st["kind"], "y_mean": float(st["y_mean"]), "y_std": float(st["y_std"]),
                     "scale": st.get("scale"), "baseline": st.get("baseline", "last")}
            model.update({k: np.asarray(st[k], dtype=np.float64).tolist() for k in ("x_mean", "x_std")},
                         weights=[np.asarray(w, dtype=np.float64).tolist() for w in st["weights"]])
        return {"ema": self.ema.save_state(), "series": series, "v_sum": v_sum, "model": model,
                "reused": self.reused, "fits": fits, "fit_pending": pending,
                "since_train": self._since_train, "requested": self._requested, "warned": self._warned}

    def _load_state(self, state):
        what = f"the {self.name} predictor"
        ema = EMA(self.ema.alpha)
        ema.restore_state(plainstate.field(state, "ema", what))
        series = plainstate.field(state, "series", what)
        try:
            v, c, m, e = ([float(x) for x in series[k]] for k in "vcme")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{what}: the saved observation windows are not lists of numbers ({exc})") from None
        if not len(v) == len(c) == len(m) == len(e):
            raise ValueError(f"{what}: the saved observation windows differ in length "
                             f"({len(v)}, {len(c)}, {len(m)}, {len(e)})")
        v_sum = float(state.get("v_sum", sum(v)))
        extra = len(v) - (self.window + self.lag)
        if extra > 0:  # a shorter window now: keep the newest observations
            v_sum -= sum(v[:extra])
            v, c, m, e = v[extra:], c[extra:], m[extra:], e[extra:]
        model = state.get("model")
        model = None if model is None else self._check_model(model, what)
        pending = bool(state.get("fit_pending", False))
        values = dict(ema=ema, _v=v, _c=c, _m=m, _e=e, _v_sum=v_sum, _state=model, _model=None,
                      reused=bool(state.get("reused", False)), fits=int(state.get("fits", 0)),
                      _requested=bool(state.get("requested", False)) or pending,
                      _since_train=max(int(state.get("since_train", 0)), self.retrain_every if pending else 0),
                      _warned=bool(state.get("warned", False)), _asked=0, _answered=0)

        def apply():
            with self._lock:
                self.__dict__.update(values)
        return apply

    def _check_model(self, model, what: str) -> dict:
        """A saved model as ``_state`` holds it, if it is this predictor's network."""
        base = self._check_state(model)  # kind, baseline and number of inputs
        weights = base["weights"]
        want = nets.shapes(self.kind, self._inputs(), self.units)
        got = [w.shape for w in weights]
        if got != want:
            raise ValueError(f"{what}: the saved network has weights of shapes {got}, this one "
                             f"{want} ({self.units} units, {self._inputs()} inputs)")
        scale = model.get("scale")
        return {**base, "x_mean": np.asarray(model["x_mean"], dtype=np.float64),
                "x_std": np.asarray(model["x_std"], dtype=np.float64), "y_mean": float(model["y_mean"]),
                "y_std": float(model["y_std"]), "scale": None if scale is None else float(scale)}

    def describe(self):
        return {"name": self.name, "warmup": self.warmup, "units": self.units,
                "retrain_every": self.retrain_every, "window": self.window, "fits": self.fits,
                "reused": self.reused, "using_model": self.using_model, "baseline": self.baseline,
                "fit": self.fit}


def _narx_output(state: dict, row) -> float:
    """nets.forward("narx") of one standardised row, in Python floats. The standardisation
    is folded into the first layer once per state: ((x - m) / s) W + b = x (W / s) + (b - (m / s) W)."""
    plain = state.get("plain")
    if plain is None:
        w1, b1, w2, b2 = (np.asarray(a, dtype=np.float64) for a in state["weights"])
        xm, xs = np.asarray(state["x_mean"], dtype=np.float64), np.asarray(state["x_std"], dtype=np.float64)
        plain = state["plain"] = ((w1 / xs[:, None]).T.tolist(), (b1 - (xm / xs) @ w1).tolist(),
                                  w2[:, 0].tolist(), float(b2[0]))
    w, b, w2, b2 = plain
    return b2 + sum(a * math.tanh(bk + sum(wi * xi for wi, xi in zip(wk, row)))
                    for wk, bk, a in zip(w, b, w2))


class NARX(LearnedPredictor):
    """``lookback`` L: speeds v^{k-1..k-L}, readings c, m^{k..k-L} (LB-BSP eq. 4: L = 2);
    with ``baseline="ema"`` the EMA is one more input and the output is added to it."""

    name = "narx"
    kind = "narx"
    lag = 3

    def __init__(self, lookback: int = 2, **options):
        if int(lookback) < 1:
            raise ValueError(f"narx: lookback must be >= 1, got {lookback!r}; 2 is the paper's")
        self.lookback, self.lag = int(lookback), int(lookback) + 1
        super().__init__(**options)

    def _row(self, j, s):  # LB-BSP eq. 4, look-back L on every series
        v, c, m, L = self._v, self._c, self._m, self.lookback
        row = [v[j - i] / s - 1 for i in range(1, L + 1)] + [c[j - i] for i in range(1, L + 2)] \
            + [m[j - i] for i in range(1, L + 2)]
        return row + [self._e[j - 1] / s - 1] if self.baseline == "ema" else row

    def _inputs(self):
        return 3 * self.lookback + 2 + (self.baseline == "ema")

    def describe(self):
        return {**super().describe(), "lookback": self.lookback}


class RNNPredictor(LearnedPredictor):
    """SimpleRNN over the last 2 speeds (LB-BSP §5.4, Table 3)."""

    name = "rnn"
    kind = "rnn"
    lag = 2

    def __init__(self, units: int = 4, **options):
        super().__init__(units=units, **options)

    def _row(self, j, s):
        return np.array([[self._v[j - 2] / s - 1], [self._v[j - 1] / s - 1]])


class LSTMPredictor(RNNPredictor):
    """LSTM over the last 2 speeds (LB-BSP §5.4, Table 3)."""

    name = "lstm"
    kind = "lstm"
