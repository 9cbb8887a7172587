"""Training instances for the learned policy: a simulated cluster plus the model it
trains (RLP §4, "Instance Generation Method").

An instance is 10 workers, each of which is a straggler with probability 0.3; a
straggler sleeps N(mean, mean / 4) seconds in every step, its mean drawn once per
instance. The model is an MLP with h in {0, 1, 2, 3} hidden layers of 256 ReLU units on
a random half of MNIST, plain SGD with batch 16 and learning rate 0.01, and the episode
ends when validation accuracy reaches 88 %.

Everything is drawn from the instance seed, so an instance is the same cluster and
model for every policy evaluated on it. TF-free.
"""

from __future__ import annotations

import functools
import random
from dataclasses import asdict, dataclass, replace

import numpy as np

from ..sim.model import NumpyMLP
from ..sim.simulator import Simulator
from ..sim.speeds import SpeedModel


@dataclass(frozen=True)
class InstanceSpec:
    """What varies between instances, and its RLP §4 default.

    ``hidden_layers``: the choices of h (one is drawn per instance); ``units`` per layer.
    ``step_time``: a normal worker's step (compute + pull + push) in seconds, with
    log-normal ``jitter``; a straggler adds N(m, m / 4), m ~ U(``sleep``).
    """

    workers: int = 10
    straggler_p: float = 0.3
    step_time: float = 5.0
    jitter: float = 0.05
    sleep: tuple[float, float] = (5.0, 20.0)
    hidden_layers: tuple[int, ...] = (0, 1, 2, 3)
    units: int = 256
    dataset: str = "mnist"
    data_fraction: float = 0.5
    batch_size: int = 16
    lr: float = 0.01
    target: float = 0.88
    eval_every: int = 20  # updates between validation measurements
    eval_size: int = 1000
    max_time: float = 1e6  # simulated seconds; an episode that has not converged stops

    def with_(self, **changes) -> "InstanceSpec":
        return replace(self, **changes)

    def describe(self) -> dict:
        return asdict(self)


@dataclass
class Instance:
    """One drawn instance: its seed, stragglers, layer count, and a fresh simulator."""

    seed: int
    hidden: tuple[int, ...]
    stragglers: tuple[int, ...]
    sim: Simulator
    spec: InstanceSpec

    def run(self, policy):
        """Train until the target accuracy (or ``max_time``); returns the SimResult."""
        return self.sim.run(policy, accuracy=self.spec.target, time=self.spec.max_time)


@functools.lru_cache(maxsize=4)
def _data(name: str):
    from ..base.data import load

    d = load(name)
    flat = lambda x: np.ascontiguousarray(x.reshape(len(x), -1), dtype=np.float32)  # noqa: E731
    return flat(d.x_train), d.y_train, flat(d.x_test), d.y_test


def make_instance(spec: InstanceSpec, seed: int, data=None) -> Instance:
    """Draw instance ``seed`` of ``spec``. ``data``: (x_train, y_train, x_val, y_val)
    arrays to use instead of loading ``spec.dataset``."""
    rng = random.Random(seed)
    stragglers = tuple(w for w in range(spec.workers) if rng.random() < spec.straggler_p)
    means = [rng.uniform(*spec.sleep) if w in stragglers else 0.0 for w in range(spec.workers)]
    hidden = (spec.units,) * rng.choice(spec.hidden_layers)
    xtr, ytr, xval, yval = data if data is not None else _data(spec.dataset)
    half = np.random.default_rng(seed).permutation(len(ytr))[: int(spec.data_fraction * len(ytr))]
    model = NumpyMLP(xtr[half], ytr[half], xval, yval, hidden=hidden, seed=seed,
                     eval_size=spec.eval_size)
    speeds = SpeedModel(fixed=spec.step_time, per_sample=0.0, jitter=spec.jitter,
                        straggle_p=1.0 if stragglers else 0.0, straggle_mean=means,
                        straggle_std=[m / 4 for m in means], seed=seed)
    sim = Simulator(spec.workers, speeds, model=model, lr=spec.lr, eval_every=spec.eval_every,
                    record=False)
    return Instance(seed, hidden, stragglers, sim, spec)
