"""Sync-Switch's straggler policies when one node's link slows for a while (issue 17;
Sync-Switch Sec. IV-B2 and VI-B3, here with the network as the cause rather than a paused
process).

A ``tfsync testbed`` of 5 nodes: the PS on n1, 4 workers on n2..n5, every node's one-way
latency ``--latency``. The job (MNIST, the wide MLP of bench_testbed.py) runs BSP for the
first ``--switch-at`` of its workload, then ASP. ``--episode-s`` seconds after training
starts, n3's link (worker 1) turns slow (``--slow-latency`` one-way) for ``--slow-s``
seconds, then recovers. Each run uses one straggler policy before the switch: none (the
plain plan), greedy (the whole cluster runs ASP while a straggler is seen, then BSP
again) or elastic (the straggler leaves BSP's membership and is readmitted later); and, beside
them, ASP for the whole workload, what a user gets without any synchronous phase, and
native ``model.fit`` under ParameterServerStrategy (asynchronous) with 1 and 32 steps per
execution (``--fits``) on task servers on the same nodes, n3 slowed as for the others
from ``--episode-s`` after its timed training starts (``testbed_bench.run_fit``; it trains
whole epochs of FIT_EPOCH steps: up to 127 steps more than tfsync).
Reported per run: training time, test accuracy, and what the detector saw (from the BSP
phase's stats). Configurations alternate within each repeat. Writes results/bench_testbed_stragglers.csv and .png.

    sudo python experiments/bench_testbed_stragglers.py --repeats 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import textwrap
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

sys.path.insert(0, os.path.join(ROOT, "experiments"))
import testbed_bench  # noqa: E402
from testbed_bench import (FITS, STARTED, fit_dir, run_fit, run_on_testbed, training_started, wide_mlp_job,
                           write_csv)  # noqa: E402

from tfsync.testbed.bed import Testbed  # noqa: E402

POLICIES = ("none", "greedy", "elastic", "asp")
COLORS = {"none": "#4878a8", "greedy": "#c44e52", "elastic": "#55a868", "asp": "#e08040", "fit": "#9a9a9a",
          "fit 32/exec": "#5a5a5a"}
LABELS = {"none": "plain plan", "greedy": "greedy", "elastic": "elastic", "asp": "ASP only", "fit": "native fit",
          "fit 32/exec": "native fit,\n32 steps/exec"}


def job_text(run_dir: str, policy: str, args, bed: Testbed) -> str:
    head = wide_mlp_job("bench-testbed-stragglers", run_dir, args.hidden, args.epochs)
    if policy == "asp":
        return head + '[[protocol]]\nname = "asp"\n' + bed.cluster_toml() + "workers = 4\n"
    return head + textwrap.dedent(f"""
        [[protocol]]
        name = "bsp"
        until = {args.switch_at}
        [[protocol]]
        name = "asp"
        [switch]
        point = "job"
        stragglers = "{policy}"
        straggler_window_s = {args.window_s}
        straggler_k = 2
        readmit_after_s = {args.readmit_s}
        """) + bed.cluster_toml() + "workers = 4\n"


def slow_link(bed: Testbed, run_dir: str, args, stop: threading.Event, seen: dict) -> None:
    """n3's link slow from ``episode_s`` after training starts, for ``slow_s``."""
    while not stop.is_set() and not training_started(run_dir):
        time.sleep(0.1)
    if stop.wait(args.episode_s):
        return
    bed.set("n3", latency_ms=args.slow_latency)
    seen["slowed_at"] = time.time()
    stop.wait(args.slow_s)
    bed.set("n3", latency_ms=args.latency)
    seen["restored_at"] = time.time()


def with_episode(bed: Testbed, run_dir: str, args, run):
    """``run()``, n3's link slowed during it (``slow_link``); returns its result and when
    n3 was slowed and restored (epoch seconds)."""
    stop, seen = threading.Event(), {}
    t = threading.Thread(target=slow_link, args=(bed, run_dir, args, stop, seen), daemon=True)
    t.start()
    try:
        return run(), seen
    finally:
        stop.set()
        t.join()
        bed.set("n3", latency_ms=args.latency)


def run_native(bed: Testbed, name: str, args, work: str, repeat: int) -> dict:
    """Native fit of the plan's job (``FITS[name]`` steps per execution), 4 workers."""
    run_dir = fit_dir(work, name, f"-{repeat}")
    text = wide_mlp_job("bench-testbed-stragglers", run_dir, args.hidden, args.epochs)
    r, seen = with_episode(bed, run_dir, args, lambda: run_fit(bed, text, run_dir, 4, FITS[name]))
    start = os.path.getmtime(os.path.join(run_dir, STARTED))
    return {"policy": name, "train_s": r["train_s"], "test_accuracy": r["test_accuracy"],
            **{f"{k}_s": round(seen[f"{k}_at"] - start, 2) if f"{k}_at" in seen else None
               for k in ("slowed", "restored")}}


