"""The models the main job can train (tf_keras, which runs under ParameterServerStrategy)."""

from __future__ import annotations

import tf_keras as keras

MODELS = ("cnn", "mlp", "linear")


def build_model(name: str, input_shape, num_classes: int, seed: int = 0) -> keras.Model:
    """A small model by name: ``cnn`` (2 conv + 2 dense), ``mlp`` (2 hidden), ``linear``."""
    init = keras.initializers.GlorotUniform(seed=seed)
    L = keras.layers
    if name == "cnn":
        layers = [
            L.Conv2D(16, 5, activation="relu", kernel_initializer=init),
            L.MaxPooling2D(2),
            L.Conv2D(32, 5, activation="relu", kernel_initializer=init),
            L.MaxPooling2D(2),
            L.Flatten(),
            L.Dense(64, activation="relu", kernel_initializer=init),
            L.Dense(num_classes, kernel_initializer=init),
        ]
    elif name == "mlp":
        layers = [L.Flatten(), L.Dense(128, activation="relu", kernel_initializer=init),
                  L.Dense(64, activation="relu", kernel_initializer=init),
                  L.Dense(num_classes, kernel_initializer=init)]
    elif name == "linear":
        layers = [L.Flatten(), L.Dense(num_classes, kernel_initializer=init)]
    else:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    return keras.Sequential([L.Input(tuple(input_shape)), *layers], name=name)
