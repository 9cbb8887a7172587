"""Time to accuracy under heterogeneity (issue 54): tfsync's protocols and policies against
native ``model.fit`` on a ``tfsync testbed`` whose workers are slow, uneven or changing.

A testbed of ``--workers`` worker nodes (n2..), the PS on n1, the coordinator (and fit's
chief) on c; every node ``--latency`` ms one way; each worker node capped at ``--cpu``
CPUs (a cgroup quota over its hook and tasks, as a container's CPU limit); the PS's node
uncapped. The job: MNIST on the wide MLP (``--model mlp``: a step of a few ms of compute
against large transfers) or a small CNN on the CIFAR-10 subset (``--model cnn``: compute
dominates), an evaluation on 2,000 test images every ``--eval-every`` steps.

Scenarios (``--scenario``, one CSV each: ``results/bench_heterogeneity_<model>_<n>w_<scenario>.csv``):
- ``homogeneous``: every worker alike;
- ``cpu``: worker 1's node has a third of the others' CPU for the whole run;
- ``bandwidth``: every worker's link at ``--rate``, worker 1's at a quarter of it;
- ``transient``: worker 1 three times slower (a third of its CPU) for 20 s, then normal
  for 20 s, repeated, from 5 s after training starts;
- ``trace``: each worker's CPU share follows one machine of the Alibaba 2018 trace
  (``--trace``), share = cpu x (1 - utilisation), time-compressed ``--trace-speed`` times.
The time-varying parts start when training starts (tfsync's first phase; fit's timed
epochs, after its warm-up epoch).

Configurations (``--configs``): native fit with 1 and 32 steps per execution
(asynchronous, on task servers started from TF_CONFIG on the same nodes:
``testbed_bench.run_fit``), and tfsync BSP, ASP, SSP, LB-BSP, Sync-Switch (BSP for
``--switch-at`` of the workload, then ASP: set it to the point ``tfsync search`` finds for
the job), the greedy straggler policy (BSP, ASP while a straggler is seen), RLP (the
bundled ``results/rlp/policy_stable.npz``) and ``auto``. They alternate within each seed.

Per run: training time, the test-accuracy curve, final test accuracy and, for tfsync,
per-update time and per-worker batch sizes from the push records. ``--summarise`` then
reads every scenario's CSV: the target is, per seed, BSP's last evaluated accuracy less
0.5 point; time to target is where a run's curve first reaches it (linear between the two
evaluations around it); accuracy at a fixed time is each curve read at the time the fastest
configuration of that seed finished. Medians over seeds with min-max spread; a PNG and a
Markdown table (``results/bench_heterogeneity_<model>_<n>w.png`` / ``.md``).

    sudo python experiments/bench_heterogeneity.py --scenario cpu --seeds 0,1,2
    python experiments/bench_heterogeneity.py --summarise

Runs of a scenario's CSV with the same (seed, config) are replaced, so a matrix is built a
part at a time. The machine has 2 cores: compare configurations within one scenario and seed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
from bench_lbbsp import analyse  # noqa: E402
from bench_predictors import read_pushes  # noqa: E402
import testbed_bench  # noqa: E402
from testbed_bench import FITS, fit_dir, read_csv, run_fit, run_on_testbed, training_started, write_csv  # noqa: E402
from heterogeneity_summary import SCENARIOS, median, summarise_scenario, summary_text  # noqa: E402
import tables  # noqa: E402

SLOW = "n3"   # worker 1's node
RLP_MODEL = os.path.join(ROOT, "results", "rlp", "policy_stable.npz")
PROTOCOLS = {
    "BSP": '[[protocol]]\nname = "bsp"\n',
    "ASP": '[[protocol]]\nname = "asp"\n',
    "SSP": '[[protocol]]\nname = "ssp"\n',
    "LB-BSP": '[[protocol]]\nname = "lbbsp"\n',
    "Sync-Switch": '[[protocol]]\nname = "bsp"\nuntil = {switch_at}\n[[protocol]]\nname = "asp"\n'
                   '[switch]\npoint = "job"\n',
    "greedy": '[[protocol]]\nname = "bsp"\n[switch]\nstragglers = "greedy"\n',
    "RLP": f'[[protocol]]\nname = "rlp"\nmodel = "{RLP_MODEL}"\n',
    "auto": '[[protocol]]\nname = "auto"\n',
}
CONFIGS = (*FITS, *PROTOCOLS)
COLORS = {"fit": "#b0b0b0", "fit 32/exec": "#6a6a6a", "BSP": "#4878a8", "ASP": "#55a868", "SSP": "#64b5cd",
          "LB-BSP": "#dd8452", "Sync-Switch": "#c44e52", "greedy": "#937860", "RLP": "#da8bc3", "auto": "#8172b2"}


def job_head(name: str, run_dir: str, args, seed: int) -> str:
    """[job], [data], [model], [train] of the benchmark's job."""
    if args.model == "mlp":
        data = 'name = "mnist"'
        model = f'fn = "{os.path.join(HERE, "wide_mlp.py")}:build"\nargs = {{hidden = 512}}'
        loss = 'loss = "SparseCategoricalCrossentropy"\nloss_args = {from_logits = true}\n'
    else:
        data, model, loss = f'name = "cifar10"\npath = "{args.cifar}"', 'name = "cnn"', ""
    return (f'[job]\nname = "{name}"\nrun_dir = "{run_dir}"\nseed = {seed}\n[data]\n{data}\n[model]\n{model}\n'
            f"[train]\n{loss}epochs = {args.epochs}\nbatch_size = {args.batch_size}\nlearning_rate = {args.lr}\n"
            f"checkpoint_every = 0\ntimeout_s = 900\neval_every = {args.eval_every}\neval_samples = 2000\n")


