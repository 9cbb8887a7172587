"""One self-contained HTML page (figures embedded as PNG data, no script, no network) and
the same figures as PNG files beside it. TF-free."""

from __future__ import annotations

import base64
import html
import io
import os
import time

from ..base import safefile
from . import plots
from .load import RunData, label, load_run

CAPTIONS = {
    "loss": "Training loss as the workers reported it (a trailing mean), then every test number of the "
            "background evaluator (train.eval_every): the metrics, then the loss; against time and against "
            "samples. Dotted lines: the first run's phases, each with its rate factor (BSP and LB-BSP run "
            "at n x the learning rate, so the training loss jumps there).",
    "timeline": "Which protocol ran when. Grey: the cluster starting; hatched: the job stopped until it was "
                "resumed. Black: a switch and what it cost; dark blue: a change of the worker count "
                "(tfsync scale) and what it cost. Ticks: checkpoints; red crosses: recoveries (a lost "
                "task restarted, a rewind, a resume). Thin bars below: a worker slowed down, injected (its "
                "factor) or detected by a straggler policy.",
    "workers": "Per worker: speed per step, batch size, staleness, and the time from a step's gradient to "
               "the start of the next (the push's way to the PS and the weights' way back, a round trip or more "
               "on a network; BSP's barrier waits). Shaded: that worker's slowdowns. "
               "For LB-BSP, its predicted speeds (dashed) beside the speeds it learns from, both in samples "
               "per second from when a step could start to its push's arrival (the affine model predicts at "
               "the configured batch size).",
    "switches": "Each protocol switch's overhead, split into its parts.",
}

SUMMARY_ROWS = [
    ("protocols", lambda r: " -> ".join(r.protocols)),
    ("workers / PS", lambda r: f"{_workers(r)} / {r.summary.get('ps', '?')}"),
    ("runs", lambda r: _runs(r.summary.get("runs") or [{}])),
    ("wall time (s)", lambda r: _per_run(r.summary, "wall_s")),
    ("cluster start (s)", lambda r: _per_run(r.summary, "init_s")),
    ("steps / updates", lambda r: f"{r.summary.get('pushes', len(r.pushes))} / {r.summary.get('updates', '?')}"),
    ("samples", lambda r: f"{r.summary.get('samples', 0):,}"),
    ("training time (s)", lambda r: _per_run(r.summary, "train_s")),
    ("samples/s (training time)", lambda r: _num(r.summary.get("job_samples_per_s", r.summary.get("samples_per_s")),
                                                 ",.0f")),
    ("coordinator CPU", lambda r: _coordinator(r.summary.get("coordinator"))),
    ("test accuracy", lambda r: _num(r.summary.get("test_accuracy"), ".2%")),
    ("test loss", lambda r: _num(r.summary.get("test_loss"), ".4g")),
    ("switches", lambda r: ", ".join(f"{s['method']}{' (command)' if s.get('by') == 'command' else ''} "
                                     f"{s.get('overhead_s', 0):.2f} s" for s in r.summary.get("switches", [])) or "none"),
    ("checkpoints", lambda r: str(len(r.summary.get("checkpoints", r.of("checkpoint"))))),
    ("recoveries", lambda r: str(len(r.summary.get("recoveries", [])))),
    ("records discarded by rewinds", lambda r: str(r.discarded)),
    ("run directory", lambda r: r.path),
]


def _workers(r) -> str:
    """The worker count, and how `tfsync scale` changed it: "2 -> 3 -> 2"."""
    scales = r.of("scaled")
    if not scales:
        return str(r.summary.get("workers", len(r.workers)))
    return " -> ".join(str(n) for n in [scales[0]["from"], *(s["to"] for s in scales)])


def _coordinator(load: dict | None) -> str:
    """The coordinator's share of a core while it trained, per push, and whether it may
    be what limits training (tfsync.engine.summary.coordinator_load)."""
    if not load:
        return "-"
    text = f"{load['cores']:.2f} of a core" + (f", {load['ms_per_push']:.2f} ms a step" if load.get("ms_per_push")
                                                else "")
    return text + (": it may be what limits training" if load.get("busy") else "")


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _runs(runs: list[dict]) -> str:
    """How many runs the job took and how each ended (a stopped job resumed: two)."""
    if len(runs) < 2:
        return "1"
    ends = ["stopped" if r.get("stopped") else "failed" if "failed" in r else "done" for r in runs]
    return f"{len(runs)}: " + ", then resumed: ".join(ends)


def _per_run(summary: dict, key: str) -> str:
    """The whole job's ``key`` (seconds), with each run's where there were several."""
    runs = summary.get("runs") or []
    if len(runs) < 2:
        return _num(summary.get(key), ".1f")
    each = [r.get(key) for r in runs]
    whole = summary.get("job_" + key, sum(each) if all(isinstance(v, (int, float)) for v in each) else None)
    return f"{_num(whole, '.1f')} (" + " + ".join(_num(v, ".1f") for v in each) + ")"


