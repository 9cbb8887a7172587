"""The small networks of the learned predictors: built and trained in tf_keras, run in
NumPy. This is the only module of tfsync.predict that imports TensorFlow, and only
inside the training functions, so policies and the simulator stay TF-free.

Architectures (LB-BSP §3.2.1 and §5.4):
- ``narx``: one hidden tanh layer over the 8 NARX inputs, linear output (2 hidden units:
  8*2 + 2 + 2 + 1 = 21 parameters; the paper keeps it under about 20);
- ``rnn`` / ``lstm``: SimpleRNN / LSTM over the last 2 speeds (look-back 2), linear output.
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np

logger = logging.getLogger(__name__)

KINDS = ("narx", "rnn", "lstm")
_build_lock = threading.Lock()  # Keras' layer naming and graph state are global
_threads_set = False


def limit_tf_threads(threads: int | None) -> None:
    """Keep TF's intra/inter-op pools at ``threads`` if TF is not initialised yet; once
    it is (the engine's coordinator), training shares its pools and this only logs."""
    global _threads_set
    if threads is None or _threads_set:
        return
    _threads_set = True
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(int(threads))
        tf.config.threading.set_inter_op_parallelism_threads(int(threads))
    except RuntimeError:
        logger.debug("TensorFlow already initialised; predictor training shares its thread pools")


def shapes(kind: str, n_inputs: int, units: int) -> list[tuple[int, ...]]:
    """The shapes of ``build(kind, n_inputs, units)``'s weights, in Keras' order."""
    if kind == "narx":
        return [(n_inputs, units), (units,), (units, 1), (1,)]
    if kind not in KINDS:
        raise ValueError(f"unknown network kind {kind!r}; valid: {', '.join(KINDS)}")
    gates = units * (4 if kind == "lstm" else 1)  # LSTM: i, f, c, o side by side
    return [(1, gates), (units, gates), (gates,), (units, 1), (1,)]


def build(kind: str, n_inputs: int, units: int, learning_rate: float = 0.01, seed: int = 0):
    """A compiled tf_keras model of ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"unknown network kind {kind!r}; valid: {', '.join(KINDS)}")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tf_keras as keras

    init = keras.initializers.GlorotUniform(seed=seed)
    with _build_lock:
        if kind == "narx":
            layers = [keras.layers.Input((n_inputs,)),
                      keras.layers.Dense(units, activation="tanh", kernel_initializer=init)]
        else:
            cls = keras.layers.SimpleRNN if kind == "rnn" else keras.layers.LSTM
            layers = [keras.layers.Input((n_inputs, 1)), cls(units, kernel_initializer=init)]
        model = keras.Sequential(layers + [keras.layers.Dense(1, kernel_initializer=init)])
        model.compile(keras.optimizers.Adam(learning_rate), "mse")
    return model


def fit(model, x: np.ndarray, y: np.ndarray, *, epochs: int = 200, batch_size: int = 32,
        min_delta: float = 1e-4, patience: int = 4, min_epochs: int = 0,
        seed: int | None = None) -> tuple[list[np.ndarray], int, float]:
    """Train until the loss improves by less than ``min_delta`` for ``patience`` epochs
    in a row (LB-BSP §4.2: 1e-4 for 4 steps) or ``epochs`` pass. ``seed``: the
    batches are shuffled in an order fixed by it (TF's op-level seed), so a fit gives
    the same weights in any process, whatever else draws random numbers.
    Returns (weights, epochs run, final loss)."""
    import tf_keras as keras

    stop = keras.callbacks.EarlyStopping("loss", min_delta=min_delta, patience=patience,
                                         start_from_epoch=min_epochs, restore_best_weights=True)
    x, y = x.astype(np.float32), y.astype(np.float32).reshape(-1, 1)
    if seed is None:
        hist = model.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=0, shuffle=True, callbacks=[stop])
    else:
        import tensorflow as tf

        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(
            len(x), seed=int(seed) % 2 ** 31, reshuffle_each_iteration=True).batch(batch_size)
        hist = model.fit(data, epochs=epochs, verbose=0, callbacks=[stop])
    losses = hist.history["loss"]
    return [np.array(w) for w in model.get_weights()], len(losses), float(losses[-1])


def fit_lbfgs(kind: str, weights, x: np.ndarray, y: np.ndarray, *, max_iter: int = 200,
              tol: float = 1e-9) -> tuple[list[np.ndarray], int, float]:
    """Full-batch least squares of the ``narx`` network (one tanh layer, linear output)
    by SciPy's L-BFGS-B from ``weights`` (Keras' order: W1, b1, W2, b2), with the exact
    gradient in NumPy. Beyond the paper (issue 19): the paper's fit (Keras Adam, mini-batches,
    early stopping) costs about a second of CPU for this 21-parameter model, nearly all of
    it per-batch overhead; this one costs milliseconds and lands at least as low on the
    training loss (tests/test_predict.py). Returns (weights, iterations, final loss)."""
    if kind != "narx":
        raise ValueError(f"fit='lbfgs' fits the narx network only, not {kind!r}; use fit='adam'")
    from scipy.optimize import minimize

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    shapes = [np.shape(w) for w in weights]
    sizes = [int(np.prod(s)) for s in shapes]
    n = len(y)

    def unpack(theta):
        out, i = [], 0
        for shape, size in zip(shapes, sizes):
            out.append(theta[i:i + size].reshape(shape))
            i += size
        return out

    def loss_grad(theta):
        w1, b1, w2, b2 = unpack(theta)
        h = np.tanh(x @ w1 + b1)
        err = (h @ w2 + b2)[:, 0] - y
        d_out = (2.0 / n) * err[:, None]  # d mean(err^2) / d output
        d_pre = (d_out @ w2.T) * (1.0 - h * h)
        grad = [x.T @ d_pre, d_pre.sum(axis=0), h.T @ d_out, d_out.sum(axis=0)]
        return float(np.mean(err * err)), np.concatenate([g.ravel() for g in grad])

    theta0 = np.concatenate([np.asarray(w, dtype=np.float64).ravel() for w in weights])
    res = minimize(loss_grad, theta0, jac=True, method="L-BFGS-B",
                   options={"maxiter": int(max_iter), "ftol": tol, "gtol": 1e-7})
    return [np.array(w) for w in unpack(res.x)], int(res.nit), float(res.fun)


def glorot(n_inputs: int, units: int, seed: int = 0) -> list[np.ndarray]:
    """Initial ``narx`` weights as Keras' GlorotUniform and zero biases would draw them
    (NumPy's generator: the same distribution, not Keras' numbers)."""
    rng = np.random.default_rng(seed)
    a1, a2 = np.sqrt(6.0 / (n_inputs + units)), np.sqrt(6.0 / (units + 1))
    return [rng.uniform(-a1, a1, (n_inputs, units)), np.zeros(units),
            rng.uniform(-a2, a2, (units, 1)), np.zeros(1)]


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def forward(kind: str, weights, x: np.ndarray) -> np.ndarray:
    """The model's output for inputs ``x`` (rows), in NumPy, from Keras' weight list."""
    x = np.asarray(x, dtype=np.float64)
    if kind == "narx":
        w1, b1, w2, b2 = weights
        return (np.tanh(x @ w1 + b1) @ w2 + b2)[:, 0]
    if kind == "rnn":  # h_t = tanh(x_t W + h_{t-1} U + b)
        w, u, b, wo, bo = weights
        h = np.zeros((x.shape[0], u.shape[0]))
        for t in range(x.shape[1]):
            h = np.tanh(x[:, t, :] @ w + h @ u + b)
        return (h @ wo + bo)[:, 0]
    if kind == "lstm":  # Keras gate order i, f, c, o; sigmoid recurrent activation
        w, u, b, wo, bo = weights
        n = u.shape[0]
        h = np.zeros((x.shape[0], n))
        c = np.zeros_like(h)
        for t in range(x.shape[1]):
            z = x[:, t, :] @ w + h @ u + b
            i, f = _sigmoid(z[:, :n]), _sigmoid(z[:, n:2 * n])
            g, o = np.tanh(z[:, 2 * n:3 * n]), _sigmoid(z[:, 3 * n:])
            c = f * c + i * g
            h = o * np.tanh(c)
        return (h @ wo + bo)[:, 0]
    raise ValueError(f"unknown network kind {kind!r}; valid: {', '.join(KINDS)}")
