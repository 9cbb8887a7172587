"""A small model the simulator trains in NumPy: a one-hidden-layer MLP with softmax
cross-entropy (paper 004 §4 trains an MLP on MNIST in its simulated cluster).

Gradients are taken at the weights current when a step starts, so the staleness a
policy's schedule implies is the staleness the model sees.
"""

from __future__ import annotations

import numpy as np


class NumpyMLP:
    """``NumpyMLP(x_train, y_train, x_test, y_test)``; inputs are flattened and scaled to
    [0, 1] when they are integers. ``eval_size`` test examples are used for accuracy."""

    def __init__(self, x_train, y_train, x_test, y_test, hidden: int = 64, seed: int = 0,
                 eval_size: int = 2000):
        def prep(x):
            x = np.asarray(x).reshape(len(x), -1)
            return (x / 255.0 if x.dtype.kind in "ui" else x).astype(np.float32)

        self.x, self.y = prep(x_train), np.asarray(y_train).astype(np.int64).ravel()
        self.x_test = prep(x_test)[:eval_size]
        self.y_test = np.asarray(y_test).astype(np.int64).ravel()[:eval_size]
        classes = int(max(self.y.max(), self.y_test.max())) + 1
        rng = np.random.default_rng(seed)
        d = self.x.shape[1]
        self.params = [  # Glorot-uniform weights, zero biases, as Keras' Dense
            rng.uniform(-1, 1, (d, hidden)).astype(np.float32) * np.sqrt(6 / (d + hidden)),
            np.zeros(hidden, np.float32),
            rng.uniform(-1, 1, (hidden, classes)).astype(np.float32) * np.sqrt(6 / (hidden + classes)),
            np.zeros(classes, np.float32),
        ]
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
        w1, b1, w2, b2 = self.params
        h = np.maximum(x @ w1 + b1, 0.0)
        return h, h @ w2 + b2

    def gradient(self, worker: int, batch_size: int):
        """(gradients, loss) of one minibatch of ``worker`` at the current weights."""
        idx = self._batch(worker, batch_size)
        x, y = self.x[idx], self.y[idx]
        h, logits = self._forward(x)
        logits = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        p[np.arange(len(y)), y] -= 1.0
        p /= len(y)
        w2 = self.params[2]
        dh = (p @ w2.T) * (h > 0)
        return [x.T @ dh, dh.sum(0), h.T @ p, p.sum(0)], loss

    def apply(self, grads, step_size: float) -> None:
        if grads is None:
            return
        for param, g in zip(self.params, grads):
            param -= step_size * g

    @staticmethod
    def weighted_mean(items):
        """sum(b_i g_i) / sum(b_i) over (b_i, g_i) (paper 002 eq. 8)."""
        total = sum(b for b, _ in items)
        return [sum(b * g[k] for b, g in items) / total for k in range(len(items[0][1]))]

    def accuracy(self) -> float:
        _, logits = self._forward(self.x_test)
        return float((logits.argmax(axis=1) == self.y_test).mean())
