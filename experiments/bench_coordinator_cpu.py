"""Where the CPU goes on a fast model (issue 30): each process's share of the cores
during training, tuned ``model.fit`` beside tfsync ASP with a drain per record and with
lingering drains (tfsync.engine.links), and tfsync BSP with rounds on the PS.

The tabular MLP of examples/regression (Adam, batch 16; a step of a few milliseconds) on
a fresh local cluster (2 workers + 1 PS) for each configuration, alternating within each
repeat. A thread samples every process's CPU time (``psutil``) each 0.5 s; the training
window is the middle half of the samples where the tasks together use at least 70 % of
their peak, and a process's share is its CPU seconds over that window's seconds (1.0 =
one core). Rates are steps/s
(fit: its 2nd epoch; tfsync: the steady part of its pushes). Medians of the repeats.
Writes results/bench_coordinator_cpu.csv and .png.

    python experiments/bench_coordinator_cpu.py --repeats 2

On this machine every process shares 2 cores: what the coordinator uses, the workers and
the PS do not get.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import psutil  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from bench_user_models import native_fit, tfsync_rate, workload  # noqa: E402
from testbed_bench import write_csv  # noqa: E402

CONFIGS = ("fit, 32 steps/execution", "tfsync ASP, a drain per record", "tfsync ASP, lingering drains",
           "tfsync BSP (PS rounds)")


class CpuSampler:
    """Every 0.5 s, the CPU seconds of this process (the coordinator) and of its children
    (the tasks), each by pid."""

    def __init__(self, every: float = 0.5):
        self.every, self.samples = every, []   # (time, {pid: cpu seconds})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.every):
            cpu = {}
            for p in [me] + me.children(recursive=True):
                try:
                    t = p.cpu_times()
                    cpu[p.pid] = t.user + t.system
                except psutil.Error:
                    pass
            self.samples.append((time.monotonic(), cpu))

    def shares(self) -> dict:
        """``coordinator`` and ``tasks`` (all children) in cores over the training window."""
        me = os.getpid()
        steps = []
        for (t0, a), (t1, b) in zip(self.samples, self.samples[1:]):
            rate = {pid: (b[pid] - a.get(pid, b[pid])) / (t1 - t0) for pid in b}
            steps.append(rate)
        tasks = np.array([sum(v for pid, v in r.items() if pid != me) for r in steps])
        busy = np.flatnonzero(tasks >= 0.7 * tasks.max())
        window = np.zeros(len(steps), bool)   # the middle half of the busy samples (not the tasks' start)
        window[busy[len(busy) // 4: len(busy) - len(busy) // 4]] = True
        return {"coordinator": float(np.mean([r.get(me, 0.0) for r, w in zip(steps, window) if w])),
                "tasks": float(tasks[window].mean())}


def tfsync_run(work, batch: int, steps: int, workers: int, out_dir: str, protocol: str, linger: bool) -> float:
    from tfsync import policy as P

    policy = P.get(protocol, sizer=P.BatchSizer(batch))
    if not linger:   # its records at once: a drain each
        policy.patience = lambda view: 0.0
    return tfsync_rate(work, protocol, batch, steps, workers, out_dir, policy=policy)


def run(config: str, work, batch: int, steps: int, workers: int, out_dir: str) -> dict:
    with CpuSampler() as cpu:
        if config.startswith("fit"):
            rate = native_fit(work, batch, steps, workers, per_execution=32)
        elif "BSP" in config:
            rate = tfsync_run(work, batch, steps, workers, out_dir, "bsp", linger=True)
        else:
            rate = tfsync_run(work, batch, steps, workers, out_dir, "asp", linger="lingering" in config)
    return {"steps_per_s": rate, **cpu.shares()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=2000, help="steps of each configuration (fit: per epoch)")
    p.add_argument("--out", default=os.path.join(ROOT, "results"))
    args = p.parse_args(argv)
    cfg, work = workload("examples/regression/job.toml", [])
    batch = cfg.train.batch_size
    measured = {c: [] for c in CONFIGS}
    for rep in range(args.repeats):
        for config in CONFIGS:
            m = run(config, work, batch, args.steps, args.workers, os.path.join(args.out, "bench_coordinator_cpu_run"))
            measured[config].append(m)
            print(f"  repeat {rep + 1}: {config:<32} {m['steps_per_s']:7.1f} steps/s, coordinator "
                  f"{m['coordinator']:.2f} cores, tasks {m['tasks']:.2f}", flush=True)
    shutil.rmtree(os.path.join(args.out, "bench_coordinator_cpu_run"), ignore_errors=True)
    tuned = float(np.median([m["steps_per_s"] for m in measured[CONFIGS[0]]]))
    rows = []
    for config, ms in measured.items():
        med = {k: float(np.median([m[k] for m in ms])) for k in ms[0]}
        rows.append({"configuration": config, "steps_per_s": round(med["steps_per_s"], 1),
                     "ratio_to_tuned_fit": round(med["steps_per_s"] / tuned, 3),
                     "coordinator_cores": round(med["coordinator"], 3), "tasks_cores": round(med["tasks"], 3),
                     "coordinator_ms_per_step": round(1e3 * med["coordinator"] / med["steps_per_s"], 3),
                     "runs": " ".join(f"{m['steps_per_s']:.1f}" for m in ms)})
        print(f"{config:<32} {rows[-1]['steps_per_s']:7.1f} steps/s ({rows[-1]['ratio_to_tuned_fit']:.2f}x tuned fit), "
              f"coordinator {med['coordinator']:.2f} cores ({rows[-1]['coordinator_ms_per_step']:.2f} ms a step), "
              f"tasks {med['tasks']:.2f}")
    path = os.path.join(args.out, "bench_coordinator_cpu.csv")
    write_csv(path, rows)
    plot(rows, os.path.join(args.out, "bench_coordinator_cpu.png"))
    print(f"wrote {path}")
    return 0


def plot(rows, path: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.4), layout="constrained")
    rate_ax, cpu_ax = fig.subplots(1, 2)
    names = [r["configuration"].replace(", ", ",\n").replace(" (", "\n(") for r in rows]
    bars = rate_ax.bar(names, [r["steps_per_s"] for r in rows], color=["#9a9a9a", "#c8a080", "#e08040", "#4878a8"])
    for b, r in zip(bars, rows):
        rate_ax.annotate(f"{r['ratio_to_tuned_fit']:.2f}x", (b.get_x() + b.get_width() / 2, b.get_height()),
                         ha="center", va="bottom", fontsize=8)
    rate_ax.set_ylabel("steps/s (2 workers)")
    rate_ax.set_title("training rate (x tuned fit)")
    coord = [r["coordinator_cores"] for r in rows]
    cpu_ax.bar(names, [r["tasks_cores"] for r in rows], color="#c8c8c8", label="PS and workers")
    cpu_ax.bar(names, coord, bottom=[r["tasks_cores"] for r in rows], color="#e08040", label="coordinator")
    cpu_ax.axhline(2.0, color="k", ls=":", lw=1)
    cpu_ax.set_ylabel("cores used during training")
    cpu_ax.set_title("CPU of each process (2 cores)")
    cpu_ax.legend(fontsize=8, loc="lower right")
    for ax in (rate_ax, cpu_ax):
        ax.tick_params(axis="x", labelsize=7)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
