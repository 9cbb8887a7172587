"""CIFAR-10 with a small ResNet (ResNet-20 style), SGD with momentum and step decay:
a data function and a model function of your own, named by file path in job.toml.

    tfsync run examples/cifar10_resnet/job.toml

`data` reads a Keras-format CIFAR-10 .npz (x_train, y_train, x_test, y_test; uint8
images): `path` if given (relative to this file), else ../shared/data/cifar10_subset.npz
beside the repository (10 000 train / 2 000 test), else what tfsync.load_dataset("cifar10")
finds ($TFSYNC_DATA_DIR/cifar10.npz, ...). Images come back as float32 in [0, 1], which
tfsync ships to the workers as 8-bit records; `subtract_mean=True` also subtracts the
per-channel training mean (the arrays then travel as float32, 4x the bytes). The
training set is put in a fixed random order (`seed`; the .npz may be sorted by class),
and `limit` keeps the first N examples of it (for tests).

`build` is ResNet-(6n+2) of He et al. 2016 for CIFAR: a 3x3 convolution, three stages of
`depth` (= n) basic blocks with `width`, 2x`width`, 4x`width` filters (stride 2 into
stages 2 and 3, 1x1 projection shortcuts), batch normalization after every convolution,
global average pooling and a dense layer of 10 logits. depth=3, width=16 is ResNet-20
(0.27 M parameters).

Batch normalization works under the engine: in a step (`training=True`) each worker
normalizes with its own batch's statistics and assigns the layer's moving mean and
variance (non-trainable variables on the PS) as it runs, so the moving averages follow
every worker's batches, in every protocol; the optimizer updates only the trainable
variables. Evaluation (`training=False`) uses the moving averages. The moving averages
are not part of BSP's aggregated update (each worker's step moves them at once, as in
native ParameterServerStrategy training). Weight decay may be a `kernel_regularizer`
(its `model.losses` are added to each step's loss, as `model.fit` adds them) or the
optimizer's `weight_decay`.
"""

from __future__ import annotations

import os

import numpy as np
import tf_keras as keras

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_NPZ = os.path.join(HERE, "..", "..", "..", "shared", "data", "cifar10_subset.npz")


def data(path: str | None = None, limit: int | None = None, subtract_mean: bool = False, seed: int = 0):
    """((x_train, y_train), (x_test, y_test)): float32 images (N, 32, 32, 3), int64 labels."""
    import tfsync

    if path is not None:
        path = os.path.join(HERE, os.path.expanduser(path))  # an absolute path stays as it is
    elif os.path.exists(DEFAULT_NPZ):
        path = DEFAULT_NPZ
    d = tfsync.load_dataset("cifar10", path)  # path None: $TFSYNC_DATA_DIR, then ../shared/data
    x_train, y_train = np.asarray(d.x_train, np.float32), np.asarray(d.y_train, np.int64)
    x_test, y_test = np.asarray(d.x_test, np.float32), np.asarray(d.y_test, np.int64)
    order = np.random.default_rng(seed).permutation(len(y_train))[:limit]  # a fixed order, then the first N
    x_train, y_train = x_train[order], y_train[order]
    if subtract_mean:
        mean = x_train.mean(axis=(0, 1, 2), dtype=np.float64).astype(np.float32)
        x_train, x_test = x_train - mean, x_test - mean
    return (x_train, y_train), (x_test, y_test)


def build(depth: int = 3, width: int = 16, classes: int = 10, seed: int = 0):
    """ResNet-(6 depth + 2) with `width` filters in its first stage; logits out."""
    init = keras.initializers.HeNormal(seed=seed)
    counter = iter(range(10_000))

    def conv(x, filters, kernel=3, strides=1):
        he = keras.initializers.HeNormal(seed=seed + next(counter))  # one seed per layer
        return keras.layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                                   kernel_initializer=he)(x)

    def bn(x):
        return keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)

    inputs = keras.layers.Input((32, 32, 3))
    x = keras.layers.ReLU()(bn(conv(inputs, width)))
    for stage in range(3):
        filters = width * 2 ** stage
        for block in range(depth):
            strides = 2 if stage > 0 and block == 0 else 1
            y = keras.layers.ReLU()(bn(conv(x, filters, strides=strides)))
            y = bn(conv(y, filters))
            if strides != 1 or x.shape[-1] != filters:  # projection shortcut (option B)
                x = bn(conv(x, filters, kernel=1, strides=strides))
            x = keras.layers.ReLU()(keras.layers.Add()([x, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(classes, kernel_initializer=init)(x)
    return keras.Model(inputs, outputs, name=f"resnet{6 * depth + 2}")
