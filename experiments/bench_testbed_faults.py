"""Restart-switch and recovery times with the network in the way (issue 17): a ``tfsync
testbed`` of 3 task nodes (the PS and two workers, each on its own node) plus the
coordinator's, every connection through the latency relay, at 0, 10 and 30 ms one-way
latency per node.

Per latency, two jobs (MNIST, the bundled MLP, no shared run directory):
- **restart switch**: BSP for half the workload, then ASP by restart (Sync-Switch Fig. 9:
  checkpoint, stop the tasks, connect to new ones started while the old ones trained,
  restore). Reported: the switch's parts from ``summary.json`` (drain, save, stop the
  old tasks, wait for / connect to / restore / trace the new generation, and the rest:
  the new closures standing, the policy's hand-over).
- **recovery**: BSP with a checkpoint every 20 updates; the worker task on one node is
  killed (SIGKILL, its node and hook stay up), then the PS task. Reported: each
  recovery's seconds (from the loss being seen to training again), and the samples the
  PS's recovery rewound.

    sudo python experiments/bench_testbed_faults.py --repeats 1

Writes results/bench_testbed_faults.csv and .png. The machine has 2 cores: every task
shares them, so these times include waiting for CPU as well as for the network.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import testbed_bench  # noqa: E402
from testbed_bench import write_csv  # noqa: E402

from tfsync.base.taskcmd import task_of_name  # noqa: E402
from tfsync.testbed.bed import Testbed  # noqa: E402

SWITCH_PARTS = ("drain_s", "save_s", "stop_old_s", "wait_tasks_s", "connect_build_s", "restore_s", "trace_s")


def job_text(run_dir: str, kind: str, bed: Testbed, epochs: float) -> str:
    protocol = ('[[protocol]]\nname = "bsp"\nuntil = 0.5\n[[protocol]]\nname = "asp"\n'
                '[switch]\nmethod = "restart"\npoint = "job"\n') if kind == "restart switch" \
        else '[[protocol]]\nname = "bsp"\n'
    return textwrap.dedent(f"""
        [job]
        name = "bench-faults"
        run_dir = "{run_dir}"
        seed = 0
        [data]
        name = "mnist"
        [model]
        name = "mlp"
        [train]
        epochs = {epochs}
        checkpoint_every = {0 if kind == "restart switch" else 20}
        timeout_s = 600
        """) + protocol + bed.cluster_toml() + "workers = 2\n"


def records(run_dir: str) -> list[dict]:
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError):
        return []


def wait_for(predicate, what: str, proc, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended before {what}: {proc.stdout.read()[-2000:]}")
        time.sleep(0.1)
    raise RuntimeError(f"not within {timeout:.0f} s: {what}")


def kill_task(bed: Testbed, job: str) -> str:
    """SIGKILL the task process ``job`` (``ps`` or ``worker``; the first found) on whichever
    node runs it; its node and hook stay up. Returns the node's name."""
    for name, node in bed.nodes.items():
        pids = subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True).stdout.split()
        for pid in map(int, pids):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    task = task_of_name(f.read().strip())
            except OSError:
                continue
            if task is not None and task[0] == job:
                os.kill(pid, signal.SIGKILL)
                return name
    raise RuntimeError(f"no {job} task found on the testbed's nodes")


