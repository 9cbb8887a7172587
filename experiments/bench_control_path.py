"""tfsync's control path against native TensorFlow and the network's floor, across the
separate hosts of a ``tfsync testbed`` (issue 30).

Every configuration runs on task servers a platform would start, from TF_CONFIG
(``python -m tfsync.engine.server`` on nodes n1 = PS and n2.. = workers, fresh for each
run), with the coordinator (chief) on node c; each node at the same one-way latency:

- native ``model.fit`` under ParameterServerStrategy, ``steps_per_execution`` 1 (the
  default) and 32 (TensorFlow's advice for this strategy), the wide MLP of wide_mlp.py
  with the job's data, loss and SGD: worker steps/s of its second epoch;
- tfsync ASP, SSP (s = 2), BSP and LB-BSP (EMA predictor), each with rounds run by the
  coordinator (``train.ps_rounds = false``, the engine before issue 30) and with rounds
  the PS closes itself (the default): pushes/s of the steady part
  (``bench_engine.steady_rate``).

Beside them, the floors: the round trip between two nodes (a TCP echo through the
relay, median of 50) and one step's compute on this machine (the wide MLP at batch 64,
median of 50, one process), and the BSP round they imply: two round trips (token and
weights out, gradient back) plus the step. Rates are worker steps per second over the
whole cluster (a BSP round is ``workers`` steps). Writes results/bench_control_path.csv
and .png.

    sudo python experiments/bench_control_path.py --workers 4 --latencies 0,10,30 --repeats 1

The machine has 2 cores: every task shares them, so the compute part of a step is
slower than on separate machines; say so when quoting.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "experiments")
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import testbed_bench  # noqa: E402
from testbed_bench import wide_mlp_job, write_csv  # noqa: E402

BASE_PORT = 20000   # in the relay's task ports (tfsync.testbed.bed.TASK_PORTS)
ECHO_PORT = 20090
CONFIGS = ("fit", "fit, 32 steps/execution", "tfsync ASP", "tfsync ASP depth=2", "tfsync ASP depth=4",
           "tfsync ASP depth=8",
           "tfsync SSP s=2", "tfsync BSP (coordinator rounds)",
           "tfsync BSP (PS rounds)", "tfsync LB-BSP (coordinator rounds)", "tfsync LB-BSP (PS rounds)")
PROTOCOL = {"tfsync SSP s=2": ("ssp", True),   # (the rest: ASP, PS rounds)
            "tfsync BSP (coordinator rounds)": ("bsp", False), "tfsync BSP (PS rounds)": ("bsp", True),
            "tfsync LB-BSP (coordinator rounds)": ("lbbsp", False), "tfsync LB-BSP (PS rounds)": ("lbbsp", True)}


def nodes_of(bed, workers: int) -> list[str]:
    """The node of the PS and of each worker: round-robin over n1.. with the PS first, as
    the hooks place a job's tasks (n1 = PS, n2.. = workers where there are workers + 1)."""
    n = len([name for name in bed.nodes if name != "c"])
    return [f"n{k % n + 1}" for k in range(workers + 1)]


def spec(bed, workers: int) -> dict:
    """The cluster spec: the chief on c, the PS and workers as ``nodes_of``, by advertised address."""
    adv = [bed.node(n).advertised for n in nodes_of(bed, workers)]
    return {"chief": [f"{bed.node('c').advertised}:{BASE_PORT + 50}"], "ps": [f"{adv[0]}:{BASE_PORT}"],
            "worker": [f"{adv[i + 1]}:{BASE_PORT + 1 + i}" for i in range(workers)]}


def tf_config(cluster: dict, job: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})


