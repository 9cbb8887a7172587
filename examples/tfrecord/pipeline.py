"""A tf.data input pipeline of your own: TFRecord shards that every worker reads and
decodes itself, each its own share of the shards.

    tfsync run examples/tfrecord/job.toml

`data` writes MNIST (the bundled 6 000-image sample, or the .npz given as `npz`) as
TFRecord shards once (in `shards`, relative to this file), then returns a `tfsync.DatasetFactory`: a function that builds the
pipeline on each worker and the number of examples in an epoch. The shards must be
readable at `shards` on every node that runs a worker (here: this machine)."""

import os

import numpy as np
import tensorflow as tf
import tf_keras as keras

import tfsync

FEATURES = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def write_shards(x: np.ndarray, y: np.ndarray, folder: str, shards: int) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, f"train-{i:03d}-of-{shards:03d}.tfrecord") for i in range(shards)]
    for i, path in enumerate(paths):
        with tf.io.TFRecordWriter(path) as out:
            for image, label in zip(x[i::shards], y[i::shards]):
                out.write(tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))})
                ).SerializeToString())
    return paths


def parse(record):
    ex = tf.io.parse_single_example(record, FEATURES)
    image = tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), (28, 28, 1))
    return tf.cast(image, tf.float32) / 255.0, ex["label"]


def data(shards="shards", npz=None, num_shards=4):
    """(DatasetFactory over the TFRecord shards, x_test, y_test)."""
    mnist = tfsync.load_dataset("mnist", npz)
    shards = os.path.join(os.path.dirname(os.path.abspath(__file__)), shards)  # relative to this file
    pattern = os.path.join(shards, "train-*.tfrecord")
    if len(tf.io.gfile.glob(pattern)) != num_shards:
        write_shards(mnist.x_train.astype(np.uint8) if mnist.x_train.dtype == np.uint8
                     else np.round(mnist.x_train * 255).astype(np.uint8), mnist.y_train, shards, num_shards)

    def per_worker(context):
        files = tf.data.Dataset.list_files(pattern, shuffle=False)
        files = files.shard(context.num_input_pipelines, tfsync.worker_index())  # each worker its own shards
        return files.interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE) \
            .map(parse, num_parallel_calls=tf.data.AUTOTUNE).shuffle(2048)

    return tfsync.DatasetFactory(per_worker, examples=len(mnist.y_train)), mnist.x_test, mnist.y_test


def build(units=128):
    return keras.Sequential([keras.layers.Input((28, 28, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(units, activation="relu"), keras.layers.Dense(10)])
