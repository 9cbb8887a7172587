"""What one control call from the coordinator to the PS costs, three ways, on a testbed of
one PS node and the coordinator's node (issue 30).

The coordinator drains finished steps' rows from a queue on the PS and releases tokens
to the workers' gates there; each is a remote call, and a coordinator-closed BSP round
waits for two of them (the last push's row, the barrier with the next round's tokens):

- ``two-part function``: a ``tf.function`` whose ops are placed on the PS, called from
  the coordinator's default device (TensorFlow runs a part on each: the engine's drain
  until 2026-11-28);
- ``function on the PS``: the same function called with the PS as the default device
  (the engine's release and barrier until 2026-11-28);
- ``remote call``: a function on the coordinator that makes one ``RemoteCall`` to the PS,
  which runs the function there with the call's inputs and sends its outputs back in
  the answer (as the workers' steps do: tfsync.engine.step), one such function call each
  time;
- ``coordinator loop``: one function on the coordinator for each direction, running as
  long as the cluster, each turn one ``RemoteCall``: it drains into a queue on the
  coordinator, and releases what Python puts on another (the engine's links since
  2026-11-28: tfsync.engine.links). Its drain always waits on the PS, so "rows waiting"
  is not measured.

For each: a drain of rows already waiting, a drain that waits for a row enqueued on the
PS by a concurrent remote call started at the same time (its latency from the enqueue,
on the PS's clock, to the answer), and a release of 4 tokens. Medians over ``--calls``
calls, in ms and round trips. Writes results/bench_coord_call.csv and .png.

    sudo python experiments/bench_coord_call.py --latency 10
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments"))

VARIANTS = ("two-part function", "function on the PS", "remote call", "coordinator loop")
PS = "/job:ps/replica:0/task:0/device:CPU:0"


def chief(variant: str, calls: int) -> dict:
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())
    tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with tf.device(PS):
        done = tf.queue.FIFOQueue(100000, [tf.float64], shapes=[[11]])
        gate = tf.queue.FIFOQueue(100000, [tf.int64], shapes=[[4]])

    def drain():
        with tf.device(PS):
            return done.dequeue_many(tf.maximum(done.size(), 1))

    def release(rows):
        with tf.device(PS):
            gate.enqueue_many(rows)
            return tf.constant(True)

    def put(n):
        with tf.device(PS):
            row = tf.fill([1, 11], tf.timestamp())
            with tf.control_dependencies([done.enqueue_many(tf.tile(row, [n, 1]))]):
                return tf.constant(True)

    spec = tf.TensorSpec([None, 4], tf.int64)
    if variant == "two-part function":
        d = tf.function(drain, autograph=False)
        r = tf.function(release, autograph=False, input_signature=[spec])
        call_drain, call_release = d, r
    elif variant == "function on the PS":
        d = tf.function(drain, autograph=False)
        r = tf.function(release, autograph=False, input_signature=[spec])

        def call_drain():
            with tf.device(PS):
                return d()

        def call_release(rows):
            with tf.device(PS):
                return r(rows)
    elif variant == "coordinator loop":
        return loop_variant(calls, done, gate, drain, release, put, spec)
    else:
        with tf.device(PS):
            d_ps = tf.function(drain, autograph=False).get_concrete_function()
            r_ps = tf.function(release, autograph=False).get_concrete_function(spec)

        @tf.function(autograph=False)
        def call_drain():
            out = tf.raw_ops.RemoteCall(target=PS, args=d_ps.captured_inputs, Tout=[tf.float64], f=d_ps)
            return out[0]

        @tf.function(autograph=False, input_signature=[spec])
        def call_release(rows):
            return tf.raw_ops.RemoteCall(target=PS, args=[rows] + r_ps.captured_inputs, Tout=[tf.bool], f=r_ps)[0]

    with tf.device(PS):
        put_fn = tf.function(put, autograph=False, input_signature=[tf.TensorSpec([], tf.int32)])

    def timed(fn, *a):
        t0 = time.perf_counter()
        out = fn(*a)
        np.asarray(out)
        return (time.perf_counter() - t0) * 1000, out

    # warm up every function
    with tf.device(PS):
        put_fn(tf.constant(4))
    call_drain().numpy()
    rows = tf.constant(np.ones([4, 4], np.int64))
    call_release(rows)
    waiting, waited, released = [], [], []
    for _ in range(calls):
        with tf.device(PS):
            put_fn(tf.constant(4))
        waiting.append(timed(call_drain)[0])
        released.append(timed(call_release, rows)[0])
    import threading
    for _ in range(calls):
        out = {}
        th = threading.Thread(target=lambda: out.update(rows=call_drain().numpy(), at=time.time()))
        th.start()
        time.sleep(0.3)   # the drain waits on the PS
        with tf.device(PS):
            put_fn(tf.constant(1))
        th.join()
        waited.append((out["at"] - out["rows"][0, 0]) * 1000)
    return {"drain_waiting_rows_ms": float(np.median(waiting)), "drain_from_enqueue_ms": float(np.median(waited)),
            "release_ms": float(np.median(released)), "calls": calls}


def loop_variant(calls, done, gate, drain, release, put, spec):
    """One function on the coordinator for each direction, running as long as the
    generation: drains into a local queue; releases from a local outbox."""
    import threading

    import numpy as np
    import tensorflow as tf

    with tf.device(PS):
        d_ps = tf.function(drain, autograph=False).get_concrete_function()
        r_ps = tf.function(release, autograph=False).get_concrete_function(spec)
        put_fn = tf.function(put, autograph=False, input_signature=[tf.TensorSpec([], tf.int32)])
    inbox = tf.queue.FIFOQueue(100000, [tf.float64], shapes=[[11]])
    outbox = tf.queue.FIFOQueue(1000, [tf.int64])
    acks = tf.queue.FIFOQueue(1000, [tf.bool], shapes=[[]])

    @tf.function(autograph=False)
    def pump():
        def body(i):
            rows = tf.raw_ops.RemoteCall(target=PS, args=d_ps.captured_inputs, Tout=[tf.float64], f=d_ps)[0]
            with tf.control_dependencies([inbox.enqueue_many(rows)]):
                return i + 1
        return tf.while_loop(lambda i: True, body, [tf.constant(0)])

    @tf.function(autograph=False)
    def sender():
        def body(i):
            rows = outbox.dequeue()
            rows.set_shape([None, 4])
            ok = tf.raw_ops.RemoteCall(target=PS, args=[rows] + r_ps.captured_inputs, Tout=[tf.bool], f=r_ps)[0]
            with tf.control_dependencies([acks.enqueue(ok)]):
                return i + 1
        return tf.while_loop(lambda i: True, body, [tf.constant(0)])

    for fn in (pump, sender):
        threading.Thread(target=lambda fn=fn: _quietly(fn), daemon=True).start()
    rows = tf.constant(np.ones([4, 4], np.int64))
    waited, released = [], []
    for i in range(calls + 1):
        with tf.device(PS):
            put_fn(tf.constant(1))
        got = inbox.dequeue().numpy()
        if i:
            waited.append((time.time() - got[0]) * 1000)
        t0 = time.perf_counter()
        outbox.enqueue(rows)
        acks.dequeue().numpy()
        if i:
            released.append((time.perf_counter() - t0) * 1000)
    return {"drain_waiting_rows_ms": float("nan"), "drain_from_enqueue_ms": float(np.median(waited)),
            "release_ms": float(np.median(released)), "calls": calls}


def _quietly(fn):
    try:
        fn()
    except Exception:   # noqa: BLE001 - the process ends
        pass


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--latency", type=float, default=10.0, help="one-way ms per node")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench_coord_call"))
    p.add_argument("--chief", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--summarise", action="store_true",
                   help="only write the page's table (results/bench_coord_call.md) from the CSV")
    args = p.parse_args(argv)
    if args.summarise:   # experiments/tables.py: the table, the command that made the CSV, its date
        import tables
        tables.write(tables.of_script("bench_coord_call.py"))
        return 0
    if args.chief:
        print(json.dumps(chief(args.chief[0], int(args.chief[1]))), flush=True)
        return 0
    import testbed_bench
    from bench_control_path import on_two_nodes

    rows = []
    argvs = [[sys.executable, os.path.abspath(__file__), "--chief", variant, str(args.calls)] for variant in VARIANTS]
    for variant, (rtt, r) in zip(VARIANTS, on_two_nodes("coordcall", args.latency, argvs)):
        rows.append({"latency_ms": args.latency, "rtt_ms": round(rtt, 2), "variant": variant,
                     **{k: round(v, 2) for k, v in r.items()},
                     **{k.replace("_ms", "_rtt"): round(v / rtt, 2) for k, v in r.items() if k.endswith("_ms")}})
        print(f"  {variant:<20} drain (rows waiting) {r['drain_waiting_rows_ms']:6.1f} ms, "
              f"drain from the enqueue {r['drain_from_enqueue_ms']:6.1f} ms, release {r['release_ms']:6.1f} ms",
              flush=True)
    testbed_bench.write_csv(args.out + ".csv", rows)
    plot(rows, args.out + ".png")
    print(f"wrote {args.out}.csv and .png")
    return 0


def plot(rows, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    parts = [("drain_waiting_rows_ms", "drain, rows waiting"), ("drain_from_enqueue_ms", "row queued on the PS to the coordinator"),
             ("release_ms", "release of 4 tokens, answered")]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    y = np.arange(len(rows))
    for j, (key, name) in enumerate(parts):
        vals = [r[key] for r in rows]
        ax.barh(y + (j - 1) * 0.27, vals, height=0.25, label=name)
        for yy, v in zip(y, vals):
            if v == v:   # (not NaN)
                ax.text(v + 1, yy + (j - 1) * 0.27, f"{v:.0f}", va="center", fontsize=7)
    ax.axvline(rows[0]["rtt_ms"], color="k", ls="--", lw=1, label=f"round trip {rows[0]['rtt_ms']:.0f} ms")
    ax.set_yticks(y, [r["variant"] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"ms (coordinator and PS on two nodes, {rows[0]['latency_ms']:g} ms one-way each)")
    ax.set_title("One control call from the coordinator to the PS")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
