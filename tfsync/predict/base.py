"""The predictor interface: one object per worker, fed one observation per step.

``update(speed, cpu, mem)`` gives the worker's latest sample processing speed (samples/s
of the step that just ended) and, where a monitor provides them, the CPU and memory
usage (percent) read when that step ended, i.e. the resources the *next* step starts
with (LB-BSP Alg. 1 line 3 pushes v^{k-1} together with c^k, m^k). ``predict()``
returns the speed expected for the next step. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import logging
import math

from ..base import plainstate

logger = logging.getLogger(__name__)


class NoObservation(RuntimeError):
    """``predict()`` was called before any ``update()``."""


def check_observation(speed, cpu, mem) -> tuple[float, float | None, float | None]:
    """Validated (speed, cpu, mem); raises ValueError with what was received."""
    s = float(speed)
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"speed must be a finite number >= 0 (samples/s), got {speed!r}; "
                         "skip steps whose compute time is 0")
    out = [s]
    for name, v in (("cpu", cpu), ("mem", mem)):
        if v is None:
            out.append(None)
            continue
        f = float(v)
        if not math.isfinite(f):
            raise ValueError(f"{name} must be a finite percentage or None, got {v!r}")
        out.append(f)
    return out[0], out[1], out[2]


class Predictor:
    """Base class. Subclasses implement ``_update`` and ``_predict``; ``count`` is the
    number of observations so far."""

    name = "predictor"

    def __init__(self):
        self.count = 0

    def update(self, speed: float, cpu: float | None = None, mem: float | None = None) -> None:
        speed, cpu, mem = check_observation(speed, cpu, mem)
        self.count += 1
        self._update(speed, cpu, mem)

    def predict(self) -> float:
        """The next step's speed (samples/s)."""
        if self.count == 0:
            raise NoObservation(f"{self.name} predictor has no observation yet; call update() first")
        return float(self._predict())

    def describe(self) -> dict:
        return {"name": self.name}

    # -- state kept across restarts (the contract of tfsync.policy.base.Policy.save_state) --
    state_version = 1

    def save_state(self) -> dict:
        """What this predictor learned (observations, fitted model, counters) as JSON's
        types, headed ``{"predictor": name, "version": v}``; ``{}`` where it keeps none."""
        body = self._save_state()
        return {} if body is None else {**plainstate.header("predictor", self.name, self.state_version),
                                        "count": self.count, **body}

    def restore_state(self, state: dict) -> None:
        """Take back ``save_state``'s dict on a predictor built with the same options;
        ValueError, restoring nothing, for another predictor kind, format version or model
        shape."""
        if not state:
            return
        if type(self)._save_state is Predictor._save_state:
            raise ValueError(f"the {self.name} predictor keeps no state, but one was given")
        state = plainstate.check(state, "predictor", self.name, self.state_version,
                                 what=f"the {self.name} predictor")
        count = int(plainstate.field(state, "count", self.name))
        apply = self._load_state(state)
        apply()
        self.count = count

    def _save_state(self) -> dict | None:
        return None

    def _load_state(self, state: dict) -> plainstate.Apply:
        """Check ``state``; return what applies it, changing nothing before."""
        raise NotImplementedError

    def _update(self, speed: float, cpu: float | None, mem: float | None) -> None:
        raise NotImplementedError

    def _predict(self) -> float:
        raise NotImplementedError


class LastValue(Predictor):
    """Memoryless: the next speed is the last one (LB-BSP §3.2.1, Table 3)."""

    name = "last"

    def __init__(self):
        super().__init__()
        self.last = math.nan

    def _update(self, speed, cpu, mem):
        self.last = speed

    def _predict(self):
        return self.last

    def _save_state(self):
        return {"last": plainstate.num(self.last)}

    def _load_state(self, state):
        last = plainstate.unnum(plainstate.field(state, "last", self.name))
        return lambda: setattr(self, "last", last)


class EMA(Predictor):
    """Exponential moving average, ``alpha`` the weight of the newest observation
    (LB-BSP §5.4: alpha = 0.2). The first observation is taken as it is."""

    name = "ema"

    def __init__(self, alpha: float = 0.2):
        super().__init__()
        if not 0.0 < float(alpha) <= 1.0:
            raise ValueError(f"EMA alpha must be in (0, 1], got {alpha!r}; 0.2 is the paper's value")
        self.alpha = float(alpha)
        self.value = math.nan

    def _update(self, speed, cpu, mem):
        self.value = speed if self.count == 1 else self.alpha * speed + (1 - self.alpha) * self.value

    def _predict(self):
        return self.value

    def _save_state(self):
        return {"value": plainstate.num(self.value)}

    def _load_state(self, state):
        value = plainstate.unnum(plainstate.field(state, "value", self.name))
        return lambda: setattr(self, "value", value)

    def describe(self):
        return {"name": self.name, "alpha": self.alpha}
