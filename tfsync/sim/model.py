"""A small model the simulator trains in NumPy: an MLP (0 or more ReLU hidden layers; 0
is multi-class logistic regression) with softmax cross-entropy (RLP §4 trains
such MLPs on MNIST in its simulated cluster).

Gradients are taken at the weights current when a step starts, so the staleness a
policy's schedule implies is the staleness the model sees.
"""

from __future__ import annotations

import numpy as np


class NumpyMLP:
    """``NumpyMLP(x_train, y_train, x_test, y_test)``; inputs are flattened and scaled to
    [0, 1] when they are integers. ``hidden``: units of one hidden layer, or a sequence
    of them (``()`` = logistic regression). ``eval_size`` test examples are used for
    accuracy."""

    def __init__(self, x_train, y_train, x_test, y_test, hidden=64, seed: int = 0,
                 eval_size: int = 2000):
        def prep(x):
            x = np.asarray(x).reshape(len(x), -1)
            return (x / 255.0 if x.dtype.kind in "ui" else x).astype(np.float32)

        self.x, self.y = prep(x_train), np.asarray(y_train).astype(np.int64).ravel()
        # A seeded random subset: test sets may be sorted by class (the CIFAR-10 subset is).
        pick = np.sort(np.random.default_rng([seed, 1]).permutation(len(x_test))[:eval_size])
        self.x_test = prep(np.asarray(x_test)[pick])
        self.y_test = np.asarray(y_test).astype(np.int64).ravel()[pick]
        classes = int(max(self.y.max(), self.y_test.max())) + 1
        rng = np.random.default_rng(seed)
        sizes = [self.x.shape[1], *([hidden] if isinstance(hidden, int) else hidden), classes]
        self.params = []  # [w1, b1, w2, b2, ...]: Glorot-uniform weights, zero biases, as Keras' Dense
        for a, b in zip(sizes, sizes[1:]):
            self.params += [rng.uniform(-1, 1, (a, b)).astype(np.float32) * np.sqrt(6 / (a + b)),
                            np.zeros(b, np.float32)]
        self.seed = seed
        self._streams: dict[int, tuple[np.random.Generator, list]] = {}

    def _batch(self, worker: int, size: int) -> np.ndarray:
        """The next ``size`` example indices of this worker's own shuffled stream."""
        rng, buf = self._streams.setdefault(
            worker, (np.random.default_rng([self.seed, worker]), []))
        while len(buf) < size:
            buf.extend(rng.permutation(len(self.x)).tolist())
        idx, buf[:size] = buf[:size], []
        return np.asarray(idx)

    def _forward(self, x):
        """(inputs of every layer, logits)."""
        acts = [x]
        for k in range(0, len(self.params) - 2, 2):
            acts.append(np.maximum(acts[-1] @ self.params[k] + self.params[k + 1], 0.0))
        return acts, acts[-1] @ self.params[-2] + self.params[-1]

    def gradient(self, worker: int, batch_size: int):
        """(gradients, loss) of one minibatch of ``worker`` at the current weights."""
        idx = self._batch(worker, batch_size)
        x, y = self.x[idx], self.y[idx]
        acts, logits = self._forward(x)
        logits = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        p[np.arange(len(y)), y] -= 1.0
        delta = p / len(y)  # d loss / d logits
        grads = []
        for k in range(len(acts) - 1, -1, -1):  # back through the layers
            grads[:0] = [acts[k].T @ delta, delta.sum(0)]
            if k:
                delta = (delta @ self.params[2 * k].T) * (acts[k] > 0)
        return grads, loss

    def apply(self, grads, step_size: float) -> None:
        if grads is None:
            return
        for param, g in zip(self.params, grads):  # in place: no temporaries
            g *= step_size
            param -= g

    @staticmethod
    def weighted_mean(items):
        """sum(b_i g_i) / sum(b_i) over (b_i, g_i) (LB-BSP eq. 8)."""
        total = sum(b for b, _ in items)
        return [sum(b * g[k] for b, g in items) / total for k in range(len(items[0][1]))]

    def accuracy(self) -> float:
        _, logits = self._forward(self.x_test)
        return float((logits.argmax(axis=1) == self.y_test).mean())
