"""``tfsync policy train`` and ``tfsync policy eval``: the learned policy from the command line."""

from __future__ import annotations

import csv
import json
import math
import os
import statistics

from ..base import safefile
from ..base.exits import EXIT_BAD_INPUT, fail
from ..base.progress import progress_bar


def _one_blas_thread() -> None:
    """The simulator multiplies small matrices: threaded BLAS only spins (5x slower
    episodes measured on a busy 2-core machine). Must run before NumPy is imported."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def _spec(args):
    from ..rl.instances import InstanceSpec

    kw = {"workers": args.workers, "dataset": args.dataset}
    if args.hidden_layers is not None:
        kw["hidden_layers"] = tuple(args.hidden_layers)
    if args.target is not None:
        kw["target"] = args.target
    return InstanceSpec(**kw)


def write_csv(path: str, rows: list[dict]) -> None:
    """One row per dict; the columns are every key seen, in first-seen order."""
    if not rows:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with safefile.replacing(path, newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)


def cmd_train(args) -> int:
    _one_blas_thread()
    import dataclasses

    from ..rl.dqn import PRESETS
    from ..rl.train import train

    if args.episodes < 0 or args.pretrain_instances < 0:
        return fail("--episodes and --pretrain-instances must be >= 0", EXIT_BAD_INPUT)
    bar = None if args.quiet else progress_bar()
    net, log = train(_spec(args), args.out, pretrain_instances=args.pretrain_instances,
                     episodes=args.episodes, cfg=dataclasses.replace(PRESETS[args.preset], seed=args.seed),
                     resume=args.resume,
                     progress=bar)
    base = os.path.splitext(args.out)[0]
    write_csv(base + "_pretrain.csv", log.pretrain)
    write_csv(base + "_episodes.csv", log.episodes)
    print(f"policy saved to {args.out} ({net.meta.get('episodes', 0)} Q-learning episodes); "
          f"training log: {base}_episodes.csv")
    return 0


def summarize(rows: list[dict]) -> dict[str, dict]:
    """Per policy: mean time to target over converged runs, its 95 % CI half-width, and
    how many runs converged."""
    out = {}
    for name in dict.fromkeys(r["policy"] for r in rows):
        times = [r["time"] for r in rows if r["policy"] == name and r["converged"]]
        runs = sum(r["policy"] == name for r in rows)
        mean = statistics.fmean(times) if times else math.nan
        ci = 1.96 * statistics.stdev(times) / math.sqrt(len(times)) if len(times) > 1 else math.nan
        out[name] = {"mean_time": mean, "ci95": ci, "converged": len(times), "runs": runs}
    return out


def format_table(summary: dict[str, dict]) -> str:
    static = {k: v for k, v in summary.items() if k != "rlp" and v["converged"]}
    best = min(static, key=lambda k: static[k]["mean_time"]) if static else None
    lines = [f"{'policy':8} {'time to target':>22} {'converged':>10} {'x best static':>14}"]
    for name, s in summary.items():
        ratio = s["mean_time"] / summary[best]["mean_time"] if best else math.nan
        lines.append(f"{name:8} {s['mean_time']:>12,.0f} ± {s['ci95']:>7,.0f} "
                     f"{s['converged']:>5}/{s['runs']:<4} {ratio:>14.2f}")
    if best:
        lines.append(f"best static policy: {best}")
    return "\n".join(lines)


def cmd_eval(args) -> int:
    _one_blas_thread()
    from ..rl.evaluate import STATIC, evaluate

    policies = args.policies.split(",")
    unknown = [p for p in policies if p != "rlp" and p not in STATIC]
    if unknown:
        return fail(f"--policies: unknown {unknown[0]!r}; expected rlp or one of {', '.join(STATIC)}",
                    EXIT_BAD_INPUT)
    if "rlp" in policies and not args.model:
        return fail("policy rlp needs MODEL, a file from `tfsync policy train` (or leave rlp out of --policies)",
                    EXIT_BAD_INPUT)
    if "rlp" in policies:
        from ..policy.rlp import QNetwork
        QNetwork.load(args.model)   # a file that is not a policy: one line, before any work
    bar = None if (args.quiet or args.json) else progress_bar()
    rows = evaluate(policies, _spec(args), range(args.first_seed, args.first_seed + args.seeds),
                    args.model, processes=args.processes, progress=bar)
    if args.csv:
        write_csv(args.csv, rows)
    summary = summarize(rows)
    print(json.dumps(summary, indent=2) if args.json else format_table(summary))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("policy", help="train or evaluate the learned synchronization policy (RLP)",
                       description="The learned policy (RLP): a Q-network trained by deep "
                                   "Q-learning on simulated clusters, usable as protocol 'rlp'.")
    cmds = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)

    def instance_options(q):
        q.add_argument("--workers", type=int, default=10, help="workers per simulated cluster (default 10)")
        q.add_argument("--hidden-layers", type=int, nargs="+", metavar="H",
                       help="choices of the MLP's hidden-layer count (default 0 1 2 3)")
        q.add_argument("--dataset", default="mnist", choices=("mnist", "cifar10"))
        q.add_argument("--target", type=float, help="validation accuracy that ends an episode (default 0.88)")
        q.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    t = cmds.add_parser("train", help="pre-train on static policies, then deep Q-learning",
                        description="Pre-trains the Q-network on episodes of BSP, ASP and SSP "
                                    "(s = 2, 5, 8), then runs Q-learning episodes on fresh simulated "
                                    "instances. The policy file is saved after every episode.")
    t.add_argument("out", help="policy file to write (.npz)")
    t.add_argument("--pretrain-instances", type=int, default=4,
                   help="instances to run every static policy on for pre-training (default 4)")
    t.add_argument("--episodes", type=int, default=20, help="Q-learning episodes (default 20)")
    t.add_argument("--resume", action="store_true", help="continue from the episodes already in OUT")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--preset", choices=("paper", "stable"), default="paper",
                   help="Q-learning hyper-parameters: RLP §4's (pool 50, target copy every 5, "
                        "Adam 0.01) or 'stable' (pool 5000, copy every 200, Adam 0.001)")
    instance_options(t)
    t.set_defaults(func=cmd_train)

    e = cmds.add_parser("eval", help="time to target accuracy of RLP and the static policies",
                        description="Runs each policy on the same simulated instances (one per seed) "
                                    "and prints the mean time to the target accuracy.")
    e.add_argument("model", nargs="?", help="policy file from `tfsync policy train` (needed for rlp)")
    e.add_argument("--policies", default="bsp,asp,ssp2,ssp5,ssp8,rlp",
                   help="comma-separated (default bsp,asp,ssp2,ssp5,ssp8,rlp)")
    e.add_argument("--seeds", type=int, default=30, help="instances per policy (default 30)")
    e.add_argument("--first-seed", type=int, default=0)
    e.add_argument("--processes", type=int, default=1, help="episodes run in parallel (default 1)")
    e.add_argument("--csv", help="write one row per episode here")
    e.add_argument("--json", action="store_true", help="print the summary as JSON")
    instance_options(e)
    e.set_defaults(func=cmd_eval)
