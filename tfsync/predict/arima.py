"""ARIMA(p, d, q) speed prediction with statsmodels (LB-BSP §5.4, Table 3: (2, 2, 1)).

Refitting on every step would cost tens of milliseconds each time, so the model is
refit every ``refit_every`` observations on a sliding ``window`` of the latest ones,
warm-started from the previous fit's parameters (``start_params``). Between refits the
fitted model is carried forward with ``extend`` (new data, same parameters), which
costs a few milliseconds, so ``predict()`` only returns a cached number.

State (``save_state``): the window of observations, the EMA, the last good fit's
parameters and the observations its model has seen (``_covered``); a restore rebuilds the
model by filtering those with the saved parameters (no fit), which gives the forecasts the
saved predictor would have made.

Failures: a refit that raises or gives non-finite parameters or forecasts is logged as
a warning and the previous forecast is kept for that step; later steps carry the
previous model forward, or use EMA if no fit has ever succeeded. statsmodels'
convergence and starting-parameter warnings are silenced (they fire on most short,
noisy windows and carry nothing a user can act on).
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings

import numpy as np

from ..base import plainstate
from .base import EMA, Predictor

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # optional: without it, fits may crawl on a busy machine (below)
    threadpool_limits = None

logger = logging.getLogger(__name__)

# Windows of observations kept to rebuild the model at a restore (_load_state). Only while
# refits keep failing does _covered grow past one window plus refit_every; beyond this
# many, a restore filters from a later start, a close approximation.
_COVERED = 4


def _quiet():
    """statsmodels' warnings off and BLAS at one thread. The state-space filter makes
    many tiny BLAS calls; with OpenBLAS' threads on a loaded 2-core machine one fit took
    7 s instead of 0.07 s here. threadpoolctl's limit is process-wide while it lasts."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")  # ConvergenceWarning, non-stationary start params
    if threadpool_limits is not None:
        stack.enter_context(threadpool_limits(1))
    return stack


