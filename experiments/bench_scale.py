"""What a change of the worker count costs on the testbed (issue 33: elastic workers).

A ``tfsync testbed`` of 9 nodes (the PS on n1, up to 8 workers on n2..n9; the tasks go
round-robin over the hooks), every node at one one-way latency. The job (MNIST, the wide
MLP of bench_testbed.py, BSP) starts with 2 workers; ``--segment-s`` seconds into
training it is scaled to 4 (`tfsync scale RUN --workers 4`, from the coordinator's node,
through the job's manager), then to 8, then a restart switch (`tfsync switch --to bsp
--method restart`) at 8 workers, the cost a scale is compared with, then it stops.
Measured per change: the engine's own time (drain + checkpoint, stop the tasks, start the
new ones and restore: ``seconds`` of the ``scaled`` / ``switch`` event), the pause the
workers see (the last push before it to the first push after it), the command's wall
time as the user waits for its answer, and the samples/s of BSP before and after (each
segment's pushes, its first second left out). Writes results/bench_scale.csv and .png.

    sudo python experiments/bench_scale.py --latencies 0 10 30
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import testbed_bench  # noqa: E402
from testbed_bench import wide_mlp_job, write_csv  # noqa: E402

COUNTS = (2, 4, 8)


def job_text(run_dir: str, args, bed) -> str:
    return (wide_mlp_job("bench-scale", run_dir, args.hidden, epochs=100)
            + '[[protocol]]\nname = "bsp"\n' + bed.cluster_toml() + f"workers = {COUNTS[0]}\n")


def _records(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:   # a line being written
                pass
    return out


def tfsync_on_c(bed, *argv, timeout=300) -> tuple[float, str]:
    """A tfsync command on the coordinator's node; (its wall time, its answer)."""
    t = time.time()
    r = subprocess.run(bed.command("c", [sys.executable, "-m", "tfsync.cli", *argv]), capture_output=True,
                       text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"tfsync {' '.join(argv)} failed ({r.returncode}): {r.stderr[-1500:]}")
    return time.time() - t, r.stdout.strip()