def _metric_rows(runs: list[RunData]) -> list[tuple]:
    """``test_<metric>`` rows for the metrics any run reported (beyond accuracy and loss)."""
    keys = sorted({k for r in runs for k in r.summary if k.startswith("test_")} - {"test_accuracy", "test_loss"})
    return [(k.replace("_", " ", 1), lambda r, k=k: _num(r.summary.get(k), ".4g")) for k in keys]


def figures(runs: list[RunData]) -> list[tuple[str, str, object]]:
    """(file stem, title, Figure) of every figure the runs have data for."""
    out = [("loss", "Loss and test metrics", plots.loss_curves(runs)),
           ("timeline", "Protocol timeline", plots.timeline(runs))]
    for i, (run, name) in enumerate(zip(runs, label(runs))):
        if run.pushes:
            stem = "workers" if len(runs) == 1 else f"workers_{i + 1}"
            out.append((stem, f"Workers: {name}" if len(runs) > 1 else "Workers", plots.workers(run)))
    sw = plots.switch_overheads(runs)
    if sw is not None:
        out.append(("switches", "Switch overhead", sw))
    return out


def write_report(paths: list[str], out: str | None = None) -> str:
    """The report of the runs at ``paths`` written to ``out`` (default: one run's
    ``report.html`` in its directory), PNGs in ``<out without .html>_files/``; returns ``out``."""
    runs = [load_run(p) for p in paths]
    if out is None:
        if len(runs) > 1:
            raise ValueError("several runs: name the report file with -o/--output")
        out = os.path.join(runs[0].path, "report.html")
    png_dir = os.path.splitext(out)[0] + "_files"
    safefile.make_dir(png_dir)
    sections = []
    for stem, title, fig in figures(runs):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        data = buf.getvalue()
        with safefile.replacing(os.path.join(png_dir, stem + ".png"), binary=True) as f:
            f.write(data)
        caption = CAPTIONS.get(stem.split("_")[0], "")
        sections.append(f'<section><h2>{html.escape(title)}</h2><p class="cap">{html.escape(caption)}</p>'
                        f'<img alt="{html.escape(title)}" src="data:image/png;base64,'
                        f'{base64.b64encode(data).decode()}"></section>')
    safefile.write(out, _page(runs, sections))
    return out


def _table(runs: list[RunData]) -> str:
    head = "".join(f"<th>{html.escape(n)}</th>" for n in label(runs))
    rows = []
    after = next(i for i, (name, _) in enumerate(SUMMARY_ROWS) if name == "test loss") + 1
    for name, cell in SUMMARY_ROWS[:after] + _metric_rows(runs) + SUMMARY_ROWS[after:]:
        tds = "".join(f"<td>{html.escape(cell(r))}</td>" for r in runs)
        rows.append(f"<tr><th>{html.escape(name)}</th>{tds}</tr>")
    return f"<table><tr><th></th>{head}</tr>{''.join(rows)}</table>"


def _moves(runs: list[RunData]) -> str:
    """The protocol a choosing policy (``protocol = "auto"``) moved to, when and why ("" if none)."""
    rows = []
    for run, name in zip(runs, label(runs)):
        base = run.summary.get("time_base") or run.summary.get("started_at") or 0.0
        for ph in run.summary.get("timeline", []):
            moves = (ph.get("stats") or {}).get("moves") if ph.get("protocol") == "auto" else None
            for m in moves if isinstance(moves, list) else []:
                rows.append(f"<tr><td>{html.escape(name)}</td><td>{m['time'] - base:.1f}</td>"
                            f"<td>{html.escape(m['from'])} -&gt; {html.escape(m['to'])}</td>"
                            f"<td>{html.escape(m['why'])}</td></tr>")
    if not rows:
        return ""
    return ("<section><h2>Protocol moves (auto)</h2><table><tr><th>run</th><th>time (s)</th><th>move</th><th>why</th>"
            f"</tr>{''.join(rows)}</table></section>")


def _page(runs: list[RunData], sections: list[str]) -> str:
    title = "tfsync report: " + ", ".join(label(runs))
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 4px 10px; text-align: left; font-size: 14px; }}
tr th:first-child {{ background: #f4f4f4; }}
img {{ max-width: 100%; }}
.cap {{ color: #555; font-size: 14px; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="cap">Made by <code>tfsync report</code> on {when}. Times are seconds since the job first started (a resumed job's runs on one time base).</p>
{_table(runs)}
{_moves(runs)}
{"".join(sections)}
</body></html>
"""