class ARIMAPredictor(Predictor):
    name = "arima"

    def __init__(self, order=(2, 2, 1), refit_every: int = 10, window: int = 100,
                 min_obs: int = 12, alpha: float = 0.2):
        super().__init__()
        order = tuple(int(o) for o in order)
        if len(order) != 3 or min(order) < 0:
            raise ValueError(f"ARIMA order must be three integers >= 0 (p, d, q), got {order!r}")
        if int(refit_every) < 1 or int(window) < 4 or int(min_obs) < 4 or int(min_obs) > int(window):
            raise ValueError(f"ARIMA needs refit_every >= 1 and 4 <= min_obs <= window; got "
                             f"refit_every={refit_every}, min_obs={min_obs}, window={window}")
        self.order, self.refit_every = order, int(refit_every)
        self.window, self.min_obs = int(window), int(min_obs)
        self.ema = EMA(alpha)  # the forecast before the first successful fit
        self.history: list[float] = []
        self.params: np.ndarray | None = None  # last good fit's parameters (warm start)
        self.fits = self.failures = 0
        self._res = None  # last good results, carried forward by extend
        self._unapplied: list[float] = []  # observations not yet in _res
        self._covered: list[float] = []  # the observations _res has seen (rebuilds it at a restore)
        self._since_fit = 0
        self._forecast = math.nan

    def _fit(self, data: np.ndarray, start_params):
        """One statsmodels fit (a method so tests can make it fail)."""
        from statsmodels.tsa.arima.model import ARIMA

        with _quiet():
            return ARIMA(data, order=self.order).fit(start_params=start_params)

    def _update(self, speed, cpu, mem):
        self.ema.update(speed)
        self.history.append(speed)
        if len(self.history) > self.window:
            del self.history[: len(self.history) - self.window]
        self._unapplied.append(speed)
        self._since_fit += 1
        previous = self._forecast if math.isfinite(self._forecast) else self.ema.predict()
        first = self.fits == 0 and self.failures == 0
        if len(self.history) >= self.min_obs and (first or self._since_fit >= self.refit_every):
            if self._refit(previous):
                return
            self._forecast = previous  # failed: keep the previous forecast for this step
            return
        if self._res is None:
            self._forecast = self.ema.predict()
            return
        try:
            with _quiet():
                self._res = self._res.extend(np.asarray(self._unapplied, dtype=float))
                forecast = float(self._res.forecast(1)[0])
            self._covered += self._unapplied
            del self._covered[: max(len(self._covered) - _COVERED * self.window, 0)]  # refits keep failing
            self._unapplied = []
        except Exception as exc:  # noqa: BLE001 - statsmodels raises many kinds; fall back
            logger.warning("ARIMA%s could not carry its model forward (%s: %s); keeping the "
                           "previous forecast %.4g", self.order, type(exc).__name__, exc, previous)
            self._res, self._forecast, self._covered = None, previous, []
            return
        self._forecast = forecast if math.isfinite(forecast) else previous

    def _refit(self, previous: float) -> bool:
        data = np.asarray(self.history, dtype=float)
        start = self.params if self.params is not None and np.all(np.isfinite(self.params)) else None
        self._since_fit = 0
        try:
            res = self._fit(data, start)
            params = np.asarray(res.params, dtype=float)
            with _quiet():
                forecast = float(res.forecast(1)[0])
            if not (np.all(np.isfinite(params)) and math.isfinite(forecast)):
                raise ValueError(f"non-finite parameters {params.tolist()} or forecast {forecast}")
        except Exception as exc:  # noqa: BLE001 - any failed fit falls back, as documented
            self.failures += 1
            logger.warning("ARIMA%s fit on %d observations failed (%s: %s); keeping the previous "
                           "forecast %.4g", self.order, len(data), type(exc).__name__, exc, previous)
            return False
        self.fits += 1
        self.params, self._res, self._unapplied, self._covered = params, res, [], data.tolist()
        self._forecast = forecast
        logger.debug("ARIMA%s refit on %d observations: forecast %.4g", self.order, len(data), forecast)
        return True

    def _predict(self):
        return self._forecast

    # -- state ----------------------------------------------------------------------------
    def _save_state(self):
        return {"order": list(self.order), "ema": self.ema.save_state(), "history": list(self.history),
                "params": None if self.params is None else self.params.tolist(),
                "covered": list(self._covered) if self._res is not None else None,
                "unapplied": list(self._unapplied), "since_fit": self._since_fit,
                "forecast": plainstate.num(self._forecast), "fits": self.fits, "failures": self.failures}

    def _load_state(self, state):
        what = f"the {self.name} predictor"
        order = tuple(plainstate.field(state, "order", what))
        if order != self.order:
            raise ValueError(f"{what}: the saved model is ARIMA{order}, this one ARIMA{self.order}")
        ema = EMA(self.ema.alpha)
        ema.restore_state(plainstate.field(state, "ema", what))
        history = [float(v) for v in plainstate.field(state, "history", what)][-self.window:]
        params = state.get("params")
        params = None if params is None else np.asarray(params, dtype=float)
        covered = state.get("covered")
        res = None
        if params is not None and covered:
            try:
                with _quiet():
                    from statsmodels.tsa.arima.model import ARIMA

                    res = ARIMA(np.asarray(covered, dtype=float), order=self.order).filter(params)
            except Exception as exc:  # noqa: BLE001 - a wrong parameter count, or statsmodels
                raise ValueError(f"{what}: the saved ARIMA{self.order} parameters do not rebuild "
                                 f"its model ({type(exc).__name__}: {exc})") from None
        values = dict(ema=ema, history=history, params=params, _res=res,
                      _covered=[float(v) for v in covered] if res is not None else [],
                      _unapplied=[float(v) for v in state.get("unapplied", [])],
                      _since_fit=int(state.get("since_fit", 0)),
                      _forecast=plainstate.unnum(state.get("forecast")),
                      fits=int(state.get("fits", 0)), failures=int(state.get("failures", 0)))
        return lambda: self.__dict__.update(values)

    def describe(self):
        return {"name": self.name, "order": list(self.order), "refit_every": self.refit_every,
                "window": self.window, "fits": self.fits, "failures": self.failures}
