"""Where a BSP round or an ASP step goes, from a run's own records (issue 30).

Reads the pushes of kept run directories (``bench_control_path.py --keep DIR`` keeps
``DIR/run-*``) and takes their steady part (after the first fifth) apart, from the
workers' timestamps: ``start`` (the step's token reached the worker) and ``end`` (its
gradient was computed). On a ``tfsync testbed`` every node shares one clock, so the
parts compare across workers.

- A BSP round (aggregated pushes, grouped by round): how far apart the round's tokens
  reached its workers; a worker's token to its gradient; the round's last gradient to the
  next round's first token; the round (first token to the next round's first token).
- An ASP step (applied pushes, per worker): the step; token to gradient; gradient to the
  worker's next token.

Medians in milliseconds, and in round trips where ``--rtt`` (ms) is given. Prints a
table and appends it to ``--out`` (CSV).

    python experiments/round_parts.py /tmp/keep/run-0 /tmp/keep/run-1 --rtt 22.0 --label "10 ms, wide MLP"
"""

from __future__ import annotations

import argparse
import collections
import csv
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_predictors import read_pushes  # noqa: E402


def pushes(run_dir: str) -> list[dict]:
    """The run's pushes after its first fifth (events naming a worker, a lost one, left out)."""
    rows = [r for r in read_pushes(run_dir) if r.get("mode")]
    return rows[len(rows) // 5:]


def bsp_parts(rows: list[dict]) -> dict:
    rounds = collections.defaultdict(list)
    for r in rows:
        rounds[r["round"]].append(r)
    size = max(map(len, rounds.values()))
    full = sorted(k for k, v in rounds.items() if len(v) == size)
    parts = collections.defaultdict(list)
    for a, b in zip(full, full[1:]):
        if b != a + 1:
            continue
        this, following = rounds[a], rounds[b]
        first = min(r["start"] for r in this)
        parts["tokens spread"].append(max(r["start"] for r in this) - first)
        parts["token to gradient"].append(np.median([r["end"] - r["start"] for r in this]))
        parts["last gradient to next token"].append(min(r["start"] for r in following) - max(r["end"] for r in this))
        parts["round"].append(min(r["start"] for r in following) - first)
    return {k: float(np.median(v)) * 1e3 for k, v in parts.items()}


def asp_parts(rows: list[dict]) -> dict:
    parts = collections.defaultdict(list)
    for w in sorted({r["worker"] for r in rows}):
        mine = sorted((r for r in rows if r["worker"] == w), key=lambda r: r["start"])
        start, end = np.array([r["start"] for r in mine]), np.array([r["end"] for r in mine])
        parts["step"].append(np.median(np.diff(start)))
        parts["token to gradient"].append(np.median(end - start))
        parts["gradient to next token"].append(np.median(start[1:] - end[:-1]))
    return {k: float(np.median(v)) * 1e3 for k, v in parts.items()}


def parts_of(run_dir: str) -> tuple[str, dict]:
    rows = pushes(run_dir)
    if not rows:
        raise SystemExit(f"{run_dir}: no pushes in metrics.jsonl")
    return ("bsp", bsp_parts(rows)) if rows[0]["mode"] == "aggregate" else ("asp", asp_parts(rows))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", help="run directories (each with metrics.jsonl)")
    p.add_argument("--rtt", type=float, help="the round trip between two nodes, ms")
    p.add_argument("--label", default="", help="what the runs were (a latency, a model)")
    p.add_argument("--out", default="results/round_parts.csv")
    p.add_argument("--summarise", action="store_true",
                   help="only write the page's table (results/round_parts.md) from the CSV")
    args = p.parse_args(argv)
    if args.summarise:   # experiments/tables.py: the table, the command that made the CSV, its date
        import tables
        tables.write(tables.of_script("round_parts.py"))
        return 0
    if not args.runs:
        p.error("name the kept runs' directories (or --summarise)")
    found = []
    for run in args.runs:
        kind, parts = parts_of(run)
        for part, ms in parts.items():
            found.append({"label": args.label, "run": os.path.basename(run.rstrip("/")), "kind": kind, "part": part,
                          "ms": round(ms, 2), "round_trips": round(ms / args.rtt, 2) if args.rtt else ""})
    for f in found:
        print(f"{f['label']:<24} {f['kind']} {f['part']:<28} {f['ms']:7.1f} ms  {f['round_trips']}")
    new = not os.path.exists(args.out)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(found[0]))
        if new:
            w.writeheader()
        w.writerows(found)
    print(f"appended to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
