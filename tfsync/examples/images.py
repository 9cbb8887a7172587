"""MNIST and CIFAR-10 and three small classifiers: the bundled workload, ordinary user code.

``data.name = "mnist"`` is ``data.fn = "tfsync.examples.images:mnist"`` with ``args =
{path = data.path}``; ``model.name = "cnn"`` is ``model.fn = "tfsync.examples.images:cnn"``
with the input shape and classes of the data and ``job.seed`` as ``args``
(``tfsync.engine.workload``). Named by reference, they take the same arguments.
"""

from __future__ import annotations

import tf_keras as keras

from ..base.data import load


def mnist(path: str | None = None) -> dict:
    """MNIST as float32 images (N, 28, 28, 1) in [0, 1] and int64 labels, from ``path`` (a
    .npz or a directory of IDX files) or tfsync.base.data's default search (``$TFSYNC_DATA_DIR``,
    ../shared/data, the bundled 6000-image sample)."""
    return _arrays(load("mnist", path))


def cifar10(path: str | None = None) -> dict:
    """CIFAR-10 as float32 images (N, 32, 32, 3) in [0, 1] and int64 labels (as ``mnist``)."""
    return _arrays(load("cifar10", path))


def _arrays(d) -> dict:
    return {"x_train": d.x_train, "y_train": d.y_train, "x_test": d.x_test, "y_test": d.y_test, "source": d.source}


def cnn(input_shape, classes: int, seed: int = 0) -> keras.Model:
    """2 conv + 2 dense layers, logits over ``classes``."""
    init = keras.initializers.GlorotUniform(seed=seed)
    L = keras.layers
    return _sequential("cnn", input_shape, [
        L.Conv2D(16, 5, activation="relu", kernel_initializer=init),
        L.MaxPooling2D(2),
        L.Conv2D(32, 5, activation="relu", kernel_initializer=init),
        L.MaxPooling2D(2),
        L.Flatten(),
        L.Dense(64, activation="relu", kernel_initializer=init),
        L.Dense(classes, kernel_initializer=init)])


def mlp(input_shape, classes: int, seed: int = 0) -> keras.Model:
    """Two hidden layers (128, 64), logits over ``classes``."""
    init = keras.initializers.GlorotUniform(seed=seed)
    L = keras.layers
    return _sequential("mlp", input_shape, [L.Flatten(), L.Dense(128, activation="relu", kernel_initializer=init),
                                            L.Dense(64, activation="relu", kernel_initializer=init),
                                            L.Dense(classes, kernel_initializer=init)])


def linear(input_shape, classes: int, seed: int = 0) -> keras.Model:
    """Logits as one dense layer of the flattened input."""
    init = keras.initializers.GlorotUniform(seed=seed)
    return _sequential("linear", input_shape, [keras.layers.Flatten(),
                                               keras.layers.Dense(classes, kernel_initializer=init)])


def _sequential(name: str, input_shape, layers: list) -> keras.Model:
    return keras.Sequential([keras.layers.Input(tuple(input_shape)), *layers], name=name)
