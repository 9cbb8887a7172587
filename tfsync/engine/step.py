"""The gated training steps every standing closure runs on a worker.

A closure runs up to ``steps`` steps in a loop (one closure per step would pay the
coordinator's dispatch of a function and the copy of its result at every step, which on a
step of a few milliseconds costs more than the step: issue 16). Each step:

1. dequeue this worker's next token from its gate on the PS (blocks until granted); a
   no-op token (batch size 0) ends the closure (the test is made on the PS, beside the
   token);
2. read the weights (after the token: a control dependency, on the PS itself, so no
   extra round trip), compute the gradient on the first ``batch_size`` rows of the
   worker's next input batch (no retrace per size);
3. push: apply now, or add to the round's weighted accumulator;
4. put one float64 row ``[worker, *token, start, end, loss, version, rate, landed]``
   (worker-side timestamps: ``start`` when the token came, ``end`` when the gradient was
   computed; the learning rate of the update the push makes or joins; ``landed``: when the
   push was made, on the PS's clock) on the PS's queue of finished
   steps, which the coordinator drains (``PSControl.drain``): it sees each push as it
   lands, not when the closure ends (a BSP round needs every push of the round before it
   grants the next step of the same closure). A ROUND step's row goes to the PS's round
   queue instead, where the PS closes the round itself (``PSControl.rounds``) and passes
   the row on.

Steps 3 and 4 run on the PS as a whole: the gradient goes there once, and nothing comes
back to the worker but the step's end. (The row was built on the worker, after the push's
rate came back: one more round trip per step, 30 ms of a 190 ms step at 10 ms a node.)

The closure returns how many steps it ran.
"""

from __future__ import annotations

import tensorflow as tf

from .control import BATCH, MODE, MODE_AGGREGATE, ROUND, PSControl, converted

STEPS_PER_CLOSURE = 32


def make_step_fn(model, control: PSControl, loss_fn, steps: int = STEPS_PER_CLOSURE):
    variables = control.variables

    def forward(x, y):   # the user's model and loss (called through control.converted)
        loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        if model.losses:  # kernel_regularizer, add_loss: as model.fit adds them
            loss += tf.add_n(model.losses)
        return loss

    def one_step(worker_index, iterator, token):
        with tf.control_dependencies([token]):
            start = tf.timestamp()
            with tf.device(control.device):
                version = tf.identity(control.optimizer.iterations)
            x, y = next(iterator)
        b = tf.cast(token[BATCH], tf.int32)
        x, y = tf.nest.map_structure(lambda t: t[:b], (x, y))  # features or labels may be dicts or tuples
        with tf.control_dependencies([token]):  # the weights are read after the grant
            with tf.GradientTape() as tape:
                loss = converted(forward, x, y)
        grads = tape.gradient(loss, variables)
        with tf.control_dependencies([g for g in grads if g is not None]):
            end = tf.timestamp()
        with tf.device(control.device):   # the push, its row and the enqueue: no trip back to the worker
            rate = tf.cond(token[MODE] >= MODE_AGGREGATE,   # AGGREGATE or ROUND
                           lambda: control.aggregate(grads, token[BATCH], token[ROUND]),
                           lambda: control.apply(grads))
            with tf.control_dependencies([rate]):
                landed = tf.timestamp()
            row = tf.concat([tf.reshape(tf.cast(worker_index, tf.float64), [1]), tf.cast(token, tf.float64),
                             tf.stack([start, end, tf.cast(loss, tf.float64), tf.cast(version, tf.float64),
                                       tf.cast(rate, tf.float64), landed])], 0)
            return control.finished(row, token[MODE])

    @tf.function(autograph=False)   # tf.while_loop and tf.cond written out: no conversion needed
    def run(worker_index, iterator):
        with tf.device(control.device):
            gate = tf.identity(worker_index)   # on the PS once, not sent there at every step

        def body(i, stopped):
            with tf.device(control.device):  # the token stays on the PS for the reads that wait on it
                token = control.dequeue(gate)
                granted = token[BATCH] > 0
            ran = tf.cond(granted, lambda: one_step(gate, iterator, token), lambda: tf.constant(False))
            return i + tf.cast(ran, tf.int32), tf.logical_not(ran)

        ran, _ = tf.while_loop(lambda i, stopped: tf.logical_and(i < steps, tf.logical_not(stopped)), body,
                               (tf.constant(0), tf.constant(False)))
        return ran

    return run
