"""The report's figures, each a function of the runs returning a matplotlib ``Figure``
(``matplotlib.figure.Figure``: no pyplot, no global state, safe in any thread). TF-free."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .load import RunData, label, run_spans, slowdowns

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


def across_runs(run: RunData, t, *series) -> list[np.ndarray]:
    """``t`` and each of ``series`` with a NaN where the job was down between two of its
    runs (a resumed job), so a sparse line (the test numbers) is not drawn across the stop."""
    t = np.asarray(t, dtype=float)
    starts = [a for a, _ in run_spans(run)[1:]]
    cut = [i for i in range(1, len(t)) if any(t[i - 1] < a <= t[i] for a in starts)]
    return [np.insert(np.asarray(v, dtype=float), cut, np.nan) for v in (t, *series)]


def _window(n: int) -> int:
    return max(1, min(50, n // 20))


def _counted(run: RunData) -> list[dict]:
    return [p for p in run.pushes if not p.get("dropped") and p.get("loss") is not None
            and np.isfinite(p["loss"])]


def time_limits(runs: list[RunData]) -> tuple[float, float]:
    """The one time axis of every plot against time: from the run's start to the last end."""
    return 0.0, max([r.end_time for r in runs] + [1.0]) * 1.02


def test_numbers(run: RunData) -> dict[str, list[tuple[float, float, float]]]:
    """Each number the background evaluator reported (the loss, each metric) as
    (time, samples, value) points."""
    out: dict[str, list] = {}
    for e in run.of("eval"):
        values = {"loss": e.get("loss"), **(e.get("metrics") or {"accuracy": e.get("accuracy")})}
        for k, v in values.items():
            if v is not None and np.isfinite(v):
                out.setdefault(k, []).append((e["time"], e.get("samples", 0), float(v)))
    return out


def loss_curves(runs: list[RunData]) -> Figure:
    """Training loss (trailing mean), then every test number (the metrics, the loss),
    against time and against samples; the first run's phase starts with their rate."""
    tests = [test_numbers(r) for r in runs]
    metrics = sorted({k for t in tests for k in t} - {"loss"})
    test_loss = any("loss" in t for t in tests)
    rows = 1 + bool(metrics) + test_loss
    fig = Figure(figsize=(11, 3.4 * rows), layout="constrained")
    axes = fig.subplots(rows, 2, squeeze=False)
    styles = ["o-", "s--", "^-.", "d:", "v-", "x--"]
    for run, name, color, numbers in zip(runs, label(runs), RUN_COLORS * 10, tests):
        pushes = _counted(run)
        loss = smooth([p["loss"] for p in pushes], _window(len(pushes)))
        axes[0][0].plot(*gapped([p["time"] for p in pushes], loss), color=color, lw=1.3, label=name)
        axes[0][1].plot([p["samples"] for p in pushes], loss, color=color, lw=1.3, label=name)
        for key, points in numbers.items():
            row = axes[-1] if key == "loss" else axes[1]
            style = "o-" if key == "loss" else styles[metrics.index(key) % len(styles)]
            t, samples, values = across_runs(run, *zip(*points))
            for ax, xs in zip(row, (t, samples)):
                ax.plot(xs, values, style, color=color, ms=3, lw=1.2,
                        label=f"{name}: test {key}" if len(runs) > 1 or key != "loss" else None)
    axes[0][0].set_title("training loss (mean of recent pushes) vs time")
    axes[0][1].set_title("training loss vs samples")
    if metrics:
        for ax, key in zip(axes[1], ("time", "samples")):
            ax.set_title(f"test metrics (background evaluator) vs {key}")
            ax.legend(fontsize=8)
    if test_loss:
        for ax, key in zip(axes[-1], ("time", "samples")):
            ax.set_title(f"test loss (background evaluator) vs {key}")
            ax.set_ylabel("loss")
            if len(runs) > 1:
                ax.legend(fontsize=8)
    axes[0][0].set_ylabel("loss")
    for row in axes:
        row[0].set_xlabel("seconds since the job started")
        row[0].set_xlim(*time_limits(runs))
        row[1].set_xlabel("samples trained")
        for ax in row:
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    _mark_rates(axes[0][0], runs[0], "time")
    _mark_rates(axes[0][1], runs[0], "samples")
    return fig


def _mark_rates(ax, run: RunData, key: str) -> None:
    """A dotted line at each of the run's phase starts, with the protocol and its rate
    factor (BSP's n x rate makes the training loss jump)."""
    for i, ph in enumerate(run.summary.get("timeline", [])):
        ax.axvline(ph[key], color=protocol_color(ph["protocol"]), ls=":", lw=1)
        rate = ph.get("lr_scale")
        text = ph["protocol"] + (f" {rate:g}x rate" if rate is not None else "") + (" (resumed)" if ph.get("resumed") else "")
        ax.annotate(text, (ph[key], 1), xycoords=("data", "axes fraction"), xytext=(3, -3 - 10 * (i % 2)),
                    textcoords="offset points", fontsize=7, va="top", color=protocol_color(ph["protocol"]))


