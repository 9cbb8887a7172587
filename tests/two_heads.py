"""A model with a regression head and a classification head, trained from a data function's
arrays with the labels as a dict (tests/test_usercode.py, tests/test_engine.py)."""

import numpy as np
import tensorflow as tf
import tf_keras as keras


def data(n=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    value = (x @ np.linspace(-1, 1, 5, dtype=np.float32) * 0.3 + 0.49).astype(np.float32)  # float targets
    kind = rng.integers(0, 3, n).astype(np.int64)  # class ids
    return x, {"value": value, "kind": kind}


def build():
    init = keras.initializers.GlorotUniform(seed=1)
    inputs = keras.layers.Input((5,))
    return keras.Model(inputs, {"value": keras.layers.Dense(1, kernel_initializer=init)(inputs),
                                "kind": keras.layers.Dense(3, kernel_initializer=init)(inputs)})


def loss(y, out):
    """Per example: squared error of the value head plus cross-entropy of the class head."""
    return (keras.losses.mean_squared_error(tf.reshape(y["value"], (-1, 1)), out["value"])
            + keras.losses.sparse_categorical_crossentropy(y["kind"], out["kind"], from_logits=True))


def uneven():
    x, y = data()
    return x, {"value": y["value"][:-1], "kind": y["kind"]}


def a_list_inside():
    x, y = data()
    return x, {"value": y["value"], "kind": list(y["kind"])}