def job_text(config: str, run_dir: str, args, bed, seed: int) -> str:
    return (job_head("bench-heterogeneity", run_dir, args, seed) + PROTOCOLS.get(config, PROTOCOLS["ASP"])
            .format(switch_at=args.switch_at) + bed.cluster_toml() + f"workers = {args.workers}\n")


# -- scenarios: what is set for the whole run, and what changes while it trains ---------------------------
def worker_nodes(args) -> list[str]:
    return [f"n{i + 2}" for i in range(args.workers)]


def set_up(bed, scenario: str, args) -> None:
    """The scenario's standing part, before a run."""
    if scenario == "cpu":
        bed.set(SLOW, cpu=args.cpu / 3)
    if scenario == "bandwidth":
        for node in worker_nodes(args):
            bed.set(node, rate=args.rate)
        bed.set(SLOW, rate=quarter(args.rate))


def tear_down(bed, args) -> None:
    for node in worker_nodes(args):
        bed.set(node, rate="none", cpu=args.cpu)


def quarter(rate: str) -> str:
    """A quarter of a tc rate such as "400mbit"."""
    digits = rate.rstrip("abcdefghijklmnopqrstuvwxyz")
    return f"{float(digits) / 4:g}{rate[len(digits):]}"


def changing_shares(scenario: str, args):
    """``shares(t) -> {node: cpu}`` at ``t`` s of training, for the scenarios whose shares
    change; None for the others."""
    if scenario == "transient":
        def shares(t):
            slow = t >= 5 and (t - 5) % 40 < 20
            return {SLOW: args.cpu / 3 if slow else args.cpu}
        return shares
    if scenario == "trace":
        from tfsync.base.traces import load_cpu_traces

        traces = [t for t in load_cpu_traces(args.trace, gaps="hold", wrap=True) if t.mean(0, t.end) > 10][
            :args.workers]   # machines busy enough to vary (one of the eight is nearly idle)

        def shares(t):   # (at least the 0.1 CPU a testbed node can be given)
            return {node: round(max(0.1, args.cpu * (1 - tr.at(args.trace_start + t * args.trace_speed) / 100)), 3)
                    for node, tr in zip(worker_nodes(args), traces)}
        return shares
    return None


def drive(bed, run_dir: str, shares, stop: threading.Event, failed: list, every: float = 0.5) -> None:
    """Apply ``shares(t)`` every ``every`` s of training until ``stop``; an error goes to
    ``failed`` (the run then counts as failed, not as one under the scenario)."""
    try:
        while not stop.is_set() and not training_started(run_dir):
            time.sleep(0.1)
        t0, last = time.monotonic(), {}
        while not stop.is_set():
            for node, cpu in shares(time.monotonic() - t0).items():
                if last.get(node) != cpu:
                    bed.set(node, cpu=cpu)
                    last[node] = cpu
            stop.wait(every)
    except Exception as e:   # noqa: BLE001 (reported by the run)
        failed.append(e)


def under(bed, scenario: str, run_dir: str, args, run):
    """``run()`` with the scenario's changing part applied while it trains. The run's
    directory is emptied first: one left by the same configuration under an earlier
    scenario (one invocation, several scenarios) holds its metrics, whose first phase
    would start the changing part at the job's launch, 15-20 s before it trains."""
    shutil.rmtree(run_dir, ignore_errors=True)
    shares = changing_shares(scenario, args)
    if shares is None:
        return run()
    stop, failed = threading.Event(), []
    t = threading.Thread(target=drive, args=(bed, run_dir, shares, stop, failed), daemon=True)
    t.start()
    try:
        result = run()
    finally:
        stop.set()
        t.join()
        for node in worker_nodes(args):
            bed.set(node, cpu=args.cpu)
    if failed:
        raise RuntimeError(f"the scenario's CPU shares could not be set: {failed[0]}")
    return result