def _phase_spans(run: RunData) -> list[tuple[dict, float, float]]:
    """Each phase with its start and end: the next phase's start, or the end of the run
    (of the job's runs) it began in: a stopped run's last phase ends at the stop."""
    phases = run.summary.get("timeline") or _phases_from_events(run)
    ends = [e for _, e in run_spans(run)]
    out = []
    for i, ph in enumerate(phases):
        stop = phases[i + 1]["time"] if i + 1 < len(phases) else run.end_time
        run_end = next((e for e in ends if e >= ph["time"]), stop)
        out.append((ph, ph["time"], min(stop, run_end) if i + 1 < len(phases) else stop))
    return out


def timeline(runs: list[RunData]) -> Figure:
    """One row per run: the cluster start, each protocol's span, where the job was down
    between runs, switches, scales, checkpoints, recoveries, and each worker's slowdowns."""
    fig = Figure(figsize=(11, 1.4 + 1.0 * len(runs)), layout="constrained")
    ax = fig.subplots()
    seen = set()

    def once(what):
        new = what not in seen
        seen.add(what)
        return what if new else None

    for row, run in enumerate(runs):
        y = len(runs) - 1 - row
        spans = run_spans(run)
        phases = _phase_spans(run)
        # the first run's start: until its first phase (a resumed job's init_s is its last run's)
        init = phases[0][1] if phases and len(spans) > 1 else run.summary.get("init_s")
        if init:
            ax.barh(y, init, color="#dddddd", height=0.5, label=once("cluster start"))
        for (_, a), (b, _) in zip(spans, spans[1:]):
            ax.barh(y, b - a, left=a, height=0.5, color="white", edgecolor="#999999", hatch="//",
                    label=once("stopped (down until resumed)"))
            first = next((t0 for _, t0, _ in phases if t0 >= b), b)
            ax.barh(y, first - b, left=b, color="#dddddd", height=0.5, label=once("cluster start"))
        end = run.end_time
        for ph, t0, t1 in phases:
            ax.barh(y, t1 - t0, left=t0, height=0.5, color=protocol_color(ph["protocol"]), label=once(ph["protocol"]))
        for sw in run.of("switch"):
            t0 = sw["time"] - sw.get("overhead_s", 0.0)
            ax.barh(y, max(sw.get("overhead_s", 0.0), end / 400), left=t0, height=0.7, color="black",
                    label=once("switch (its overhead)"))
            by = " (command)" if sw.get("by") == "command" else ""
            ax.annotate(f"{sw['method']}{by} {sw.get('overhead_s', 0):.2f}s", (sw["time"], y + 0.38), fontsize=7,
                        ha="center", va="bottom")
        for sc in run.of("scaled"):   # a change of the worker count (tfsync scale)
            t0 = sc["time"] - sc.get("seconds", 0.0)
            ax.barh(y, max(sc.get("seconds", 0.0), end / 400), left=t0, height=0.7, color="#2c3e50",
                    label=once("scale (its cost)"))
            ax.annotate(f"{sc['from']}\u2192{sc['to']} workers {sc.get('seconds', 0):.1f}s", (sc["time"], y - 0.38),
                        fontsize=7, ha="center", va="top", color="#2c3e50")
        for sd in slowdowns(run):
            color = "#8e44ad" if sd.source == "injected" else "#c0392b"
            ax.barh(y - 0.36, sd.end - sd.start, left=sd.start, height=0.14, color=color, alpha=0.6,
                    label=once(f"slowdown ({sd.source})"))
            factor = f" {sd.factor:g}x slower" if sd.factor else " straggler"
            ax.annotate(f"w{sd.worker}{factor}", (sd.start, y - 0.45), fontsize=7, va="top", color=color)
        marks = [(run.of("checkpoint"), "|", "#333333", "checkpoint", 0.0),
                 ([e for e in run.events if e.get("event") in RECOVERY_EVENTS], "X", "#c0392b",
                  "recovery (lost / restarted / rewound / resumed)", 0.32)]
        for evs, marker, color, what, dy in marks:
            if evs:
                ax.scatter([e["time"] for e in evs], [y + dy] * len(evs), marker=marker, color=color, s=45,
                           zorder=3, label=once(what))
    ax.set_yticks(range(len(runs)), list(reversed(label(runs))))
    ax.set_xlabel("seconds since the job started")
    ax.set_xlim(*time_limits(runs))
    ax.set_title("protocol timeline")
    ax.set_ylim(-0.8, len(runs) - 0.3)
    fig.legend(fontsize=8, loc="outside lower center", ncol=5, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return fig


def _phases_from_events(run: RunData) -> list[dict]:
    return [{"protocol": e["protocol"], "time": e["time"], "samples": e.get("samples", 0)} for e in run.of("phase")]


def workers(run: RunData) -> Figure:
    """Per worker: measured speed, batch size, staleness and the time from each step's
    gradient to the worker's next step (the push's way to the PS and the next token's and
    weights' way back; BSP's barrier waits); for LB-BSP, its
    predicted speeds beside the speeds it learns from, in the same units; each worker's
    slowdowns shaded in its colour."""
    predicted = any(p.get("predicted") is not None for p in run.pushes)
    fig = Figure(figsize=(11, 9.6 if predicted else 6.6), layout="constrained")
    grid = fig.subplots(3 if predicted else 2, 2, squeeze=False)
    (speed_ax, batch_ax), (stale_ax, wait_ax) = grid[0], grid[1]
    panels = [speed_ax, batch_ax, stale_ax, wait_ax]
    if predicted:
        gs = grid[2][0].get_gridspec()
        for ax in grid[2]:
            ax.remove()
        pred_ax = fig.add_subplot(gs[2, :])
        panels.append(pred_ax)
    # a worker's tasks start again at these (a stop and resume, a scale, a restart switch): the
    # time between its steps across one is the job's gap (its own band), not a wait
    breaks = [start for start, _ in run_spans(run)[1:]] + [e["time"] for e in run.of("scaled") + run.of("switch")
                                                           if e.get("method", "restart") == "restart"]
    for w in run.workers:
        color = WORKER_COLORS[w % len(WORKER_COLORS)]
        mine = [p for p in run.pushes if p["worker"] == w]
        t = [p["time"] for p in mine]
        n = _window(len(mine))
        speed_ax.plot(*gapped(t, smooth([p["samples_per_s"] for p in mine], n)), color=color, lw=1.2,
                      label=f"worker {w}")
        batch_ax.step(*gapped(t, [p["batch_size"] for p in mine]), where="post", color=color, lw=1.2,
                      label=f"worker {w}")
        stale_ax.plot(*gapped(t, smooth([p.get("staleness", 0) for p in mine], n)), color=color, lw=1.2)
        waits = [(b["time"], max(b["start"] - a["end"], 0.0)) for a, b in zip(mine, mine[1:])
                 if "start" in a and "end" in a and not any(a["end"] <= t <= b["start"] for t in breaks)]
        if waits:  # each wait a dot: a long one (a recovery) stands out instead of being averaged away
            wait_ax.scatter([x for x, _ in waits], [y for _, y in waits], color=color, s=4, alpha=0.6)
            wait_ax.set_yscale("symlog", linthresh=0.01)
        sized = [p for p in mine if p.get("predicted") is not None]
        seen = [p for p in sized if p.get("turnaround_s")]  # absent in older records
        if seen:
            seen_speed = smooth([p["batch_size"] / p["turnaround_s"] for p in seen], n)
            pred_ax.plot(*gapped([p["time"] for p in seen], seen_speed), color=color, lw=1.2,
                         label=f"worker {w}: measured")
        if sized:
            pred_ax.plot(*gapped([p["time"] for p in sized], [p["predicted"] for p in sized]), color=color, lw=1,
                         ls="--", label=f"worker {w}: predicted")
    speed_ax.set_title("speed (samples per second of the step on the worker)")
    batch_ax.set_title("batch size")
    stale_ax.set_title("staleness (updates by others while a step ran)")
    wait_ax.set_title("waiting between steps (s, log scale above 0.01)")
    if predicted:
        pred_ax.set_title("LB-BSP: predicted (--) and measured speed, in samples/s over each step's turnaround")
        pred_ax.legend(fontsize=7, ncol=len(run.workers))
    for sd in slowdowns(run):
        color = WORKER_COLORS[sd.worker % len(WORKER_COLORS)]
        for ax in panels:
            ax.axvspan(sd.start, sd.end, color=color, alpha=0.12, lw=0)
        what = f"{sd.factor:g}x slower (injected)" if sd.factor else f"slow ({sd.source})"
        speed_ax.annotate(f"worker {sd.worker} {what}", (sd.start, 1), xycoords=("data", "axes fraction"),
                          xytext=(2, -3), textcoords="offset points", fontsize=7, va="top", color=color)
    for ax in panels:
        ax.set_xlabel("seconds since the job started")
        ax.set_xlim(*time_limits([run]))
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
