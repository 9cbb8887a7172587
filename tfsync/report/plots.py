"""The report's figures, each a function of the runs returning a matplotlib ``Figure``
(``matplotlib.figure.Figure``: no pyplot, no global state, safe in any thread). TF-free."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .load import RunData, label

PROTOCOL_COLORS = {"bsp": "#4878a8", "asp": "#e08040", "ssp": "#59a14f", "lbbsp": "#9c6ab4",
                   "fluentps": "#d4a72c", "elastic_bsp": "#76b7b2", "rlp": "#c45a76"}
RUN_COLORS = ["#4878a8", "#e08040", "#59a14f", "#c45a76", "#9c6ab4", "#7f7f7f"]
WORKER_COLORS = ["#4878a8", "#e08040", "#59a14f", "#c45a76", "#9c6ab4", "#d4a72c", "#76b7b2", "#7f7f7f"]
RECOVERY_EVENTS = ("task_restarted", "worker_lost", "worker_rejoined", "rewind", "resume")


def protocol_color(name: str) -> str:
    return PROTOCOL_COLORS.get(name, "#9a9a9a")


def smooth(values, n: int) -> np.ndarray:
    """The trailing mean over ``n`` values (fewer at the start)."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0 or n <= 1:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    idx = np.arange(1, len(v) + 1)
    lo = np.maximum(idx - n, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def gapped(t, y, gap_s: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """``t, y`` with a NaN between two points more than ``gap_s`` apart (a recovery, a
    restart), so a line is broken there instead of drawn across."""
    t, y = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
    cut = np.flatnonzero(np.diff(t) > gap_s) + 1
    return np.insert(t, cut, np.nan), np.insert(y, cut, np.nan)


def _window(n: int) -> int:
    return max(1, min(50, n // 20))


def _counted(run: RunData) -> list[dict]:
    return [p for p in run.pushes if not p.get("dropped") and p.get("loss") is not None
            and np.isfinite(p["loss"])]


def loss_curves(runs: list[RunData]) -> Figure:
    """Training loss (trailing mean) and the test numbers, against time and against samples."""
    evals = any(r.of("eval") for r in runs)
    fig = Figure(figsize=(11, 6.6 if evals else 3.6), layout="constrained")
    axes = fig.subplots(2 if evals else 1, 2, squeeze=False)
    for run, name, color in zip(runs, label(runs), RUN_COLORS * 10):
        pushes = _counted(run)
        loss = smooth([p["loss"] for p in pushes], _window(len(pushes)))
        axes[0][0].plot(*gapped([p["time"] for p in pushes], loss), color=color, lw=1.3, label=name)
        axes[0][1].plot([p["samples"] for p in pushes], loss, color=color, lw=1.3, label=name)
        ev = [e for e in run.of("eval") if e.get("accuracy") is not None or e.get("loss") is not None]
        if evals and ev:
            metric = "accuracy" if any(e.get("accuracy") is not None for e in ev) else "loss"
            pts = [e for e in ev if e.get(metric) is not None]
            for ax, key in zip(axes[1], ("time", "samples")):
                ax.plot([e[key] for e in pts], [e[metric] for e in pts], "o-", color=color, ms=3, lw=1.2,
                        label=f"{name} (test {metric})")
    for ax, key in zip(axes[0], ("time", "samples")):
        ax.set_title(f"training loss (mean of recent pushes) vs {key}")
        ax.set_ylabel("loss")
    if evals:
        for ax, key in zip(axes[1], ("time", "samples")):
            ax.set_title(f"test metric (background evaluator) vs {key}")
            ax.legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("")
    for row in axes:
        row[0].set_xlabel("seconds since the run started")
        row[1].set_xlabel("samples trained")
        for ax in row:
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    _mark_phases(axes[0][0], runs[0], "time")
    _mark_phases(axes[0][1], runs[0], "samples")
    return fig


def _mark_phases(ax, run: RunData, key: str) -> None:
    """Dotted lines where the first run changed protocol."""
    for ph in run.summary.get("timeline", [])[1:]:
        ax.axvline(ph[key], color=protocol_color(ph["protocol"]), ls=":", lw=1)


def timeline(runs: list[RunData]) -> Figure:
    """One row per run: the cluster start, each protocol's span, and marks for switches,
    checkpoints, recoveries and stragglers."""
    fig = Figure(figsize=(11, 1.2 + 0.9 * len(runs)), layout="constrained")
    ax = fig.subplots()
    seen = set()
    for row, (run, name) in enumerate(zip(runs, label(runs))):
        y = len(runs) - 1 - row
        init = run.summary.get("init_s")
        if init:
            ax.barh(y, init, color="#dddddd", height=0.5, label=None if "start" in seen else "cluster start")
            seen.add("start")
        phases = run.summary.get("timeline") or _phases_from_events(run)
        end = run.end_time
        for i, ph in enumerate(phases):
            stop = phases[i + 1]["time"] if i + 1 < len(phases) else end
            p = ph["protocol"]
            ax.barh(y, stop - ph["time"], left=ph["time"], height=0.5, color=protocol_color(p),
                    label=None if p in seen else p)
            seen.add(p)
        for sw in run.of("switch"):
            t0 = sw["time"] - sw.get("overhead_s", 0.0)
            ax.barh(y, max(sw.get("overhead_s", 0.0), end / 400), left=t0, height=0.7, color="black",
                    label=None if "switch" in seen else "switch (its overhead)")
            ax.annotate(f"{sw['method']} {sw.get('overhead_s', 0):.2f}s", (sw["time"], y + 0.38), fontsize=7,
                        ha="center", va="bottom")
            seen.add("switch")
        marks = [(run.of("checkpoint"), "|", "#333333", "checkpoint", 0.0),
                 ([e for e in run.events if e.get("event") in RECOVERY_EVENTS], "X", "#c0392b",
                  "recovery (lost / restarted / rewound)", -0.32),
                 ([e for e in run.events if "straggler" in str(e.get("event"))] +
                  [x for x in run.summary.get("injected", []) if x.get("what") == "begin"], "v", "#8e44ad",
                  "straggler", 0.32)]
        for evs, marker, color, what, dy in marks:
            if evs:
                ax.scatter([e["time"] for e in evs], [y + dy] * len(evs), marker=marker, color=color, s=45,
                           zorder=3, label=None if what in seen else what)
                seen.add(what)
    ax.set_yticks(range(len(runs)), list(reversed(label(runs))))
    ax.set_xlabel("seconds since the run started")
    ax.set_title("protocol timeline")
    ax.set_ylim(-0.7, len(runs) - 0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncol=7, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return fig


def _phases_from_events(run: RunData) -> list[dict]:
    return [{"protocol": e["protocol"], "time": e["time"], "samples": e.get("samples", 0)} for e in run.of("phase")]


def workers(run: RunData) -> Figure:
    """Per worker: measured speed (and LB-BSP's prediction), batch size, staleness and the
    time each worker waited between pushing a step and starting its next (barrier waits)."""
    fig = Figure(figsize=(11, 6.6), layout="constrained")
    (speed_ax, batch_ax), (stale_ax, wait_ax) = fig.subplots(2, 2)
    predicted = False
    for w in run.workers:
        color = WORKER_COLORS[w % len(WORKER_COLORS)]
        mine = [p for p in run.pushes if p["worker"] == w]
        t = [p["time"] for p in mine]
        n = _window(len(mine))
        speed_ax.plot(*gapped(t, smooth([p["samples_per_s"] for p in mine], n)), color=color, lw=1.2,
                      label=f"worker {w}")
        pred = [(p["time"], p["predicted"]) for p in mine if p.get("predicted") is not None]
        if pred:
            predicted = True
            speed_ax.plot(*gapped(*zip(*pred)), color=color, lw=1, ls="--", alpha=0.8)
        batch_ax.step(*gapped(t, [p["batch_size"] for p in mine]), where="post", color=color, lw=1.2,
                      label=f"worker {w}")
        stale_ax.plot(*gapped(t, smooth([p.get("staleness", 0) for p in mine], n)), color=color, lw=1.2)
        waits = [(b["time"], max(b["start"] - a["end"], 0.0)) for a, b in zip(mine, mine[1:])
                 if "start" in a and "end" in a]
        if waits:  # each wait a dot: a long one (a recovery) stands out instead of being averaged away
            wait_ax.scatter([x for x, _ in waits], [y for _, y in waits], color=color, s=4, alpha=0.6)
            wait_ax.set_yscale("symlog", linthresh=0.01)
    speed_ax.set_title("speed (samples/s per step)" + (": measured, -- predicted (LB-BSP)" if predicted else ""))
    batch_ax.set_title("batch size")
    stale_ax.set_title("staleness (updates by others while a step ran)")
    wait_ax.set_title("waiting between steps (s, log scale above 0.01)")
    for ax in (speed_ax, batch_ax, stale_ax, wait_ax):
        ax.set_xlabel("seconds since the run started")
        ax.grid(alpha=0.3)
        for ph in run.summary.get("timeline", [])[1:]:
            ax.axvline(ph["time"], color=protocol_color(ph["protocol"]), ls=":", lw=1)
    speed_ax.legend(fontsize=8)
    return fig


SWITCH_PARTS = [("drain_s", "drain"), ("save_s", "save checkpoint"), ("stop_old_s", "stop old tasks"),
                ("start_new_s", "start new tasks and restore")]


def switch_overheads(runs: list[RunData]) -> Figure | None:
    """Each switch's overhead, split into its parts (drain, save, stop, start + restore)."""
    rows = [(f"{name}: {sw['from']} -> {sw['to']} ({sw['method']})", sw)
            for run, name in zip(runs, label(runs)) for sw in run.summary.get("switches") or run.of("switch")]
    if not rows:
        return None
    fig = Figure(figsize=(11, 1.5 + 0.5 * len(rows)), layout="constrained")
    ax = fig.subplots()
    colors = ["#4878a8", "#e08040", "#c45a76", "#59a14f", "#bbbbbb"]
    for y, (_, sw) in enumerate(rows):
        left = 0.0
        for (key, what), color in zip(SWITCH_PARTS, colors):
            v = float(sw.get(key, 0.0))
            ax.barh(y, v, left=left, color=color, label=what if y == 0 else None)
            left += v
        rest = max(float(sw.get("overhead_s", 0.0)) - left, 0.0)
        ax.barh(y, rest, left=left, color=colors[-1], label="other" if y == 0 else None)
        ax.annotate(f"{sw.get('overhead_s', 0):.2f} s", (left + rest, y), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r for r, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title("switch overhead")
    fig.legend(fontsize=8, ncol=5, loc="outside lower center", frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return fig