@contextlib.contextmanager
def task_servers(bed, cluster: dict, cwd: str):
    """The PS and workers of ``cluster``, each on its node (``nodes_of``), serving until the block ends."""
    procs = []
    nodes = nodes_of(bed, len(cluster["worker"]))
    tasks = [("ps", 0)] + [("worker", i) for i in range(len(cluster["worker"]))]
    try:
        for node, (job, index) in zip(nodes, tasks):
            env = dict(os.environ, TF_CONFIG=tf_config(cluster, job, index), TF_CPP_MIN_LOG_LEVEL="2",
                       CUDA_VISIBLE_DEVICES="", PYTHONPATH=ROOT)
            procs.append(subprocess.Popen(bed.command(node, [sys.executable, "-m", "tfsync.engine.server"]),
                                          env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(4)   # the servers import TF and listen; the chief waits for them anyway
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def chief(bed, cluster: dict, argv: list[str], cwd: str, timeout: float = 900) -> str:
    env = dict(os.environ, TF_CONFIG=tf_config(cluster, "chief", 0), PYTHONPATH=ROOT)
    r = subprocess.run(bed.command("c", argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed ({r.returncode}): {r.stdout[-1500:]} {r.stderr[-1500:]}")
    return r.stdout


def job_text(run_dir: str, config: str, hidden: int, steps: int, workers: int) -> str:
    epochs = steps * 64 / 60000
    protocol, ps_rounds = PROTOCOL.get(config, ("asp", True))
    extra = "staleness = 2\n" if protocol == "ssp" else ""
    if "depth=" in config:   # ASP's grants ahead per worker (default 8; 4 before 2026-11-28, 2 before 2026-11-27)
        extra += f"depth = {config.split('depth=')[1]}\n"
    return (wide_mlp_job("bench-control-path", run_dir, hidden, epochs)
            + f"ps_rounds = {'true' if ps_rounds else 'false'}\n"
            + f"[[protocol]]\nname = \"{protocol}\"\n{extra}[switch]\nmethod = \"hot\"\n"
            + f"[cluster]\nworkers = {workers}\n")


def run_config(bed, config: str, args, work: str) -> float:
    cluster = spec(bed, args.workers)
    run_dir = os.path.join(work, f"run-{len(os.listdir(work))}")
    os.makedirs(run_dir)
    job = os.path.join(run_dir, "job.toml")
    with open(job, "w") as f:
        f.write(job_text(run_dir, config, args.hidden, args.steps, args.workers))
    with task_servers(bed, cluster, run_dir):
        if config.startswith("fit"):
            spe = 32 if "32" in config else 1
            out = chief(bed, cluster, [sys.executable, os.path.abspath(__file__), "--fit-chief", job,
                                       "--steps", str(args.steps), "--spe", str(spe)], run_dir)
            return float(out.strip().splitlines()[-1])
        chief(bed, cluster, [sys.executable, "-m", "tfsync.cli", "run", job, "--no-report", "--no-manager"], run_dir)
    from bench_engine import steady_rate
    return steady_rate(run_dir)


def fit_chief(job: str, steps: int, spe: int) -> int:
    """On node c, as the chief of TF_CONFIG: plain model.fit, prints worker steps/s of epoch 2."""
    import tensorflow as tf

    from bench_user_models import fit_rate
    from tfsync.job.config import load_job
    from tfsync.engine.workload import Workload

    cfg = load_job(job)
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())
    print(fit_rate(strategy, Workload.from_config(cfg), cfg.train.batch_size, steps, spe), flush=True)
    return 0


def on_two_nodes(name: str, latency_ms: float, argvs):
    """Each chief command of ``argvs`` on fresh task servers of a testbed of one PS node
    and the chief's node, ``latency_ms`` one-way each; yields (the round trip between
    them in ms, the chief's last line as JSON)."""
    bed = testbed_bench.up(name, nodes=2, latency_ms=latency_ms)
    try:
        cluster, rtt = spec(bed, 1), round_trip_ms(bed)
        print(f"{latency_ms:g} ms one-way: round trip {rtt:.1f} ms", flush=True)
        with testbed_bench.work_dir(None) as work:
            for argv in argvs:
                with task_servers(bed, cluster, work):
                    out = chief(bed, cluster, argv, work)
                yield rtt, json.loads(out.strip().splitlines()[-1])
    finally:
        bed.down()


def round_trip_ms(bed, samples: int = 50) -> float:
    """Median TCP request/response time from node c to n1 through the relay."""
    server = subprocess.Popen(bed.command("n1", [sys.executable, "-c", (
        "import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('0.0.0.0', {ECHO_PORT})); s.listen()\nc, _ = s.accept()\n"
        "c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
        "while (d := c.recv(64)):\n    c.sendall(d)\n")]))
    try:
        code = ("import socket, statistics, sys, time\n"
                f"s = socket.create_connection(('{bed.node('n1').advertised}', {ECHO_PORT}), timeout=10)\n"
                "s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\nt = []\n"
                f"for _ in range({samples}):\n    t0 = time.perf_counter(); s.sendall(b'x'); s.recv(64)\n"
                "    t.append(time.perf_counter() - t0)\nprint(statistics.median(t) * 1000)\n")
        time.sleep(1.5)
        r = subprocess.run(bed.command("c", [sys.executable, "-c", code]), capture_output=True, text=True, timeout=120)
        return float(r.stdout.strip())
    finally:
        server.kill()
        server.wait()


def step_ms(hidden: int, samples: int = 50) -> float:
    """One training step of the wide MLP at batch 64 in one process (forward, backward, SGD)."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from wide_mlp import build

    model, opt = build(hidden), keras.optimizers.SGD(0.01)
    x = tf.constant(np.random.default_rng(0).random((64, 28, 28, 1), np.float32))
    y = tf.constant(np.zeros(64, np.int64))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))

    step()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--latencies", default="0,10,30", help="one-way ms per node, comma-separated")
    p.add_argument("--steps", type=int, default=400, help="worker steps per run (fit: per epoch)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--configs", default=";".join(CONFIGS), help="separated by ';', of: " + "; ".join(CONFIGS))
    p.add_argument("--keep", help="keep the runs' directories here")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench_control_path"))
    p.add_argument("--fit-chief", help=argparse.SUPPRESS)
    p.add_argument("--spe", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--replot", action="store_true", help="draw OUT.png again from OUT.csv")
    p.add_argument("--summarise", action="store_true",
                   help="only write the pages' control-path tables (results/bench_control_path_final.md, _8w.md)")
    args = p.parse_args(argv)
    if args.summarise:   # experiments/tables.py: the table, the command that made the CSV, its date
        import tables
        tables.write(tables.of_script("bench_control_path.py"))
        return 0
    if args.fit_chief:
        return fit_chief(args.fit_chief, args.steps, args.spe)
    if args.replot:
        plot(testbed_bench.read_csv(args.out + ".csv"), args.out + ".png")
        return 0
    configs = [c.strip() for c in args.configs.split(";") if c.strip()]
    compute = step_ms(args.hidden)
    print(f"one step's compute: {compute:.1f} ms", flush=True)
    rows = []
    with testbed_bench.work_dir(args.keep) as work:
        for latency in (float(v) for v in args.latencies.split(",")):
            bed = testbed_bench.up("ctrlpath", nodes=args.workers + 1, latency_ms=latency)
            try:
                rtt = round_trip_ms(bed)
                floor = 2 * rtt + compute
                print(f"{latency:g} ms: round trip {rtt:.1f} ms, ideal BSP round {floor:.1f} ms", flush=True)
                for rep in range(args.repeats):
                    for config in configs:
                        rate = run_config(bed, config, args, work)
                        rows.append({"latency_ms": latency, "config": config, "repeat": rep,
                                     "steps_per_s": round(rate, 2),
                                     "round_ms": round(1000 * args.workers / rate, 1),
                                     "rtt_ms": round(rtt, 2), "step_ms": round(compute, 2),
                                     "ideal_round_ms": round(floor, 1)})
                        print(f"  {config:<34} {rate:7.2f} steps/s  (a round of {args.workers} steps: "
                              f"{rows[-1]['round_ms']:.0f} ms)", flush=True)
                        write_csv(args.out + ".csv", rows)
            finally:
                bed.down()
    for row in rows:
        tuned = [r["steps_per_s"] for r in rows if r["latency_ms"] == row["latency_ms"]
                 and r["config"] == "fit, 32 steps/execution"]
        row["vs_tuned_fit"] = round(row["steps_per_s"] / statistics.median(tuned), 3) if tuned else None
    write_csv(args.out + ".csv", rows)
    plot(rows, args.out + ".png")
    for line in round_trips(rows):
        print(line)
    print(f"wrote {args.out}.csv and .png")
    return 0


def round_trips(rows) -> list[str]:
    """Round trips each configuration pays per worker step (a BSP round: ``workers`` steps
    at once), from the slope of a worker's step time against the measured round trip
    between the two highest latencies (the median rate of their repeats)."""
    latencies = sorted({r["latency_ms"] for r in rows})[-2:]
    out = []
    for config in dict.fromkeys(r["config"] for r in rows):
        at = []
        for lat in latencies:
            mine = [r for r in rows if r["config"] == config and r["latency_ms"] == lat]
            if mine:
                workers = round(mine[0]["round_ms"] * mine[0]["steps_per_s"] / 1000)
                at.append((mine[0]["rtt_ms"], 1000 * workers / statistics.median(r["steps_per_s"] for r in mine)))
        if len(at) == 2 and at[1][0] > at[0][0]:
            (rtt0, t0), (rtt1, t1) = at
            out.append(f"{config}: {(t1 - t0) / (rtt1 - rtt0):.1f} round trips per worker step "
                       f"({latencies[0]:g} -> {latencies[1]:g} ms one-way)")
    return out


def plot(rows, path: str) -> None:
    from matplotlib.figure import Figure

    latencies = sorted({r["latency_ms"] for r in rows})
    configs = list(dict.fromkeys(r["config"] for r in rows))
    colors = dict(zip([c for c in CONFIGS if "depth=" not in c],
                      ["#9a9a9a", "#5a5a5a", "#e08040", "#c0a030", "#a8c0d8", "#4878a8", "#b8d8b0", "#509850"]))
    colors.update({"tfsync ASP depth=2": "#f0b890", "tfsync ASP depth=4": "#d07840", "tfsync ASP depth=8": "#a04010"})
    labels = {"fit": "fit", "fit, 32 steps/execution": "fit\n32/exec", "tfsync ASP": "ASP",
              "tfsync ASP depth=2": "ASP\ndepth 2", "tfsync ASP depth=4": "ASP\ndepth 4", "tfsync ASP depth=8": "ASP\ndepth 8",
              "tfsync SSP s=2": "SSP\ns=2", "tfsync BSP (coordinator rounds)": "BSP\ncoord.",
              "tfsync BSP (PS rounds)": "BSP\nPS rounds", "tfsync LB-BSP (coordinator rounds)": "LB-BSP\ncoord.",
              "tfsync LB-BSP (PS rounds)": "LB-BSP\nPS rounds"}
    fig = Figure(figsize=(max(11, 5 + 1.2 * len(configs) * len(latencies) / 3), 3.8), layout="constrained")
    axes = fig.subplots(1, len(latencies), squeeze=False)[0]
    for ax, lat in zip(axes, latencies):
        mine = [r for r in rows if r["latency_ms"] == lat]
        values = [statistics.median([r["steps_per_s"] for r in mine if r["config"] == c] or [0]) for c in configs]
        bars = ax.bar(range(len(configs)), values, color=[colors.get(c, "#888888") for c in configs])
        tuned = dict(zip(configs, values)).get("fit, 32 steps/execution")
        for b, v in zip(bars, values):
            ax.annotate(f"{v:.1f}" + (f"\n{v / tuned:.2f}x" if tuned else ""), (b.get_x() + b.get_width() / 2, v),
                        ha="center", va="bottom", fontsize=7.5)
        ref = mine[0]
        workers = round(ref["round_ms"] * ref["steps_per_s"] / 1000)
        ax.set_xticks(range(len(configs)), [labels.get(c, c) for c in configs], fontsize=7.5)
        ax.set_ylim(0, 1.3 * max(values))
        ax.set_title(f"{lat:g} ms one-way per node: RTT {ref['rtt_ms']:.1f} ms, step {ref['step_ms']:.1f} ms\n"
                     f"BSP at 2 RTT + step would be {1000 * workers / ref['ideal_round_ms']:.0f} steps/s",
                     fontsize=8.5)
        ax.set_ylabel("worker steps/s (x: of fit 32/exec)", fontsize=8)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
