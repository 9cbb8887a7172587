"""The gated training steps every standing closure runs on a worker.

A closure runs up to ``steps`` steps in a loop (one closure per step would pay the
coordinator's dispatch of a function and the copy of its result at every step, which on a
step of a few milliseconds costs more than the step: issue 16). The loop lives on the
worker alone, and each step is one call to the PS (``RemoteCall``), which takes the
step's gradient and answers with the next step's token and weights:

1. the first call (``pull``) dequeues this worker's first token from its gate on the PS
   (it blocks until granted) and reads the weights after it; a no-op token (batch size 0)
   ends the closure;
2. the worker computes the gradient on the first ``batch_size`` rows of its next input
   batch, with the model's reads of its trainable variables answered by the weights that
   came with the token (``tfcompat.reading``);
3. one call (``push_pull``) sends the gradient; on the PS it is applied now or added to
   the round's weighted accumulator, the step's float64 row ``[worker, *token, start,
   end, loss, version, rate, landed]`` (worker-side ``start``: the token came; ``end``:
   the gradient computed; ``version``: the updates the weights it read held; the rate of
   the update it makes or joins; ``landed``: the push made, on the PS's clock) goes on
   the PS's queue of finished steps, which the coordinator drains (``PSControl.drain``),
   or, for a ROUND step, on the round queue, where the PS closes the round itself
   (``PSControl.rounds``); then the PS dequeues the worker's next token and reads the
   weights after it, and both come back as the call's answer. The closure's last step
   calls ``push`` alone (no token is taken that no step would use).

So a step costs one round trip to the PS and the two transfers. The loop was first a
``tf.while_loop`` spread over the worker and the PS, which TensorFlow runs as a loop on
each task that must hear the other's condition at every turn, and a worker asks for a
tensor only once the branch or turn that needs it is known: the weights came one round
trip after the token and the next token one and a half after the push (on one worker
and one PS at 10 ms a node, 3.3-3.9 round trips a step against 1.1-1.5 now:
experiments/bench_step_call.py).

The closure returns how many steps it ran.
"""

from __future__ import annotations

import tensorflow as tf

from . import tfcompat
from .control import BATCH, MODE, MODE_AGGREGATE, ROUND, TOKEN_LEN, PSControl, converted, remote_call

# Each closure the coordinator schedules costs it about 1 ms of CPU (its dispatch, the
# fetch of its result): 256 steps a closure made it 0.24 ms a push in ASP at 8 workers
# against 0.37 at 32 (issue 55; a closure still ends early at a no-op token).
STEPS_PER_CLOSURE = 256


