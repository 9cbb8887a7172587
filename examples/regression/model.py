"""A regression job of your own, as tfsync sees it: a data function and a model function
in a module outside the tfsync package, named by file path in job.toml beside it.

    tfsync run examples/regression/job.toml

The functions after `build` are mistakes on purpose, for tests/test_usercode.py."""

import numpy as np
import tensorflow as tf
import tf_keras as keras

import tfsync

NOT_A_FUNCTION = 3


def data(n=512, features=20, seed=0):
    """Float regression targets (y = x.w / 2 + 0.25): nothing here is a class id."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = (x @ np.linspace(-1, 1, features).astype(np.float32) * 0.5 + 0.25).astype(np.float32)
    return (x[:448], y[:448]), (x[448:], y[448:])


def build(features=20, units=8):
    return keras.Sequential([keras.layers.Input((features,)), keras.layers.Dense(units, activation="relu"),
                             keras.layers.Dense(1)])


def not_a_model():
    return {"layers": 2}


def a_list():
    return [1, 2, 3]


def not_a_dataset():
    return tfsync.DatasetFactory(lambda context: [1, 2, 3], examples=3)


def not_pairs():
    return tfsync.DatasetFactory(lambda context: tf.data.Dataset.range(3), examples=3)
