"""BSP, ASP and Sync-Switch across separate hosts with network latency (issue 17): a
``tfsync testbed`` of N task nodes plus the coordinator's, every connection through the
latency relay, each node's one-way latency 0, 10 and 30 ms (the Sync-Switch paper
emulates 10 and 30 ms, Sync-Switch Sec. VI-A).

For each latency, the same job (MNIST, a wide MLP so that a step's pull and push are
large against its compute) runs as BSP, ASP and Sync-Switch (BSP for the first
``--switch-at`` of the workload, then ASP), configurations alternating within a repeat.
With ``--search R,M`` the switch point is not given but found first, as a recurring job
would have it (Sync-Switch Algorithm 1): ``tfsync search --runs R --settings M`` on the
testbed at the first latency (the point depends on how training converges, not on the
network), and every Sync-Switch run uses it.
Reported per run: training time, samples/s, final test accuracy (the whole test set), and
the time to reach the BSP run's final accuracy less half a point (from evaluations during
the run, on their test subset; the target is BSP's last evaluation on that subset). Writes
results/bench_testbed.csv and .png.

    sudo python experiments/bench_testbed.py --nodes 4 --workers 4 --repeats 1
    sudo python experiments/bench_testbed.py --nodes 8 --workers 8 --epochs 1 --momentum inverse_n --search 1,3 \
        --repeats 2 --out results/bench_testbed_8w
    sudo python experiments/bench_testbed.py --momentum inverse_n --switch-at 0.625 --repeats 2 \
        --out results/bench_testbed_4w      # 0.625: what --search 1,3 found for 4 workers

Beside them, native ``model.fit`` under ParameterServerStrategy (asynchronous), with 1 and
32 steps per execution (``--fits``), on task servers started from TF_CONFIG on the same
nodes, with the same data, model, loss, SGD and evaluations (``testbed_bench.fit_chief``:
every FIT_EPOCH steps; it trains whole epochs of those, so up to FIT_EPOCH - 1 steps more
than tfsync).

The machine has 2 cores: all tasks share them, so compute is slowed by the number of
tasks; the network share of a step grows with latency. Say so when quoting.
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
from testbed_bench import FITS, run_on_testbed, wide_mlp_job, write_csv  # noqa: E402

from tfsync.testbed.bed import Testbed  # noqa: E402

PROTOCOLS = {
    "bsp": '[[protocol]]\nname = "bsp"\n',
    "asp": '[[protocol]]\nname = "asp"\n',
    "sync-switch": '[[protocol]]\nname = "bsp"\nuntil = {at}\n[[protocol]]\nname = "asp"\n'
                   '[switch]\nmethod = "hot"\npoint = "job"\nmomentum = "{momentum}"\n',
}


def protocol_text(protocol: str, switch_at: float, momentum: str) -> str:
    """A Sync-Switch whose point is 1.0 (the search kept BSP to the end) is BSP."""
    if protocol == "sync-switch" and switch_at >= 1.0:
        protocol = "bsp"
    return PROTOCOLS[protocol].format(at=switch_at, momentum=momentum)


def job_text(run_dir: str, protocol: str, args, bed: Testbed) -> str:
    return (wide_mlp_job("bench-testbed", run_dir, args.hidden, args.epochs, args.eval_every)
            + protocol_text(protocol, args.switch_at, args.momentum) + bed.cluster_toml() + f"workers = {args.workers}\n")


def run_one(bed: Testbed, protocol: str, args, work: str) -> dict:
    run_dir = os.path.join(work, f"run-{protocol}")
    t0 = time.time()
    s = run_on_testbed(bed, os.path.join(work, f"{protocol}.toml"), job_text(run_dir, protocol, args, bed), run_dir)
    row = {"protocol": protocol, "wall_s": round(time.time() - t0, 2), "train_s": round(s["train_s"], 2),
           "samples_per_s": round(s["samples_per_s"], 1), "test_accuracy": round(s["test_accuracy"], 4),
           "evals": [(e["time"] - s["init_s"], e["accuracy"]) for e in s.get("evals", []) if "accuracy" in e]}
    row["last_eval_accuracy"] = round(row["evals"][-1][1], 4)   # on the evaluations' subset
    return row


def run_fit(bed, name: str, args, work: str) -> dict:
    """Native ``model.fit`` (ASP) on the nodes the hooks would have used, the same job."""
    run_dir = testbed_bench.fit_dir(work, name)
    text = wide_mlp_job("bench-testbed-fit", run_dir, args.hidden, args.epochs, args.eval_every)
    return {"protocol": name, **testbed_bench.run_fit(bed, text, run_dir, args.workers, FITS[name])}


def search_point(bed: Testbed, args, work: str) -> float:
    """The switch point ``tfsync search`` finds for the Sync-Switch job on the testbed."""
    job = os.path.join(work, "search.toml")
    with open(job, "w") as f:
        f.write(job_text(os.path.join(work, "run-search"), "sync-switch", args, bed))
    runs, settings = args.search.split(",")
    r = subprocess.run(bed.command("c", [sys.executable, "-m", "tfsync.cli", "search", job, "--runs", runs,
                                         "--settings", settings, "--json",
                                         "--store", os.path.join(work, "jobs.db")]), capture_output=True, text=True,
                       timeout=7200)
    if r.returncode != 0:
        raise RuntimeError(f"search failed ({r.returncode}): {r.stderr[-2000:]}")
    found = json.loads(r.stdout)
    tried = ", ".join(f"{t['fraction']:.4g}: {t['mean']:.4f}" for t in found["tried"])
    print(f"searched switch point: {found['fraction']:.4g} (BSP {found['bsp']}, target {found['target']:.4f} - "
          f"{found['beta']}; tried {tried}; {found['search_time_s']:.0f} s)", flush=True)
    return float(found["fraction"])


def time_to(evals, target: float) -> float | None:
    return next((round(t, 2) for t, acc in evals if acc >= target), None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--latencies", default="0,10,30", help="one-way ms per node, comma-separated")
    p.add_argument("--rate", default=None, help="every node's bandwidth (tc rate), default unshaped")
    p.add_argument("--epochs", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=512, help="the MLP's hidden width (wider: more to send)")
    p.add_argument("--eval-every", type=int, default=40)
    p.add_argument("--switch-at", type=float, default=0.25)
    p.add_argument("--momentum", default="keep",
                   help="Sync-Switch's momentum after the switch (switch.momentum: keep, zero, inverse_n, ...)")
    p.add_argument("--search", default=None, metavar="R,M",
                   help="find the switch point with `tfsync search --runs R --settings M` first (at the first latency)")
    p.add_argument("--repeats", type=int, default=1, help="0 with --search: the search alone")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench_testbed"))
    p.add_argument("--fits", default=",".join(FITS), help="native fits beside tfsync, comma-separated ('' for none)")
    p.add_argument("--replot", action="store_true", help="only draw OUT.png again from OUT.csv")
    p.add_argument("--summarise", action="store_true",
                   help="only write the pages' whole-job tables (results/bench_testbed_*.md) from the CSVs")
    args = p.parse_args(argv)
    if args.summarise:   # experiments/tables.py: the table, the command that made the CSV, its date
        import tables
        tables.write(tables.of_script("bench_testbed.py"))
        return 0
    if args.replot:
        plot(testbed_bench.read_csv(args.out + ".csv"), args.out + ".png", args)
        return 0
    rows = []
    bed = testbed_bench.up("bench", nodes=args.nodes, rate=args.rate, log=print)
    try:
        with testbed_bench.work_dir(None) as work:
            for k, latency in enumerate(float(x) for x in args.latencies.split(",")):
                for node in bed.nodes:
                    bed.set(node, latency_ms=latency)
                if args.search and k == 0:
                    args.switch_at = search_point(bed, args, work)
                    if args.repeats == 0:
                        return 0   # the search alone
                for repeat in range(args.repeats):
                    results = {name: run_one(bed, name, args, work) for name in PROTOCOLS}
                    results.update({name: run_fit(bed, name, args, work) for name in args.fits.split(",") if name})
                    # BSP's last evaluation, on the evaluations' own test subset (eval_samples): the
                    # same subset as the curves the time is read from (the whole test set's accuracy
                    # differs from it by up to half a point, so a run could end above a target
                    # taken from it without its curve ever reaching it)
                    target = results["bsp"]["last_eval_accuracy"] - 0.005
                    for name, r in results.items():
                        row = {"latency_ms": latency, "repeat": repeat, "workers": args.workers,
                               "switch_at": args.switch_at if name == "sync-switch" else None,
                               **{k: v for k, v in r.items() if k != "evals"},
                               "target_accuracy": round(target, 4), "time_to_target_s": time_to(r["evals"], target)}
                        rows.append(row)
                        print(row, flush=True)
                    write_csv(args.out + ".csv", rows)   # after each repeat: a run cut short keeps what it did
    finally:
        bed.down()
    plot(rows, args.out + ".png", args)
    print(f"wrote {args.out}.csv and .png")
    return 0


def plot(rows, path, args) -> None:
    from matplotlib.figure import Figure

    latencies = sorted({r["latency_ms"] for r in rows})
    names = list(dict.fromkeys(r["protocol"] for r in rows))   # tfsync's, then the native fits
    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    width = 0.8 / len(names)
    colors = {"bsp": "#4878a8", "asp": "#e08040", "sync-switch": "#509850", "fit": "#9a9a9a",
              "fit 32/exec": "#5a5a5a"}
    for k, name in enumerate(names):
        label = name if name.startswith("fit") else f"tfsync {name}"
        for ax, key in zip(axes, ("samples_per_s", "time_to_target_s")):
            xs, values = [i + (k - (len(names) - 1) / 2) * width for i in range(len(latencies))], []
            for x, lat in zip(xs, latencies):
                got = [r[key] for r in rows if r["latency_ms"] == lat and r["protocol"] == name]
                reached = [v for v in got if v is not None]
                values.append(sum(reached) / len(reached) if reached else 0)
                if len(reached) < len(got):   # a run that never reached the target: no bar hides it
                    ax.text(x, values[-1], f"{len(got) - len(reached)}/{len(got)}\nnever", ha="center",
                            va="bottom", fontsize=7)
            ax.bar(xs, values, width, label=label, color=colors.get(name))
    for ax, title in zip(axes, ("samples/s (higher is better)",
                                "seconds to BSP's accuracy - 0.5 pt (lower is better)")):
        ax.set_xticks(range(len(latencies)), [f"{lat:g} ms" for lat in latencies])
        ax.set_xlabel("one-way latency per node")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7.5)
    fig.suptitle(f"{args.workers} workers + 1 PS on {args.nodes} testbed nodes (2 CPU cores shared), MNIST MLP "
                 f"{args.hidden} wide; native fit: model.fit, ParameterServerStrategy (ASP)", fontsize=9.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
