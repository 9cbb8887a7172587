"""A wide MLP for MNIST (bench_testbed.py): a step moves hidden * (784 + hidden) weights
each way, so communication weighs more than compute."""

import tf_keras as keras


def build(hidden=512, layers=2):
    L = keras.layers
    return keras.Sequential([L.Input((28, 28, 1)), L.Flatten(),
                             *[L.Dense(hidden, activation="relu") for _ in range(layers)], L.Dense(10)])
