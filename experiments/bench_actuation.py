"""Actuation benchmark (Sync-Switch §V, Table III): parallel vs sequential node hooks.

Sync-Switch's cluster manager actuates its nodes' hooks in parallel; the paper reports
that this halves cluster initialisation (8 K80: 157 -> 90 s, 16 K80: 268 -> 128 s) and
cuts switching time about 3x (90 -> 36 s, 165 -> 53 s) against a sequential actuator.

Here: H node hooks (``tfsync.hooks.node.serve``) run in this process on free loopback
ports, one per task of a 1 PS + 2 workers cluster by default, and
``tfsync.engine.launcher.HookLauncher`` drives them. Each task is a real TF task process
(``python -m tfsync.engine.server``) launched by its hook. Per mode, measured in one run:

  init     StartTasks of every task until every port is open
  restart  RestartTask of every task until every port is open again (the restart part
           of a switch; the paper's switching also checkpoints and restores)

repeated (default 3) with the order of the two modes alternating. All hooks share this
machine's cores: parallel TF start-ups compete for CPU (2 cores here), so the
sequential/parallel ratios are a lower bound of what hooks on separate nodes get.
Writes results/bench_actuation.csv and .png.

    python experiments/bench_actuation.py [--hooks 3] [--ps 1] [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import statistics
import sys
import tempfile
import time

from tfsync.api import auth
from tfsync.base.ports import free_ports
from tfsync.hooks import node
from tfsync.hooks.tasks import port_open
from tfsync.engine.launcher import HookLauncher

HERE = os.path.dirname(os.path.abspath(__file__))
# Table III of Sync-Switch: (cluster, init seq, init par, switching seq, switching par), seconds.
PAPER = [("8 K80", 157, 90, 90, 36), ("16 K80", 268, 128, 165, 53)]
PAPER_CLAIM = {"init": 2.0, "restart": 3.1}   # the text: "by 2X and 3.1X"
MODES = ("parallel", "sequential")
PHASES = ("init", "restart")


def make_spec(ps: int, workers: int) -> dict:
    ports = free_ports(1 + ps + workers)
    addr = [f"127.0.0.1:{p}" for p in ports]
    return {"chief": addr[:1], "ps": addr[1:1 + ps], "worker": addr[1 + ps:]}


def all_open(spec: dict) -> bool:
    return all(port_open(a) for job in ("ps", "worker") for a in spec[job])


def one_run(hooks, mode: str, ps: int, workers: int, timeout: float) -> dict:
    spec = make_spec(ps, workers)
    launcher = HookLauncher(hooks, parallel=(mode == "parallel"), timeout=timeout)
    try:
        launcher.start(spec)
        assert all_open(spec), f"{mode}: a task port is closed after start"
        first = launcher.pids
        launcher.restart_all()
        assert all_open(spec), f"{mode}: a task port is closed after restart_all"
        assert all(launcher.pids[t] != first[t] for t in first), f"{mode}: a task kept its pid over a restart"
    finally:
        launcher.stop()
    per_call = {w: [c.seconds for c in launcher.calls if c.what == w] for w in ("start", "restart")}
    return {"init": launcher.init_s, "restart": launcher.restart_s, "stop": launcher.stop_s,
            "call_start_mean": statistics.mean(per_call["start"]),
            "call_restart_mean": statistics.mean(per_call["restart"])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hooks", type=int, default=3, help="node hooks (default 3: one per task)")
    p.add_argument("--ps", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=180.0, help="seconds a task may take to open its port")
    p.add_argument("--pause", type=float, default=2.0, help="seconds between runs (let the CPU settle)")
    p.add_argument("--out", default=os.path.join(HERE, "..", "results"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    tasks = args.ps + args.workers
    if args.hooks < 1 or args.ps < 1 or args.workers < 1 or args.repeats < 1:
        p.error("--hooks, --ps, --workers and --repeats must be >= 1")

    cores = os.cpu_count() or 1
    load0 = os.getloadavg()[0]
    print(f"bench_actuation: {args.hooks} hooks in this process, {args.ps} PS + {args.workers} workers "
          f"(real TF task processes), {args.repeats} repeats, {cores} cores, load average {load0:.1f}")
    token = auth.new_token()
    log_dir = tempfile.mkdtemp(prefix="tfsync-bench-actuation-")
    servers, rows = [], []
    try:
        for h in range(args.hooks):
            server, port = node.serve(token=token, log_dir=os.path.join(log_dir, f"hook-{h}"), node=f"node-{h}")
            servers.append((server, f"127.0.0.1:{port}"))
        hooks = [(address, token) for _, address in servers]
        for r in range(args.repeats):
            order = MODES if r % 2 == 0 else MODES[::-1]
            for pos, mode in enumerate(order):
                time.sleep(args.pause)
                res = one_run(hooks, mode, args.ps, args.workers, args.timeout)
                print(f"  repeat {r + 1} #{pos + 1} {mode:10s} init {res['init']:6.2f} s  restart "
                      f"{res['restart']:6.2f} s  (one StartTasks call {res['call_start_mean']:.2f} s, one "
                      f"RestartTask {res['call_restart_mean']:.2f} s, stop {res['stop']:.2f} s)", flush=True)
                rows.append({"repeat": r + 1, "position": pos + 1, "mode": mode, **res})
    finally:
        for server, _ in servers:
            server.stop(grace=None)
    load1 = os.getloadavg()[0]

    def values(mode, phase):
        return [row[phase] for row in rows if row["mode"] == mode]

    summary = {}
    for phase in PHASES:
        par, seq = values("parallel", phase), values("sequential", phase)
        per_repeat = [s / q for s, q in zip(seq, par)]
        summary[phase] = {"par_mean": statistics.mean(par), "seq_mean": statistics.mean(seq),
                          "par_sd": statistics.pstdev(par), "seq_sd": statistics.pstdev(seq),
                          "ratio": statistics.mean(seq) / statistics.mean(par),
                          "ratio_min": min(per_repeat), "ratio_max": max(per_repeat)}

    print()
    print(f"{'':8s} {'parallel (s)':>14s} {'sequential (s)':>15s} {'seq/par':>8s} {'per repeat':>12s}   "
          f"paper Table III seq/par")
    for phase in PHASES:
        s = summary[phase]
        paper = ", ".join(f"{c}: {(a if phase == 'init' else c2) / (b if phase == 'init' else d2):.2f}x"
                          for c, a, b, c2, d2 in PAPER)
        label = "init" if phase == "init" else "restart"
        print(f"{label:8s} {s['par_mean']:8.2f}±{s['par_sd']:4.2f} {s['seq_mean']:9.2f}±{s['seq_sd']:4.2f} "
              f"{s['ratio']:7.2f}x {s['ratio_min']:5.2f}-{s['ratio_max']:4.2f}x   {paper} "
              f"(claimed {PAPER_CLAIM[phase]:.1f}x{', switching' if phase == 'restart' else ''})")
    print()
    print(f"note: the {tasks} TF task start-ups of a parallel actuation share this machine's {cores} cores "
          f"(load average {load0:.1f} before, {load1:.1f} after; other work runs here too), so the ratios are a "
          f"lower bound of what hooks on separate nodes get: there each start-up has its own CPU and the ideal "
          f"ratio is the number of hooks actuated ({min(args.hooks, tasks)}). The paper's switching also "
          "checkpoints and restores; this measures the restart of every task only.")

    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "bench_actuation.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "repeat", "position", "mode", "phase", "seconds", "seq_over_par", "paper_seq_over_par",
                    "hooks", "ps", "workers", "cores"])
        for row in rows:
            for phase in (*PHASES, "stop"):
                w.writerow(["run", row["repeat"], row["position"], row["mode"], phase, f"{row[phase]:.4f}", "", "",
                            args.hooks, args.ps, args.workers, cores])
        for phase in PHASES:
            s = summary[phase]
            for mode in MODES:
                w.writerow(["mean", "", "", mode, phase, f"{s[mode[:3] + '_mean']:.4f}", f"{s['ratio']:.3f}",
                            PAPER_CLAIM[phase], args.hooks, args.ps, args.workers, cores])
    print(f"wrote {os.path.relpath(csv_path)}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    width, colors = 0.38, {"sequential": "#d62728", "parallel": "#1f77b4"}
    for k, mode in enumerate(("sequential", "parallel")):
        xs = [i + (k - 0.5) * width for i in range(len(PHASES))]
        means = [summary[ph][mode[:3] + "_mean"] for ph in PHASES]
        ax1.bar(xs, means, width, color=colors[mode], alpha=0.8, label=mode)
        for x, ph in zip(xs, PHASES):
            pts = values(mode, ph)
            ax1.plot([x] * len(pts), pts, "k.", ms=5)
    ax1.set_xticks(range(len(PHASES)), ["cluster init", "restart all tasks"])
    ax1.set_ylabel("seconds until every task port is open")
    ax1.set_title(f"{args.hooks} hooks, {args.ps} PS + {args.workers} workers, {cores} cores")
    ax1.legend()
    xs = range(len(PHASES))
    ax2.bar([x - 0.27 for x in xs], [summary[ph]["ratio"] for ph in PHASES], 0.27, color="#2ca02c",
            label="measured (this machine)")
    for i, (cluster, a, b, c, d) in enumerate(PAPER):
        ax2.bar([x + 0.27 * i for x in xs], [a / b, c / d], 0.27, color=["#9467bd", "#8c564b"][i], alpha=0.8,
                label=f"paper Table III, {cluster}")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set_xticks(list(xs), ["init", "restart / switching"])
    ax2.set_ylabel("sequential / parallel")
    ax2.set_title("speed-up of parallel actuation")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    png = os.path.join(args.out, "bench_actuation.png")
    fig.savefig(png, dpi=120)
    print(f"wrote {os.path.relpath(png)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
