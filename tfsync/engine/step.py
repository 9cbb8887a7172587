"""The gated training step every standing closure runs on a worker.

1. dequeue this worker's next token from its gate on the PS (blocks until granted);
2. read the weights (after the token: control dependency), compute the gradient on the
   first ``batch_size`` rows of the worker's next input batch (no retrace per size);
3. push: apply now, or add to the round's weighted accumulator;
4. return one float64 vector ``[worker, *token, start, end, loss, version, rate]`` with
   worker-side timestamps and the learning rate of the update the push makes or joins (one tensor: the coordinator copies each output back with its
   own RPC).
"""

from __future__ import annotations

import tensorflow as tf

from .control import BATCH, MODE, MODE_AGGREGATE, ROUND, PSControl


def make_step_fn(model, control: PSControl, loss_fn):
    variables = control.variables

    @tf.function
    def step(worker_index, iterator):
        token = control.dequeue(worker_index)
        with tf.control_dependencies([token]):
            start = tf.timestamp()
            version = tf.identity(control.optimizer.iterations)

        def work():
            x, y = next(iterator)
            b = tf.cast(token[BATCH], tf.int32)
            x, y = tf.nest.map_structure(lambda t: t[:b], (x, y))  # features or labels may be dicts or tuples
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
                if model.losses:  # kernel_regularizer, add_loss: as model.fit adds them
                    loss += tf.add_n(model.losses)
            grads = tape.gradient(loss, variables)
            rate = tf.cond(token[MODE] == MODE_AGGREGATE,
                           lambda: control.aggregate(grads, token[BATCH], token[ROUND]),
                           lambda: control.apply(grads))
            with tf.control_dependencies([rate]):
                end = tf.timestamp()
            return tf.cast(loss, tf.float32), end, tf.cast(rate, tf.float32)

        loss, end, rate = tf.cond(token[BATCH] > 0, work, lambda: (tf.constant(0.0), start, tf.constant(0.0)))
        parts = [tf.reshape(tf.cast(worker_index, tf.float64), [1]), tf.cast(token, tf.float64),
                 tf.stack([start, end, tf.cast(loss, tf.float64), tf.cast(version, tf.float64),
                           tf.cast(rate, tf.float64)])]
        return tf.concat(parts, 0)

    return step
