"""One gated step, two ways, on a testbed of one PS node and one worker node (issue 30).

A worker's closure takes a token from its gate on the PS, computes on the weights and
pushes; how TensorFlow runs that loop decides how many round trips a step costs:

- ``loop across tasks``: a ``tf.while_loop`` whose body dequeues on the PS, runs the step
  under a ``tf.cond`` (a no-op token ends the closure) and pushes on the PS: the engine's
  step until 2026-11-28;
- ``loop across tasks, no cond``: the same without the ``tf.cond`` (no way to end the
  closure early: a diagnostic);
- ``remote call``: the loop on the worker alone; each step is one ``RemoteCall`` to the
  PS that pushes the gradient and answers with the next token and the weights: the
  engine's step since.

Each run takes ``--steps`` steps of ``x @ w`` (``w`` of ``--rows`` x 64 float32: 64 rows
are 16 KB, 10,500 rows 2.7 MB, the wide MLP's size) with every token queued ahead, so
only the loop's own exchanges are timed. From the worker's and the PS's timestamps (every
testbed node shares one clock), medians over the steps: the step; token to weights on the
worker; the gradient's way to the PS; the push landed to the next token on the worker.
Writes results/bench_step_call.csv and .png.

    sudo python experiments/bench_step_call.py --latency 10 --rows 64,10500
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments"))

VARIANTS = ("loop across tasks", "loop across tasks, no cond", "remote call")
PS = "/job:ps/replica:0/task:0/device:CPU:0"


def chief(variant: str, steps: int, rows: int) -> dict:
    """On node c, as TF_CONFIG's chief: one closure of ``steps`` steps; its timings."""
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(tf.ones([rows, 64]) * 0.001)
    with tf.device(PS):
        gate = tf.queue.FIFOQueue(steps + 8, [tf.int64], shapes=[[2]])
        done = tf.queue.FIFOQueue(steps + 8, [tf.float64], shapes=[[3]])   # [token came, gradient, landed]
    x = tf.ones([8, rows])

    def gradient(weights):   # on the worker
        return tf.zeros_like(weights) + tf.reduce_mean(tf.matmul(x, weights)) * 0

    def push(g, came, computed):   # on the PS
        with tf.device(PS):
            with tf.control_dependencies([w.assign_add(g)]):
                landed = tf.timestamp()
            return done.enqueue(tf.stack([came, computed, landed]))

    def step(token, weights):
        with tf.control_dependencies([token]):
            came = tf.timestamp()
        g = gradient(weights)
        with tf.control_dependencies([g]):
            computed = tf.timestamp()
        return push(g, came, computed)

    def across(with_cond):
        def body(i, stopped):
            with tf.device(PS):
                token = gate.dequeue()
                granted = token[0] > 0

            def run():
                with tf.control_dependencies([token]):
                    weights = tf.identity(w)
                with tf.control_dependencies([step(token, weights)]):
                    return tf.constant(True)
            ran = tf.cond(granted, run, lambda: tf.constant(False)) if with_cond else run()
            return i + 1, tf.logical_not(ran)
        return tf.while_loop(lambda i, stopped: tf.logical_and(i < steps, tf.logical_not(stopped)), body,
                             (tf.constant(0), tf.constant(False)))[0]

    def pull(after=()):
        with tf.control_dependencies(after):
            token = gate.dequeue()
        with tf.control_dependencies([token]):
            return token, tf.identity(w.read_value())

    with tf.device(PS):
        first = tf.function(pull, autograph=False).get_concrete_function()
        push_pull = tf.function(lambda g, came, computed: pull([push(g, came, computed)]),
                                autograph=False).get_concrete_function(
            tf.TensorSpec([rows, 64]), tf.TensorSpec([], tf.float64), tf.TensorSpec([], tf.float64))

    def call(function, args):
        token, weights = tf.raw_ops.RemoteCall(target=PS, args=list(args) + function.captured_inputs,
                                               Tout=[tf.int64, tf.float32], f=function)
        token.set_shape([2])
        weights.set_shape([rows, 64])
        return token, weights

    @tf.function(autograph=False)
    def remote():
        def body(i, token, weights):
            with tf.control_dependencies([token]):
                came = tf.timestamp()
            g = gradient(weights)
            with tf.control_dependencies([g]):
                computed = tf.timestamp()
            return (i + 1,) + call(push_pull, [g, came, computed])
        return tf.while_loop(lambda i, token, weights: tf.logical_and(i < steps, token[0] > 0), body,
                             (tf.constant(0),) + call(first, []))[0]

    gate.enqueue_many(tf.constant([[1, 0]] * steps + [[0, 0]] * 2, tf.int64))
    fn = {"loop across tasks": tf.function(lambda: across(True), autograph=False),
          "loop across tasks, no cond": tf.function(lambda: across(False), autograph=False),
          "remote call": remote}[variant]
    coordinator.schedule(fn)
    coordinator.join()
    t = done.dequeue_many(done.size()).numpy() * 1000
    return {"step_ms": float(np.median(np.diff(t[:, 0]))), "token_to_gradient_ms": float(np.median(t[:, 1] - t[:, 0])),
            "gradient_to_landed_ms": float(np.median(t[:, 2] - t[:, 1])),
            "landed_to_next_token_ms": float(np.median(t[1:, 0] - t[:-1, 2])), "steps": len(t)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latency", type=float, default=10.0, help="one-way ms per node")
    p.add_argument("--rows", default="64,10500", help="the weights' rows (x 64 float32), comma-separated")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench_step_call"))
    p.add_argument("--chief", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--summarise", action="store_true",
                   help="only write the page's table (results/bench_step_call.md) from the CSV")
    args = p.parse_args(argv)
    if args.summarise:   # experiments/tables.py: the table, the command that made the CSV, its date
        import tables
        tables.write(tables.of_script("bench_step_call.py"))
        return 0
    if args.chief:
        print(json.dumps(chief(args.chief[0], int(args.chief[1]), int(args.chief[2]))), flush=True)
        return 0
    import testbed_bench
    from bench_control_path import on_two_nodes

    rows = []
    runs = [(int(size), variant) for size in args.rows.split(",") for variant in VARIANTS]
    argvs = [[sys.executable, os.path.abspath(__file__), "--chief", variant, str(args.steps), str(size)]
             for size, variant in runs]
    for (size, variant), (rtt, r) in zip(runs, on_two_nodes("stepcall", args.latency, argvs)):
        rows.append({"latency_ms": args.latency, "rtt_ms": round(rtt, 2), "weights_mb": round(size * 256 / 1e6, 2),
                     "variant": variant, **{k: round(v, 2) for k, v in r.items()},
                     "round_trips_per_step": round(r["step_ms"] / rtt, 2)})
        print(f"  {rows[-1]['weights_mb']:5.2f} MB  {variant:<28} a step {r['step_ms']:6.1f} ms "
              f"({rows[-1]['round_trips_per_step']:.2f} round trips)", flush=True)
    testbed_bench.write_csv(args.out + ".csv", rows)
    plot(rows, args.out + ".png")
    print(f"wrote {args.out}.csv and .png")
    return 0


def plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["weights_mb"] for r in rows})
    parts = [("token_to_gradient_ms", "token to gradient"), ("gradient_to_landed_ms", "gradient to the PS"),
             ("landed_to_next_token_ms", "push landed to next token")]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    labels, y = [], 0
    for size in sizes:
        for variant in VARIANTS:
            r = next((r for r in rows if r["weights_mb"] == size and r["variant"] == variant), None)
            if r is None:
                continue
            left = 0.0
            for (key, name), color in zip(parts, ("#4c72b0", "#dd8452", "#c44e52")):
                ax.barh(y, r[key], left=left, color=color, label=name if y == 0 else None)
                left += r[key]
            ax.text(left + 1, y, f"{r['step_ms']:.0f} ms a step", va="center", fontsize=8)
            labels.append(f"{variant} ({size:g} MB)")
            y += 1
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"ms (one worker, one PS, {rows[0]['latency_ms']:g} ms one-way, round trip {rows[0]['rtt_ms']:.0f} ms)")
    ax.set_title("One gated step: a loop across worker and PS, or one remote call")
    ax.set_xlim(0, max(r["step_ms"] for r in rows) * 1.6)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