def run_one(bed: Testbed, policy: str, args, work: str, repeat: int) -> dict:
    run_dir = os.path.join(work, f"run-{policy}-{repeat}")   # a new one: slow_link waits for its first phase
    s, seen = with_episode(bed, run_dir, args, lambda: run_on_testbed(
        bed, os.path.join(work, f"{policy}.toml"), job_text(run_dir, policy, args, bed), run_dir))
    stats = s["timeline"][0].get("stats", {})
    start = s["started_at"] + s["init_s"]   # training starts: the episode's clock (epoch seconds)

    def since(t):
        return None if t is None else round(t - start, 2)

    membership = stats.get("membership", [])
    return {"policy": policy, "train_s": round(s["train_s"], 2), "test_accuracy": round(s["test_accuracy"], 4),
            "slowed_s": since(seen.get("slowed_at")), "restored_s": since(seen.get("restored_at")),
            "switches": stats.get("switches", 0), "removals": stats.get("removals", 0),
            "detections": sum(1 for d in stats.get("detected", []) if d[2] == "became"),
            # "w1@7.3": worker 1, 7.3 s into training
            "detected": ";".join(f"w{w}@{since(t)}" for t, w, kind in stats.get("detected", []) if kind == "became"),
            "removed": ";".join(f"w{w}@{since(t)}" for t, what, w in membership if what == "remove"),
            "readmitted": ";".join(f"w{w}@{since(t)}" for t, what, w in membership if what == "restore"),
            "bsp_phase_s": bsp_phase_s(s)}


def bsp_phase_s(summary: dict) -> float | None:
    """Seconds from the start of BSP to the switch to ASP for good: the second timeline
    entry for the plain plan; a straggler policy is one entry that switches itself (its
    stats' states, "final" from the switch point on)."""
    timeline = summary["timeline"]
    if len(timeline) > 1:
        return round(timeline[1]["time"] - timeline[0]["time"], 2)
    states = timeline[0].get("stats", {}).get("states", [])
    final = next((t for t, state in states if state == "final"), None)
    return round(final - states[0][0], 2) if final is not None else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--latency", type=float, default=10.0, help="every node's one-way ms")
    p.add_argument("--slow-latency", type=float, default=80.0, help="n3's one-way ms while slow")
    p.add_argument("--episode-s", type=float, default=3.0, help="seconds after training starts that n3 slows")
    p.add_argument("--slow-s", type=float, default=20.0, help="how long n3 stays slow")
    p.add_argument("--epochs", type=float, default=0.6)
    p.add_argument("--switch-at", type=float, default=0.6, help="BSP for this share of the workload")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--window-s", type=float, default=2.0)
    p.add_argument("--readmit-s", type=float, default=15.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench_testbed_stragglers"))
    p.add_argument("--keep", default=None, metavar="DIR", help="keep each run's directory in DIR")
    p.add_argument("--fits", default=",".join(FITS), help="native fits beside tfsync, comma-separated ('' for none)")
    args = p.parse_args(argv)
    rows = []
    bed = testbed_bench.up("benchst", nodes=5, latency_ms=args.latency, log=print)
    try:
        with testbed_bench.work_dir(args.keep) as work:
            for repeat in range(args.repeats):
                runs = [(policy, run_one) for policy in POLICIES]
                runs += [(name, run_native) for name in args.fits.split(",") if name]
                for policy, run in runs:
                    row = {"repeat": repeat, **run(bed, policy, args, work, repeat)}
                    rows.append(row)
                    print(row, flush=True)
    finally:
        bed.down()
    write_csv(args.out + ".csv", rows)
    base = statistics.median(r["train_s"] for r in rows if r["policy"] == "none")
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        t = statistics.median(r["train_s"] for r in mine)
        print(f"{policy:12s} train {t:6.1f} s (x{base / t:.2f} the plain plan), accuracy "
              f"{statistics.median(r['test_accuracy'] for r in mine):.4f}, detections "
              f"{[r.get('detections') for r in mine]}")
    plot(rows, args.out + ".png", args)
    print(f"wrote {args.out}.csv and .png")
    return 0


def plot(rows, path, args) -> None:
    from matplotlib.figure import Figure

    policies = list(dict.fromkeys(r["policy"] for r in rows))   # tfsync's, then the native fits
    fig = Figure(figsize=(12, 4.2))
    a1, a2 = fig.subplots(1, 2)
    for i, policy in enumerate(policies):
        mine = [r for r in rows if r["policy"] == policy]
        a1.bar(i, statistics.median(r["train_s"] for r in mine), color=COLORS[policy])
        a1.scatter([i] * len(mine), [r["train_s"] for r in mine], color="black", s=10, zorder=3)
        a2.bar(i, statistics.median(r["test_accuracy"] for r in mine) * 100, color=COLORS[policy])
    for ax, title in ((a1, "training time, s (dots: runs)"), (a2, "test accuracy, %")):
        ax.set_xticks(range(len(policies)), [LABELS[p] for p in policies], fontsize=8)
        ax.set_title(title, fontsize=10)
    lo = min(r["test_accuracy"] for r in rows) * 100
    a2.set_ylim(max(0, lo - 3), 100)
    fig.suptitle(f"4 workers on 4 testbed nodes at {args.latency:g} ms; n3's link at {args.slow_latency:g} ms for "
                 f"{args.slow_s:g} s during BSP", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