def run_job(bed: Testbed, kind: str, work: str, epochs: float, tag: str) -> dict:
    """One job in a run directory of its own (``tag``: a finished run's records must not be
    read as this one's)."""
    run_dir = os.path.join(work, kind.replace(" ", "-") + tag)
    job = run_dir + ".toml"
    with open(job, "w") as f:
        f.write(job_text(run_dir, kind, bed, epochs))
    proc = subprocess.Popen(bed.command("c", [sys.executable, "-m", "tfsync.cli", "run", job, "--no-report"]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if kind == "recovery":
            pushes = lambda: sum("pushes" in r for r in records(run_dir))  # noqa: E731
            wait_for(lambda: pushes() >= 40, "40 pushes", proc)
            kill_task(bed, "worker")
            wait_for(lambda: any(r.get("event") == "worker_rejoined" for r in records(run_dir)), "the rejoin", proc)
            wait_for(lambda: sum(r.get("event") == "checkpoint" and r.get("why") == "periodic"
                                 for r in records(run_dir)) >= 2, "a periodic checkpoint after it", proc)
            kill_task(bed, "ps")
        out, _ = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} failed ({proc.returncode}): {out[-2000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def rows_of(kind: str, latency: float, repeat: int, s: dict) -> list[dict]:
    base = {"latency_ms": latency, "repeat": repeat, "train_s": round(s["train_s"], 2),
            "test_accuracy": round(s["test_accuracy"], 4)}
    if kind == "restart switch":
        (sw,) = [e for e in s["switches"] if e["method"] == "restart"]
        parts = {p: sw.get(p, 0.0) for p in SWITCH_PARTS}
        return [{**base, "event": "restart switch", "seconds": sw["overhead_s"], "samples_lost": 0, **parts,
                 "other_s": round(sw["overhead_s"] - sum(parts.values()), 4)}]
    out = []
    for r in s["recoveries"]:
        what = "worker recovery" if r["task"].startswith("worker") else "PS recovery"
        out.append({**base, "event": what, "seconds": r["seconds"], "samples_lost": r.get("samples_lost", 0),
                    **{p: "" for p in SWITCH_PARTS}, "other_s": ""})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--latencies", default="0,10,30", help="one-way ms per node, comma-separated")
    p.add_argument("--epochs", type=float, default=0.2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench_testbed_faults"))
    args = p.parse_args(argv)
    rows = []
    bed = testbed_bench.up("faults", nodes=3, log=print)
    try:
        with testbed_bench.work_dir(None) as work:
            for latency in [float(x) for x in args.latencies.split(",")]:
                for node in bed.nodes:
                    bed.set(node, latency_ms=latency)
                for repeat in range(args.repeats):
                    for kind in ("restart switch", "recovery"):
                        for row in rows_of(kind, latency, repeat, run_job(bed, kind, work, args.epochs, f"-{latency:g}ms-{repeat}")):
                            rows.append(row)
                            print(row, flush=True)
    finally:
        bed.down()
    write_csv(args.out + ".csv", rows)
    plot(rows, args.out + ".png")
    print(f"wrote {args.out}.csv and .png")
    return 0


def plot(rows, path) -> None:
    from matplotlib.figure import Figure

    latencies = sorted({r["latency_ms"] for r in rows})
    events = ("restart switch", "worker recovery", "PS recovery")
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    width = 0.25
    for k, event in enumerate(events):
        means = []
        for lat in latencies:
            got = [float(r["seconds"]) for r in rows if r["latency_ms"] == lat and r["event"] == event]
            means.append(sum(got) / len(got) if got else 0.0)
        left.bar([i + (k - 1) * width for i in range(len(latencies))], means, width, label=event)
    left.set_xticks(range(len(latencies)), [f"{lat:g} ms" for lat in latencies])
    left.set_xlabel("one-way latency per node")
    left.set_ylabel("seconds")
    left.set_title("from the event to training again")
    left.legend()
    bottom = [0.0] * len(latencies)
    for part in (*SWITCH_PARTS, "other_s"):  # other: the new closures standing, the policy's hand-over
        vals = []
        for lat in latencies:
            got = [float(r[part]) for r in rows if r["latency_ms"] == lat and r["event"] == "restart switch"]
            vals.append(sum(got) / len(got) if got else 0.0)
        right.bar(range(len(latencies)), vals, 0.5, bottom=bottom, label=part.removesuffix("_s").replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    right.set_xticks(range(len(latencies)), [f"{lat:g} ms" for lat in latencies])
    right.set_xlabel("one-way latency per node")
    right.set_title("restart switch, by part (s)")
    right.legend(fontsize=7)
    fig.suptitle("PS + 2 workers on 3 testbed nodes (2 CPU cores shared), MNIST MLP")
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