def make_step_fn(model, control: PSControl, loss_fn, steps: int | None = None):
    """``steps``: at most this many a closure (None: ``STEPS_PER_CLOSURE``)."""
    steps = STEPS_PER_CLOSURE if steps is None else steps
    variables = control.variables

    def forward(x, y):   # the user's model and loss (called through control.converted)
        loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        if model.losses:  # kernel_regularizer, add_loss: as model.fit adds them
            loss += tf.add_n(model.losses)
        return loss

    def pull(worker_index, after=()):   # on the PS: the next token, then the weights
        with tf.device(control.device):
            with tf.control_dependencies(after):
                token = control.dequeue(worker_index)
            with tf.control_dependencies([token]):   # a BSP round's update landed before its token
                version = tf.identity(control.optimizer.iterations)
                values = []
                for v in variables:
                    with tf.device(v.device):
                        values.append(tf.identity(v.read_value()))
        return [token, version] + values

    def push(worker_index, token, stats, grads):   # on the PS: the step's update and row
        with tf.device(control.device):
            rate = tf.cond(token[MODE] >= MODE_AGGREGATE,   # AGGREGATE or ROUND
                           lambda: control.aggregate(grads, token[BATCH], token[ROUND]),
                           lambda: control.apply(grads))
            with tf.control_dependencies([rate]):
                landed = tf.timestamp()
            row = tf.concat([tf.reshape(tf.cast(worker_index, tf.float64), [1]), tf.cast(token, tf.float64),
                             stats, tf.reshape(tf.cast(rate, tf.float64), [1]), tf.reshape(landed, [1])], 0)
            return control.finished(row, token[MODE])

    def call(function, args):   # on the PS, one round trip
        return remote_call(control.device, function, args)

    def ps_functions(grads):
        """``push`` and ``push`` then ``pull``, traced on the PS for these gradients
        (dense or IndexedSlices; a variable without one gets None, as apply_gradients
        would be given)."""
        given = [i for i, g in enumerate(grads) if g is not None]
        specs = [tf.type_spec_from_value(grads[i]) for i in given]
        flat = tf.nest.flatten(specs, expand_composites=True)

        def unpack(args):
            out = [None] * len(grads)
            for i, g in zip(given, tf.nest.pack_sequence_as(specs, list(args), expand_composites=True)):
                out[i] = g
            return out

        signature = [tf.TensorSpec([], tf.int32), tf.TensorSpec([TOKEN_LEN], tf.int64),
                     tf.TensorSpec([4], tf.float64)] + flat
        push_only = tf.function(lambda w, t, s, *g: push(w, t, s, unpack(g)), autograph=False)
        push_pull = tf.function(lambda w, t, s, *g: pull(w, [push(w, t, s, unpack(g))]), autograph=False)
        with tf.device(control.device):
            return (push_only.get_concrete_function(*signature), push_pull.get_concrete_function(*signature),
                    lambda g: tf.nest.flatten([g[i] for i in given], expand_composites=True))

    @tf.function(autograph=False)
    def pull_fn(worker_index):
        return pull(worker_index)

    @tf.function(autograph=False)   # tf.while_loop and tf.cond written out: no conversion needed
    def run(worker_index, iterator):
        with tf.device(control.device):
            first = pull_fn.get_concrete_function(tf.TensorSpec([], tf.int32))
        def shaped(outputs):
            outputs[0].set_shape([TOKEN_LEN])
            outputs[1].set_shape([])
            for o, v in zip(outputs[2:], variables):
                o.set_shape(v.shape)
            return outputs

        def body(i, token, version, *values):
            values = list(values)
            with tf.control_dependencies([token]):
                start = tf.timestamp()
            with tf.control_dependencies([start]):   # else the executor may stamp it with the gradient
                x, y = next(iterator)
            b = tf.cast(token[BATCH], tf.int32)
            x, y = tf.nest.map_structure(lambda t: t[:b], (x, y))  # features or labels may be dicts or tuples
            with tfcompat.reading(variables, values), tf.GradientTape() as tape:
                tape.watch(values)
                loss = converted(forward, x, y)
            through, round_it = tape.gradient(loss, [values, variables])
            grads = [tfcompat.summed(*paths) for paths in zip(through, round_it)]
            with tf.control_dependencies([g for g in grads if g is not None]):
                end = tf.timestamp()
            push_only, push_pull, flat = ps_functions(grads)   # traced here: they need the gradients
            args = [worker_index, token, tf.stack([start, end, tf.cast(loss, tf.float64),
                                                   tf.cast(version, tf.float64)])] + flat(grads)

            def last():   # the closure's last step: no next token
                with tf.control_dependencies(call(push_only, args)):
                    return [tf.zeros([TOKEN_LEN], tf.int64), tf.identity(version)] + [tf.identity(v) for v in values]

            following = tf.cond(i + 1 < steps, lambda: shaped(call(push_pull, args)), last)
            return [i + 1] + following

        opened = shaped(call(first, [worker_index]))
        out = tf.while_loop(lambda i, token, *_: tf.logical_and(i < steps, token[BATCH] > 0), body,
                            [tf.constant(0)] + opened, parallel_iterations=1)
        return out[0]

    return run