def run_one(bed, latency: float, args, work: str) -> list[dict]:
    run_dir = os.path.join(work, f"run-{latency:g}ms")
    job = os.path.join(work, f"scale-{latency:g}.toml")
    with open(job, "w") as f:
        f.write(job_text(run_dir, args, bed))
    run = subprocess.Popen(bed.command("c", [sys.executable, "-m", "tfsync.cli", "run", job, "--no-report"]),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    waited = []
    try:
        deadline = time.time() + 300
        while not any(r.get("event") == "phase" for r in _records(run_dir)):
            if run.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the job did not start: {run.communicate()[1][-1500:]}")
            time.sleep(0.2)
        for n in COUNTS[1:]:
            time.sleep(args.segment_s)
            waited.append(tfsync_on_c(bed, "scale", run_dir, "--workers", str(n)))
            print(f"  {latency:g} ms: {waited[-1][1]}", flush=True)
        time.sleep(args.segment_s)
        waited.append(tfsync_on_c(bed, "switch", run_dir, "--to", "bsp", "--method", "restart"))
        print(f"  {latency:g} ms: {waited[-1][1]}", flush=True)
        time.sleep(args.segment_s)
        tfsync_on_c(bed, "stop", run_dir, "--no-checkpoint")
        run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    return changes(_records(run_dir), waited, latency)


def changes(recs: list[dict], waited: list, latency: float) -> list[dict]:
    """One row per change: its costs and the samples/s of the segments before and after."""
    pushes = [r for r in recs if "worker" in r]
    events = [r for r in recs if r.get("event") in ("scaled", "switch")]
    bounds = [(e["time"] - e.get("seconds", e.get("overhead_s", 0.0)), e["time"]) for e in events]

    def rate(t0, t1):   # samples/s of the pushes in (t0 + 1 s, t1]
        seg = [p for p in pushes if t0 + 1.0 < p["time"] <= t1]
        return round(sum(p["batch_size"] for p in seg) / (seg[-1]["time"] - seg[0]["time"]), 1) if len(seg) > 2 \
            else None

    first = next(r["time"] for r in recs if r.get("event") == "phase")
    edges = [first] + [t for b in bounds for t in b] + [pushes[-1]["time"]]
    segments = [rate(edges[2 * i], edges[2 * i + 1]) for i in range(len(bounds) + 1)]
    rows = []
    for i, (e, (t0, t1)) in enumerate(zip(events, bounds)):
        before = max((p["time"] for p in pushes if p["time"] <= t0), default=t0)
        after = min((p["time"] for p in pushes if p["time"] > t1), default=t1)
        what = f"{e['from']} -> {e['to']} workers" if e["event"] == "scaled" else f"restart switch ({COUNTS[-1]})"
        rows.append({"latency_ms": latency, "change": what, "engine_s": round(t1 - t0, 2),
                     "drain_save_s": e.get("drain_save_s", round(e.get("drain_s", 0) + e.get("save_s", 0), 3)),
                     "restart_s": e.get("restart_s", round(e.get("stop_old_s", 0) + e.get("start_new_s", 0), 3)),
                     # the new generation's open: its tasks listening, connect + build, restore, trace
                     **{k: e.get(k) for k in ("wait_tasks_s", "connect_build_s", "restore_s", "trace_s")},
                     "pause_s": round(after - before, 2), "command_s": round(waited[i][0], 2) if i < len(waited)
                     else None, "samples_per_s_before": segments[i], "samples_per_s_after": segments[i + 1]})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--latencies", type=float, nargs="+", default=[0.0, 10.0, 30.0], help="one-way ms per node")
    p.add_argument("--segment-s", type=float, default=15.0, help="seconds of training between changes")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench_scale"))
    p.add_argument("--keep", default=None, metavar="DIR", help="keep each run's directory in DIR")
    args = p.parse_args(argv)
    rows = []
    with testbed_bench.work_dir(args.keep) as work:
        for latency in args.latencies:
            bed = testbed_bench.up("benchsc", nodes=1 + COUNTS[-1], latency_ms=latency, log=print)
            try:
                for row in run_one(bed, latency, args, work):
                    rows.append(row)
                    print(row, flush=True)
            finally:
                bed.down()
    write_csv(args.out + ".csv", rows)
    plot(rows, args.out + ".png", args)
    print(f"wrote {args.out}.csv and .png")
    return 0


def plot(rows, path, args) -> None:
    from matplotlib.figure import Figure

    latencies = sorted({r["latency_ms"] for r in rows})
    kinds = list(dict.fromkeys(r["change"] for r in rows))
    colors = ["#4878a8", "#55a868", "#333333"]
    fig = Figure(figsize=(11, 4.2))
    a1, a2 = fig.subplots(1, 2)
    width = 0.8 / len(kinds)
    for k, kind in enumerate(kinds):
        for i, lat in enumerate(latencies):
            r = next((r for r in rows if r["latency_ms"] == lat and r["change"] == kind), None)
            if r is None:
                continue
            x = i + (k - (len(kinds) - 1) / 2) * width
            a1.bar(x, r["pause_s"], width, color=colors[k % len(colors)], label=kind if i == 0 else None)
            a1.bar(x, r["engine_s"], width * 0.4, color="white", alpha=0.5, hatch="//", edgecolor="black",
                   label="of it: the engine's drain, save, restart" if i == 0 and k == 0 else None)
            a1.annotate(f"{r['pause_s']:.1f}", (x, r["pause_s"]), ha="center", va="bottom", fontsize=7)
    a1.set_xticks(range(len(latencies)), [f"{lat:g} ms" for lat in latencies])
    a1.set_ylim(0, max(r["pause_s"] for r in rows) * 1.45)
    a1.set_ylabel("seconds without a push")
    a1.set_title("the pause a change costs", fontsize=10)
    a1.legend(fontsize=7, loc="upper left", ncol=2)
    for i, lat in enumerate(latencies):
        mine = [r for r in rows if r["latency_ms"] == lat and r["change"] != kinds[-1]]
        if not mine:
            continue
        speeds = [mine[0]["samples_per_s_before"]] + [r["samples_per_s_after"] for r in mine]
        counts = list(COUNTS[:len(speeds)])
        a2.plot(counts, speeds, marker="o", label=f"{lat:g} ms")
    a2.set_xticks(list(COUNTS))
    a2.set_xlabel("workers (BSP, 64 per worker per round)")
    a2.set_ylabel("samples/s")
    a2.set_title("throughput before and after each scale", fontsize=10)
    a2.set_ylim(bottom=0)
    a2.legend(fontsize=8)
    a2.grid(alpha=0.3)
    fig.suptitle(f"tfsync scale on the testbed: 2 -> 4 -> 8 workers, then a restart switch; wide MLP "
                 f"(hidden {args.hidden}), 2 CPU cores for every task", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
