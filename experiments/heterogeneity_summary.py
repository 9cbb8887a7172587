"""The summary of ``bench_heterogeneity.py``: time to accuracy, speed-ups and time per update
by scenario and configuration, from the scenarios' CSVs (issue 54). Apart from the benchmark
so that ``experiments/tables.py`` and its test read it without TensorFlow.
"""

from __future__ import annotations

from testbed_bench import FITS  # (no TensorFlow at its top)

PROTOCOLS = ("BSP", "ASP", "SSP", "LB-BSP", "Sync-Switch", "greedy", "RLP", "auto")   # bench_heterogeneity.PROTOCOLS
CONFIGS = (*FITS, *PROTOCOLS)
SCENARIOS = ("homogeneous", "cpu", "bandwidth", "transient", "trace")


# -- reading the runs ------------------------------------------------------------------------------------------------
def parse_curve(text) -> list[tuple[float, float]]:
    if not text:
        return []
    return [tuple(map(float, p.split(":"))) for p in str(text).split(";")]


def time_to(curve, target: float) -> float | None:
    """When ``curve`` first reaches ``target`` (linear between the evaluations around it)."""
    prev = (0.0, 0.0)
    for t, a in curve:
        if a >= target:
            t0, a0 = prev
            return t0 + (t - t0) * (target - a0) / (a - a0) if a > a0 else t
        prev = (t, a)
    return None


def accuracy_at(curve, t_fixed: float) -> float | None:
    before = [a for t, a in curve if t <= t_fixed]
    return before[-1] if before else None


def beside(r: dict, bsp: dict) -> bool:
    """Whether run ``r`` ran side by side with its seed's BSP run: in the same invocation
    (``run``, the invocation's start, in rows since 2026-11-30), or, for rows before that,
    on the same day. The 2-core machine ran 1.3-1.7x slower per update some evenings than
    the same morning, so a time from another invocation is not comparable."""
    return r.get("run") == bsp.get("run") and r.get("date") == bsp.get("date")


def summarise_scenario(rows: list[dict]) -> dict:
    """config -> {"time": [per seed], "acc_at": [...], "final": [...], "per_update": [...],
    "beside": [...]}."""
    out: dict = {}
    for seed in sorted({r["seed"] for r in rows}):
        runs = {r["config"]: r for r in rows if r["seed"] == seed and not r.get("error")}
        if "BSP" not in runs:
            continue
        bsp = parse_curve(runs["BSP"]["curve"])
        target = bsp[-1][1] - 0.005
        t_fixed = min(r["train_s"] for r in runs.values())
        for config, r in runs.items():
            curve = parse_curve(r["curve"])
            o = out.setdefault(config, {"time": [], "acc_at": [], "final": [], "per_update": [], "target": [],
                                        "beside": []})
            o["time"].append(time_to(curve, target))
            o["acc_at"].append(accuracy_at(curve, t_fixed))
            o["final"].append(r["test_accuracy"])
            o["per_update"].append(r.get("per_update_s"))
            o["target"].append(target)
            o["beside"].append(beside(r, runs["BSP"]))
    return out


def median(values):
    """The median, counting a run that never reached the target (None) as slower than any."""
    if not values:
        return None
    vs = sorted(values, key=lambda v: float("inf") if v is None else v)
    return vs[(len(vs) - 1) // 2] if len(vs) % 2 else (
        None if vs[len(vs) // 2] is None else (vs[len(vs) // 2 - 1] + vs[len(vs) // 2]) / 2)


def summary_text(scenarios: dict[str, list[dict]], model: str, workers: int, latency: float, cpu: float) -> str:
    """The three tables of results/bench_heterogeneity_<model>_<n>w.md from each scenario's
    rows (``typed``): time to target, the best configuration's speed-ups, time per update."""
    tables = {s: summarise_scenario(rows) for s, rows in scenarios.items()}
    lines = [f"Time to target accuracy (BSP's final less 0.5 point), seconds, median over seeds "
             f"[min-max]; {model}, {workers} workers ({latency:g} ms one way, {cpu:g} CPU each).",
             "", "| configuration | " + " | ".join(tables) + " |", "|---|" + "---|" * len(tables)]
    configs = [c for c in CONFIGS if any(c in t for t in tables.values())]
    for c in configs:
        cells = []
        for s, t in tables.items():
            if c not in t:
                cells.append("")
                continue
            times = t[c]["time"]
            m = median(times)
            done = [v for v in times if v is not None]
            spread = f" [{min(done):.1f}-{max(done):.1f}]" if len(done) > 1 else ""
            cells.append(("not reached" if m is None else f"{m:.1f}{spread}" +
                          (f" ({len(times) - len(done)}/{len(times)} not)" if len(done) < len(times) else ""))
                         + ("" if all(t[c]["beside"]) else " *"))
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    if any(not all(v["beside"]) for t in tables.values() for v in t.values()):
        lines += ["", "\\* not side by side with BSP: some of its seeds ran in another invocation (the machine ran "
                  "up to 1.7x slower per update some evenings than the same morning); such rows are not chosen as "
                  "the best below, and a speed-up against them is marked so."]
    lines += ["", "Speed-up of tfsync's best configuration (of those run side by side with BSP) over native fit (the "
              "faster of 1 and 32 steps per execution), over tfsync BSP, and auto's time over the best's, by median "
              "time to target.", "",
              "| scenario | best | x native fit | x BSP | auto / best | seeds | date |",
              "|---|---|---|---|---|---|---|"]
    for s, t in tables.items():
        tf_ = {c: median(v["time"]) for c, v in t.items() if c in PROTOCOLS and median(v["time"]) is not None
               and all(v["beside"])}
        if not tf_:
            continue
        best = min(tf_, key=tf_.get)
        fits = [(median(t[c]["time"]), all(t[c]["beside"])) for c in FITS if c in t]
        reached = [f for f in fits if f[0] is not None]
        fit, fit_beside = min(reached) if reached else ("not reached" if fits else "not run", True)
        bsp = median(t["BSP"]["time"])
        auto = f"{tf_['auto'] / tf_[best]:.2f}" if "auto" in tf_ else "not reached" if "auto" in t else ""
        lines.append(f"| {s} | {best} {tf_[best]:.1f} s | "
                     + (f"{fit / tf_[best]:.2f}" if isinstance(fit, float) else fit) + ("" if fit_beside else " *")
                     + f" | {bsp / tf_[best]:.2f} | {auto} | {len(t['BSP']['time'])} | "
                     + ", ".join(sorted({str(r['date']) for r in scenarios[s]})) + " |")
    lines += ["", "Seconds per update (X = n x B samples; after the first 10 %) and the smallest batch LB-BSP gave, "
              "median over seeds.", "", "| scenario | BSP | LB-BSP | LB-BSP / BSP | auto | smallest LB-BSP batch |",
              "|---|---|---|---|---|---|"]
    for s, t in tables.items():
        per = {c: median([v for v in t[c]["per_update"] if v is not None]) if c in t else None
               for c in ("BSP", "LB-BSP", "auto")}
        small = [r["min_batch"] for r in scenarios[s] if r["config"] == "LB-BSP" and r.get("min_batch") is not None]
        cell = (lambda v: "" if v is None else f"{v:.4f}")
        ratio = f"{per['LB-BSP'] / per['BSP']:.2f}" if per["LB-BSP"] and per["BSP"] else ""
        lines.append(f"| {s} | {cell(per['BSP'])} | {cell(per['LB-BSP'])} | {ratio} | {cell(per['auto'])} | "
                     f"{min(small) if small else ''} |")
    return "\n".join(lines) + "\n"