# -- one run -------------------------------------------------------------------------------------------------
def curve_text(points) -> str:
    """An accuracy curve as "t:acc;..." for the CSV."""
    return ";".join(f"{t:.2f}:{a:.4f}" for t, a in points)


def run_tfsync(bed, config: str, scenario: str, args, work: str, seed: int) -> dict:
    run_dir = os.path.join(work, f"run-{config.lower()}-{seed}")
    text = job_text(config, run_dir, args, bed, seed)
    s = under(bed, scenario, run_dir, args, lambda: run_on_testbed(
        bed, os.path.join(work, f"{config.lower()}.toml"), text, run_dir))
    began = s["started_at"] + s["init_s"] - s["time_base"]   # training's start on the evaluations' clock
    curve = [(e["time"] - began, e["accuracy"]) for e in s.get("evals", []) if e.get("accuracy") is not None]
    a = analyse(read_pushes(run_dir), args.workers * args.batch_size, 0.1)
    stats, began_at = s["timeline"][0].get("stats", {}), s["started_at"] + s["init_s"]
    return {"train_s": round(s["train_s"], 2), "test_accuracy": round(s["test_accuracy"], 4),
            "per_update_s": round(a["per_update_s"], 4), "ratio_to_ideal": round(a["per_update_s"] / a["ideal_s"], 3),
            **{f"batch_w{w}": round(v, 1) for w, v in sorted(a["batch"].items())},
            "min_batch": min(p["batch_size"] for p in read_pushes(run_dir)),
            "moves": ";".join(f"{m['time'] - began_at:.1f}:{m['to']}" for m in stats.get("moves", []))
            if config == "auto" else None,   # (s of training: to)
            "guard": ";".join(f"{c['round']}:{'kept' if c['kept'] else 'even'}" for c in stats.get("guard_checks", []))
            if config == "LB-BSP" else None,
            "curve": curve_text(curve)}


def run_native(bed, config: str, scenario: str, args, work: str, seed: int) -> dict:
    run_dir = fit_dir(work, config, f"-{seed}")
    text = job_head("bench-heterogeneity", run_dir, args, seed) + PROTOCOLS["ASP"] + bed.cluster_toml() + \
        f"workers = {args.workers}\n"
    r = under(bed, scenario, run_dir, args,
              lambda: run_fit(bed, text, run_dir, args.workers, FITS[config], args.eval_every))
    return {"train_s": r["train_s"], "test_accuracy": r["test_accuracy"], "samples": r["samples"],
            "curve": curve_text(r["evals"])}


def csv_path(args, scenario: str) -> str:
    return f"{args.out}_{args.model}_{args.workers}w_{scenario}.csv"


def measure(args) -> None:
    started = time.strftime("%Y-%m-%dT%H:%M")   # each row's invocation: which rows ran side by side
    bed = testbed_bench.up("benchhet", nodes=args.workers + 1, latency_ms=args.latency, log=print, cpu=args.cpu)
    try:
        bed.set("n1", cpu="none")   # the PS's node
        with testbed_bench.work_dir(args.keep) as work:
            for scenario in args.scenario.split(","):
                path = csv_path(args, scenario)
                rows = read_csv(path) if os.path.exists(path) else []
                for seed in map(int, args.seeds.split(",")):
                    for config in args.configs.split(","):
                        set_up(bed, scenario, args)
                        try:
                            run = run_native if config in FITS else run_tfsync
                            t0 = time.time()
                            row = {"scenario": scenario, "seed": seed, "config": config}
                            try:
                                row.update(run(bed, config, scenario, args, work, seed))
                            except RuntimeError as e:   # a failed run is a row saying why; the others go on
                                row["error"] = str(e)[-300:].replace("\n", " ")
                            row.update(wall_s=round(time.time() - t0, 1), date=time.strftime("%Y-%m-%d"), run=started)
                        finally:
                            tear_down(bed, args)
                        rows = [r for r in rows if (r["seed"], r["config"]) != (seed, config)] + [row]
                        write_csv(path, rows)
                        print({k: v for k, v in row.items() if k != "curve"}, flush=True)
    finally:
        bed.down()


