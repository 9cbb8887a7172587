"""Sync-Switch on the local cluster (issue 5 benchmarks), MNIST CNN, every configuration
repeated with seeds, all through the command line a user runs (`tfsync search`,
`tfsync run --json`), configurations interleaved seed by seed so that a noisy machine
hits them alike:

1. search: `tfsync search` (R runs per setting, M settings) finds the switch point;
2. BSP, ASP and Sync-Switch at the found point: total time, converged accuracy and
   time-to-accuracy (threshold: BSP's mean converged accuracy; Sync-Switch §VI-A);
3. transient stragglers (paper §VI-B3, scaled to our run length): mild (1 straggler, 1
   episode, 2x slower) and moderate (2 stragglers, 4 episodes, 4x slower), each with the
   plain plan (baseline), the greedy and the elastic policy, on 4 workers (the detector
   compares a worker with the others' mean and spread), switching at half the workload
   so that the episodes fall before the switch, where these policies act;
4. the search-cost table (§VI-C1) from the runs recorded here.

    python experiments/bench_sync_switch.py --data ../shared/data/mnist.npz   # ~60 min here

Writes results/bench_sync_switch*.csv and .png.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

JOB = """[job]
name = "{name}"
run_dir = "{run_dir}"
seed = {seed}
[cluster]
workers = {workers}
[model]
name = "cnn"
[train]
batch_size = 64
learning_rate = 0.01
momentum = 0.9
epochs = {epochs}
eval_every = {eval_every}
eval_samples = {eval_samples}
checkpoint_every = 0
{protocols}
[switch]
point = "job"
stragglers = "{stragglers}"
straggler_window_s = {window}
straggler_k = 2
readmit_after_s = {readmit}
{inject}"""


def protocols(fraction: float) -> str:
    if fraction >= 1.0:
        return '[[protocol]]\nname = "bsp"'
    if fraction <= 0.0:
        return '[[protocol]]\nname = "asp"'
    return f'[[protocol]]\nname = "bsp"\nuntil = {fraction}\n[[protocol]]\nname = "asp"'


def job_text(a, name, seed, fraction, workers, epochs, stragglers="none", episodes=()):
    steps = epochs * 60000 / 64
    inject = "".join(f"[[inject]]\nworker = {w}\nslowdown = {s}\nstart_s = {t}\nduration_s = {d}\n"
                     for w, s, t, d in episodes)
    return JOB.format(name=name, run_dir=os.path.join(a.work, name), seed=seed, workers=workers, epochs=epochs,
                      eval_every=max(1, int(steps / a.evals)), eval_samples=a.eval_samples,
                      protocols=protocols(fraction), stragglers=stragglers, window=a.window,
                      readmit=a.readmit, inject=inject)


def tfsync(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfsync.cli", *args], capture_output=True, text=True, env=env)


def run(a, name, text) -> dict:
    path = os.path.join(a.work, name + ".toml")
    with open(path, "w") as f:
        f.write(text)
    t = time.time()
    p = tfsync("run", path, "--json", "--no-manager", "--data", a.data)
    if p.returncode != 0:
        raise SystemExit(f"{name} failed: {p.stderr.strip().splitlines()[-1:]}")
    s = json.loads(p.stdout)
    print(f"  {name}: {s['wall_s']:.0f} s, converged {s['converged_accuracy']:.4f} "
          f"(final {s['test_accuracy']:.4f}) [{time.time() - t:.0f} s]", flush=True)
    return s


def tta(s: dict, threshold: float) -> float | None:
    """Training seconds (after cluster start-up) until the curve first reaches ``threshold``."""
    for e in s["evals"]:
        if e["accuracy"] >= threshold:
            return e["time"] - s["init_s"]
    return None


def mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else float("nan")


def sd(xs):
    xs = [x for x in xs if x is not None]
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("wrote", path)


def search(a) -> float:
    env = dict(os.environ, TFSYNC_HOME=os.path.join(a.work, "home"))
    path = os.path.join(a.work, "search.toml")
    with open(path, "w") as f:
        f.write(job_text(a, "search", 100, 0.5, a.workers, a.epochs).replace('point = "job"', 'point = "auto"'))
    if a.fraction is not None:
        return a.fraction
    print(f"search: R = {a.runs}, M = {a.settings}", flush=True)
    p = tfsync("search", path, "--runs", str(a.runs), "--settings", str(a.settings), "--data", a.data,
               "--json", env=env)
    if p.returncode != 0:
        raise SystemExit(f"search failed: {p.stderr.strip().splitlines()[-1:]}")
    d = json.loads(p.stdout)
    with open(os.path.join(a.out, "bench_sync_switch_search.json"), "w") as f:
        json.dump(d, f, indent=1)
    print(tfsync("search", path, "--show", env=env).stdout, flush=True)
    return d["fraction"]


def part_protocols(a, fraction):
    plans = {"BSP": 1.0, "ASP": 0.0, f"Sync-Switch {fraction:.4g}": fraction}
    runs = {k: [] for k in plans}
    for seed in range(a.seeds):
        for label, f in plans.items():
            name = f"{label.split()[0].lower()}_s{seed}"
            runs[label].append(run(a, name, job_text(a, name, seed, f, a.workers, a.epochs)))
    threshold = mean([s["converged_accuracy"] for s in runs["BSP"]])
    rows = []
    for label, ss in runs.items():
        for seed, s in enumerate(ss):
            rows.append({"config": label, "seed": seed, "wall_s": s["wall_s"], "train_s": s["wall_s"] - s["init_s"],
                         "converged_accuracy": s["converged_accuracy"], "test_accuracy": s["test_accuracy"],
                         "tta_s": tta(s, threshold), "threshold": threshold})
    write_csv(os.path.join(a.out, "bench_sync_switch.csv"), rows)
    bsp_tta = mean([r["tta_s"] for r in rows if r["config"] == "BSP"])
    print(f"\nthreshold (BSP mean converged accuracy) {threshold:.4f}")
    print(f"{'config':<22}{'train s':>9}{'conv. acc':>11}{'TTA s':>9}{'BSP TTA / TTA':>15}{'reached':>9}")
    for label in plans:
        rs = [r for r in rows if r["config"] == label]
        t = mean([r["tta_s"] for r in rs])
        print(f"{label:<22}{mean([r['train_s'] for r in rs]):>9.1f}{mean([r['converged_accuracy'] for r in rs]):>11.4f}"
              f"{t:>9.1f}{bsp_tta / t if t == t else float('nan'):>15.2f}"
              f"{sum(r['tta_s'] is not None for r in rs):>6}/{len(rs)}")
    return runs, threshold


def part_stragglers(a):
    """The online policies act only before the switch, so this part switches at
    --straggler-fraction (default 0.5, the paper's P3 plan) rather than at the searched
    point, and the episodes fall into the BSP phase."""
    f, e = a.straggler_fraction, a.episode_s
    scenarios = {  # (worker, slowdown, start_s, duration_s); paper §VI-B3 scaled to our run length
        "mild": [(1, 2.0, 3, 2 * e)],
        "moderate": [(1, 4.0, 2, e), (3, 4.0, 2 + 1.25 * e, e), (1, 4.0, 2 + 2.5 * e, e), (3, 4.0, 2 + 3.75 * e, e)],
    }
    rows = []
    for seed in range(a.seeds):
        for scen, episodes in scenarios.items():
            for policy in ("none", "greedy", "elastic"):
                name = f"strag_{scen}_{policy}_s{seed}"
                s = run(a, name, job_text(a, name, seed, f, a.straggler_workers, a.straggler_epochs, policy, episodes))
                stats = s["timeline"][0].get("stats", {})
                rows.append({"scenario": scen, "policy": "baseline" if policy == "none" else policy, "seed": seed,
                             "wall_s": s["wall_s"], "train_s": s["wall_s"] - s["init_s"],
                             "converged_accuracy": s["converged_accuracy"], "test_accuracy": s["test_accuracy"],
                             "switches": stats.get("switches", ""), "removals": stats.get("removals", ""),
                             "detections": sum(1 for d in stats.get("detected", []) if d[2] == "became")})
    write_csv(os.path.join(a.out, "bench_sync_switch_stragglers.csv"), rows)
    print(f"\n{'scenario':<10}{'policy':<10}{'train s':>9}{'conv. acc':>11}{'speed-up':>10}{'detections':>12}")
    for scen in scenarios:
        base = mean([r["train_s"] for r in rows if r["scenario"] == scen and r["policy"] == "baseline"])
        for pol in ("baseline", "greedy", "elastic"):
            rs = [r for r in rows if r["scenario"] == scen and r["policy"] == pol]
            t = mean([r["train_s"] for r in rs])
            print(f"{scen:<10}{pol:<10}{t:>9.1f}{mean([r['converged_accuracy'] for r in rs]):>11.4f}"
                  f"{base / t:>10.2f}{mean([r['detections'] for r in rs]):>12.1f}")
    return rows


def part_cost(a):
    """Search-cost table (§VI-C1) from every run this benchmark and its search recorded."""
    from tfsync.switch.search_cost import RecordedRun, RunBank, cost_table
    recorded = []
    for root, _, files in os.walk(a.work):
        if "summary.json" not in files or "previous" in root:
            continue
        with open(os.path.join(root, "summary.json")) as fh:
            s = json.load(fh)
        plan = s["meta"].get("protocols") or []
        if s["meta"].get("stragglers", "none") != "none" or s["workers"] != a.workers or not plan:
            continue
        fraction = 0.0 if plan[0][0] == "asp" else plan[0][1]
        recorded.append(RecordedRun(fraction, s["converged_accuracy"], s["wall_s"], root))
    bank = RunBank(recorded)
    rows = cost_table(bank, a.settings, rows=[(False, 1, 1), (False, 2, 2), (True, 0, 1), (True, 0, 2), (True, 0, 3)])
    out = [{"setting": r.label(), "cost_x_bsp": round(r.cost, 3), "amortization": round(r.amortization, 3),
            "effective": round(r.effective, 3), "success": round(r.success, 3), "reference": r.reference}
           for r in rows]
    write_csv(os.path.join(a.out, "bench_sync_switch_cost.csv"), out)
    print(f"\nsearch cost from {len(recorded)} recorded runs at fractions "
          f"{sorted({round(r.fraction, 4) for r in recorded})}")
    for r in out:
        print(f"  {r['setting']:<14} cost {r['cost_x_bsp']:>6.2f} x BSP  amortization {r['amortization']:>6.2f}  "
              f"success {r['success']:.2f}")


def plot(a, runs, threshold, fraction):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"BSP": "tab:blue", "ASP": "tab:orange"}
    for label, ss in runs.items():
        c = colors.get(label, "tab:green")
        for i, s in enumerate(ss):
            ev = s["evals"]
            t = [e["time"] - s["init_s"] for e in ev]
            ax[0].plot(t, [e["accuracy"] for e in ev], color=c, alpha=0.7, label=label if i == 0 else None)
            for sw in s["switches"]:
                sw_t = next((p["time"] for p in s["timeline"] if p["samples"] == sw["samples"]), None)
                if sw_t is not None:
                    ax[0].axvline(sw_t - s["init_s"], color=c, ls=":", alpha=0.5)
            loss = _loss_curve(s)
            if loss:
                ax[1].plot(*loss, color=c, alpha=0.7, label=label if i == 0 else None)
    ax[0].axhline(threshold, color="grey", ls="--", label=f"threshold {threshold:.4f}")
    ax[0].set(xlabel="training time (s)", ylabel="test accuracy", ylim=(max(0.0, threshold - 0.1), 1.0),
              title=f"MNIST CNN, {a.workers} workers; dotted: switch to ASP")
    ax[1].set(xlabel="training time (s)", ylabel="training loss (mean per 50 pushes)", yscale="log")
    for x in ax:
        x.legend()
    fig.tight_layout()
    path = os.path.join(a.out, "bench_sync_switch.png")
    fig.savefig(path, dpi=120)
    print("wrote", path)


def _loss_curve(s):
    path = os.path.join(s.get("run_dir", ""), "metrics.jsonl")
    if not os.path.exists(path):
        return None
    t, l, buf = [], [], []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "loss" not in r or "event" in r:
                continue
            buf.append(r["loss"])
            if len(buf) == 50:
                t.append(r["time"] - s["init_s"])
                l.append(statistics.fmean(buf))
                buf = []
    return t, l


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data", "mnist.npz"))
    p.add_argument("--out", default=os.path.join(HERE, "..", "results"))
    p.add_argument("--work", default="/tmp/bench_sync_switch")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--runs", type=int, default=2, help="search: R")
    p.add_argument("--settings", type=int, default=3, help="search: M")
    p.add_argument("--fraction", type=float, help="skip the search: switch at this fraction")
    p.add_argument("--evals", type=int, default=25, help="evaluations per run")
    p.add_argument("--eval-samples", type=int, default=2000)
    p.add_argument("--straggler-workers", type=int, default=4)
    p.add_argument("--straggler-epochs", type=float, default=1.0)
    p.add_argument("--straggler-fraction", type=float, default=0.5)
    p.add_argument("--episode-s", type=float, default=6.0)
    p.add_argument("--window", type=float, default=2.0)
    p.add_argument("--readmit", type=float, default=15.0)
    p.add_argument("--parts", default="protocols,stragglers,cost")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    a.data = os.path.abspath(a.data)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    t0 = time.time()
    parts = a.parts.split(",")
    fraction = search(a)
    print(f"switch point: {fraction:.4g}", flush=True)
    if "protocols" in parts:
        runs, threshold = part_protocols(a, fraction)
        for ss in runs.values():
            for i, s in enumerate(ss):
                s["run_dir"] = os.path.join(a.work, s["meta"]["job"])
        plot(a, runs, threshold, fraction)
    if "stragglers" in parts:
        part_stragglers(a)
    if "cost" in parts:
        part_cost(a)
    print(f"\nbenchmark took {(time.time() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()
