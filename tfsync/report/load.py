"""A run directory read back for the report: ``summary.json`` and ``metrics.jsonl``, with
every time on the run's time base (seconds since it first started; see
``tfsync.engine.records``). Files written before that base existed (schema 1: events in
Unix time) are put on it with ``summary.json``'s ``started_at``. TF-free."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from ..base.exits import BadInput


class ReportError(BadInput, ValueError):
    """A run directory the report cannot read (one line: which file, what is wrong)."""


@dataclass
class RunData:
    path: str
    name: str
    summary: dict
    pushes: list[dict] = field(default_factory=list)   # every push record, in file order
    events: list[dict] = field(default_factory=list)   # every other line (phase, switch, eval, ...)
    discarded: int = 0                                  # push records moved out by a rewind

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("event") == kind]

    @property
    def workers(self) -> list[int]:
        return sorted({p["worker"] for p in self.pushes})

    @property
    def protocols(self) -> list[str]:
        """What ran, in order: a protocol a command switched to marked "(by command)"; a
        resumed run going on with the same protocol is not a new one."""
        timeline = self.summary.get("timeline", [])
        if not timeline:
            return list(dict.fromkeys(p["protocol"] for p in self.pushes))
        by_command = {sw.get("index") for sw in self.summary.get("switches", []) if sw.get("by") == "command"}
        out = []
        for i, ph in enumerate(timeline):
            if ph.get("resumed") and i and ph["protocol"] == timeline[i - 1]["protocol"]:
                continue
            out.append(ph["protocol"] + (" (by command)" if i in by_command else ""))
        return out

    @property
    def end_time(self) -> float:
        times = [p["time"] for p in self.pushes] + [e["time"] for e in self.events if "time" in e]
        return max(times, default=0.0)


def load_run(path: str) -> RunData:
    """Read ``path`` (a run directory, or its metrics.jsonl / summary.json)."""
    if os.path.isfile(path):
        path = os.path.dirname(os.path.abspath(path))
    metrics = os.path.join(path, "metrics.jsonl")
    if not os.path.isfile(metrics):
        raise ReportError(f"{path}: no metrics.jsonl there; give the run directory of a `tfsync run`")
    summary = {}
    summary_path = os.path.join(path, "summary.json")
    if os.path.isfile(summary_path):  # absent while a run is going on or after a crash
        try:
            with open(summary_path) as f:
                summary = json.load(f)
        except ValueError as e:
            raise ReportError(f"{summary_path}: not JSON ({e})") from None
        if not isinstance(summary, dict):
            raise ReportError(f"{summary_path}: expected a JSON object")
    pushes, events = [], []
    with open(metrics) as f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line a crash cut short
            if not isinstance(rec, dict):
                raise ReportError(f"{metrics}:{n}: expected a JSON object per line")
            (events if "event" in rec else pushes).append(rec)
    if not pushes and not events:
        raise ReportError(f"{metrics}: empty (the run recorded nothing yet)")
    header = next((e for e in events if e.get("event") == "run"), None)
    if header is None:  # schema 1: events and push start/end in Unix time
        origin = summary.get("started_at")
        for e in events:
            if origin is not None and e.get("time", 0) > 1e9:
                e["time"] -= origin
        for p in pushes:
            if origin is not None and p.get("start", 0) > 1e9:
                p["start"] -= origin
                p["end"] -= origin
    name = (summary.get("meta") or {}).get("job") or os.path.basename(os.path.abspath(path))
    discarded = sum(e.get("discarded", 0) for e in events if e.get("event") == "rewind")
    return RunData(path=os.path.abspath(path), name=str(name), summary=summary, pushes=pushes, events=events,
                   discarded=discarded)


@dataclass(frozen=True)
class Slowdown:
    """A worker slow from ``start`` to ``end`` (the run's time base): ``injected`` by the
    job's ``[[inject]]`` (``factor``: its steps took that many times as long) or
    ``detected`` by a straggler policy (from the window that decided it to the one that
    saw it recover; the run's end if none did)."""
    worker: int
    start: float
    end: float
    source: str
    factor: float | None = None


def slowdowns(run: RunData) -> list[Slowdown]:
    """Every injected and detected slowdown of the run, in start order."""
    out = []
    opened: dict[tuple[str, int], tuple[float, float | None]] = {}

    def walk(source, marks):  # marks: (time, worker, opens?, factor)
        for t, w, opens, factor in sorted(marks, key=lambda m: m[0]):
            if opens:
                opened.setdefault((source, w), (t, factor))
            elif (source, w) in opened:
                start, f = opened.pop((source, w))
                out.append(Slowdown(w, start, t, source, f))

    walk("injected", [(x["time"], x["worker"], x.get("what") == "begin", x.get("slowdown"))
                      for x in run.summary.get("injected", []) if "time" in x and "worker" in x])
    base = run.summary.get("time_base") or run.summary.get("started_at") or 0.0
    detected = {(float(t), int(w), kind) for ph in run.summary.get("timeline", [])  # a resumed detector repeats them
                for t, w, kind in (ph.get("stats") or {}).get("detected", [])}
    walk("detected", [(t - base, w, kind == "became", None) for t, w, kind in detected])
    out += [Slowdown(w, start, max(run.end_time, start), source, f) for (source, w), (start, f) in opened.items()]
    return sorted(out, key=lambda s: (s.start, s.worker))


def run_spans(run: RunData) -> list[tuple[float, float]]:
    """(start, end) of each run of the job on its time base (a resumed job has several)."""
    base = run.summary.get("time_base") or run.summary.get("started_at")
    spans = [(r["started_at"] - base, r["started_at"] - base + r.get("wall_s", 0.0))
             for r in run.summary.get("runs", []) if base is not None and r.get("started_at") is not None]
    return spans or [(0.0, run.end_time)]


def label(runs: list[RunData]) -> list[str]:
    """A short distinct label per run: its name, or its directory where names repeat."""
    names = [r.name for r in runs]
    if len(set(names)) == len(names):
        return names
    return [os.path.basename(r.path) or r.path for r in runs]