# -- the summary (heterogeneity_summary.py: the tables; experiments/tables.py: the pages' files) ---------------------
def summarise(args) -> None:
    scenarios = {s: read_csv(csv_path(args, s)) for s in SCENARIOS if os.path.exists(csv_path(args, s))}
    if not scenarios:
        raise SystemExit(f"no {args.out}_{args.model}_{args.workers}w_*.csv yet: run a --scenario first")
    base = f"{args.out}_{args.model}_{args.workers}w"
    name = os.path.basename(base)
    if name in tables.TABLES and os.path.dirname(os.path.abspath(base)) == str(tables.RESULTS):
        tables.write([name])   # a page's table: with the command that made the CSVs and their dates
    else:
        with open(base + ".md", "w") as f:
            f.write(summary_text(scenarios, args.model, args.workers, args.latency, args.cpu))
    print(open(base + ".md").read())
    summaries = {s: summarise_scenario(rows) for s, rows in scenarios.items()}
    configs = [c for c in CONFIGS if any(c in t for t in summaries.values())]
    plot(summaries, configs, base + ".png", args)
    print(f"wrote {base}.md and .png")


def plot(tables: dict, configs: list[str], path: str, args) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(3.2 * len(tables) + 1.5, 10.0), 4.4))
    axes = fig.subplots(1, len(tables), sharey=True, squeeze=False)[0]
    for ax, (scenario, t) in zip(axes, tables.items()):
        ys = range(len(configs))
        worst = max((v for c in configs if c in t for v in t[c]["time"] if v is not None), default=1.0)
        for y, c in zip(ys, configs):
            if c not in t:
                continue
            times = t[c]["time"]
            m = median(times)
            done = [v for v in times if v is not None]
            if m is None:
                ax.text(0.02 * worst, y, "not reached", va="center", fontsize=7, color="#a00000")
                continue
            side_by_side = all(t[c]["beside"])   # (else faded and hatched: run in another invocation than BSP)
            ax.barh(y, m, color=COLORS[c], alpha=1.0 if side_by_side else 0.35, hatch=None if side_by_side else "//",
                    xerr=[[m - min(done)], [max(done) - m]] if len(done) > 1 else None, capsize=2)
            ax.text(m, y, f" {m:.0f}" + ("" if side_by_side else " *"), va="center", fontsize=7)
        ax.set_yticks(list(ys), [("native " if c in FITS else "") + c for c in configs], fontsize=8)
        ax.set_title(scenario, fontsize=9)
        ax.set_xlabel("s to target accuracy", fontsize=8)
    axes[0].invert_yaxis()   # (once: the panels share it)
    fig.suptitle(f"Time to BSP's accuracy less 0.5 point: {args.model}, {args.workers} workers, {args.latency:g} ms "
                 f"one way, {args.cpu:g} CPU per worker (median over seeds, bars: min-max; faded, *: not run "
                 "beside BSP)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="homogeneous", help=f"comma-separated: {', '.join(SCENARIOS)}")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS))
    p.add_argument("--seeds", default="0")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    p.add_argument("--cifar", default=os.path.join(ROOT, "..", "shared", "data", "cifar10_subset.npz"))
    p.add_argument("--epochs", type=float, default=1.5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--eval-every", type=int, default=64, help="steps between evaluations (fit: a multiple of 32)")
    p.add_argument("--latency", type=float, default=10.0, help="every node's one-way ms")
    p.add_argument("--cpu", type=float, default=0.4, help="each worker node's CPU share, in CPUs")
    p.add_argument("--rate", default="400mbit", help="every worker's link under the bandwidth scenario (tc rate)")
    p.add_argument("--switch-at", type=float, default=0.25, help="Sync-Switch: BSP for this share of the workload")
    p.add_argument("--trace", default=os.path.join(ROOT, "..", "shared", "data", "traces", "alibaba2018",
                                                   "machine_usage.csv"))
    p.add_argument("--trace-start", type=float, default=0.0, help="trace seconds where the replay starts")
    p.add_argument("--trace-speed", type=float, default=120.0, help="trace seconds per second of training")
    p.add_argument("--out", default=os.path.join(ROOT, "results", "bench_heterogeneity"))
    p.add_argument("--keep", default=None, metavar="DIR", help="keep each run's directory in DIR")
    p.add_argument("--summarise", action="store_true", help="only read the scenarios' CSVs: table and picture")
    args = p.parse_args(argv)
    for name in args.scenario.split(","):
        if name not in SCENARIOS:
            p.error(f"--scenario {name!r}: one of {', '.join(SCENARIOS)}")
    for name in args.configs.split(","):
        if name not in CONFIGS:
            p.error(f"--configs {name!r}: one of {', '.join(CONFIGS)}")
    if args.eval_every % 32:
        p.error(f"--eval-every {args.eval_every}: a multiple of 32 (fit's 32 steps per execution)")
    if not args.summarise:
        measure(args)
    summarise(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
