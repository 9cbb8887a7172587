"""The coordinator's capacity projected to 8-256 workers (issue 55): the simulator
(tfsync.sim, ``coordinator_s``) runs ASP on workers whose steps take ``--step-ms``,
with the coordinator spending a measured time on each push, one push at a time.

The costs come from this machine's measurements:

- ``measured``: the coordinator's CPU per ASP push on real clusters of the tiny model,
  the median over the worker counts in ``results/bench_coordinator_scale.csv`` (one run
  each on 2 shared cores is noisy; everything: the engine's Python, TensorFlow's
  runtime, gRPC), as if each push cost that at any rate: a floor;
- ``Python only``: the engine's Python per push with a stand-in PS
  (``results/bench_coordinator_capacity.csv``, ASP, the largest block): the bound where
  every remote call carries so many rows that its own cost vanishes: a ceiling;
- ``modelled``: between them, what the two measurements imply. The remote calls (drains,
  releases) come at a rate set by time, not by pushes (a drain waits up to ASP's
  patience, at most 80 ms, and a release follows each), so their CPU is a share ``K`` of
  the core whatever the push rate: ``K`` = the measured cores less the Python's cost of
  the pushes measured (the median over the worker counts). The Python then has ``1 - K``
  of the core: each push costs ``python / (1 - K)`` of it.

BSP needs no projection: its rounds run on the PS (tfsync.engine.pilot) and wait for no
decision of the coordinator. Writes results/bench_coordinator_projection.csv and .png.

    python experiments/bench_coordinator_projection.py --step-ms 20
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from tfsync import policy as P  # noqa: E402
from tfsync.sim import Simulator  # noqa: E402
from tfsync.sim.speeds import SpeedModel  # noqa: E402
from testbed_bench import write_csv  # noqa: E402

WORKERS = (8, 16, 32, 64, 128, 256)


def measured_costs(results: str) -> dict:
    """Milliseconds per push: {label: ms} from the two benchmarks' CSVs."""
    with open(os.path.join(results, "bench_coordinator_scale.csv")) as f:
        scale = list(csv.DictReader(f))
    with open(os.path.join(results, "bench_coordinator_capacity.csv")) as f:
        python = [r for r in csv.DictReader(f) if r["protocol"] == "asp" and r["code"] == "after"]
    python_ms = float(max(python, key=lambda r: int(r["block"]))["cpu_ms_per_push"])
    counts = f"{scale[0]['workers']}-{scale[-1]['workers']} workers"
    calls = statistics.median(float(r["asp_coordinator_cores"]) - float(r["asp"]) * python_ms / 1000 for r in scale)
    if not 0 <= calls < 0.9:
        raise ValueError(f"the remote calls' share of the core came out as {calls:.2f}")
    return {f"measured ({counts})": statistics.median(float(r["asp_coordinator_ms_per_push"]) for r in scale),
            f"modelled (remote calls {calls:.2f} of a core)": python_ms / (1 - calls),
            "Python only": python_ms}


def pushes_per_s(workers: int, step_s: float, coordinator_ms: float) -> float:
    speeds = SpeedModel(fixed=step_s, per_sample=0.0, jitter=0.05, seed=1)
    r = Simulator(workers, speeds, coordinator_s=coordinator_ms / 1000, record=False).run(
        P.get("asp"), pushes=100 * workers)
    return r.pushes / r.time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step-ms", type=float, default=20.0, help="a worker's step, milliseconds")
    p.add_argument("--results", default="results", help="where the measurements are, and the output goes")
    args = p.parse_args(argv)
    if args.step_ms <= 0:
        p.error(f"--step-ms: must be > 0, got {args.step_ms}")
    try:
        costs = {"no coordinator cost": 0.0, **measured_costs(args.results)}
    except (OSError, KeyError, ValueError) as e:
        p.error(f"--results: the measurements are missing or old ({e}); run bench_coordinator_scale.py and "
                "bench_coordinator_capacity.py --label after first")
    rows = []
    for label, ms in costs.items():
        for n in WORKERS:
            rate = pushes_per_s(n, args.step_ms / 1000, ms)
            rows.append({"cost": label, "coordinator_ms_per_push": ms, "workers": n,
                         "pushes_per_s": round(rate, 1), "share_of_demand": round(rate * args.step_ms / 1000 / n, 3)})
            print(f"{label:38s} {ms:6.3f} ms  {n:4d} workers: {rate:8.0f} pushes/s "
                  f"({rows[-1]['share_of_demand']:.0%} of what the workers could push)", flush=True)
    path = os.path.join(args.results, "bench_coordinator_projection.csv")
    write_csv(path, rows)
    _plot(rows, args.step_ms, os.path.join(args.results, "bench_coordinator_projection.png"))
    print(f"wrote {path}")
    return 0


def _plot(rows, step_ms: float, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for label in dict.fromkeys(r["cost"] for r in rows):
        mine = [r for r in rows if r["cost"] == label]
        ms = mine[0]["coordinator_ms_per_push"]
        ax.plot([r["workers"] for r in mine], [r["pushes_per_s"] for r in mine], "o-" if ms else "k:",
                label=f"{label}: {ms:.2f} ms a push" if ms else label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(WORKERS, [str(w) for w in WORKERS])
    ax.set_xlabel("workers")
    ax.set_ylabel("ASP pushes / s (simulated)")
    ax.set_title(f"one coordinator core, workers of {step_ms:g} ms steps", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
