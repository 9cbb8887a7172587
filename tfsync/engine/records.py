"""What a run writes to its directory: ``metrics.jsonl`` (one line per push, and events
such as ``eval``), TensorBoard scalars (``tb/``) and ``summary.json`` at the end.

One time base: every time in ``metrics.jsonl`` (``time`` of pushes and events, a push's
``start`` and ``end``) is in seconds since the run first started, the Unix time that the
file's first line gives. That line is ``{"event": "run", "schema": 2, "time": 0.0,
"started_at": UNIX_TIME, ...}``; a `tfsync resume` appends another ``run`` line (its
``time``: when it started, on the same base, so the time it was down shows as a gap).

``metrics.jsonl`` holds what counted: when training goes back to a checkpoint (a lost PS,
`tfsync resume`), the push records after it are moved to ``metrics.discarded.jsonl``
(each marked ``"discarded": why``) and a ``rewind`` event says how many, so the push
numbers in ``metrics.jsonl`` never repeat and end at ``summary.json``'s ``pushes``.

TensorBoard events are written as Event protos through ``tf.io.TFRecordWriter`` (a plain
file writer), not ``tf.summary``: a summary writer is an eager resource, and every
restart switch reconnects the coordinator's eager context to a new cluster, which
invalidates resources made before it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2
from tensorflow.core.util import event_pb2

from ..base import nospace, safefile
from .checkpoints import newest_intact

logger = logging.getLogger(__name__)


class EventWriter:
    """Scalar events in TensorBoard's file format."""

    def __init__(self, log_dir: str):
        safefile.make_dir(log_dir)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        # made here first (O_EXCL, no link followed); the writer then opens that file
        self._path = safefile.create_new(os.path.join(log_dir, name))
        self._writer = tf.io.TFRecordWriter(self._path)
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event) -> None:
        data = event.SerializeToString()
        with nospace.writing("TensorBoard events", self._path, len(data)):
            self._writer.write(data)

    def scalars(self, step: int, values: dict) -> None:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=float(v))
                                             for k, v in values.items()])
        self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def text(self, step: int, tag: str, text: str) -> None:
        """A text summary (TensorBoard's Text tab), e.g. the protocol at a switch."""
        tensor = tf.make_tensor_proto(np.array(text, dtype=object))
        meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        value = summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=meta)
        summary = summary_pb2.Summary(value=[value])
        self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def close(self) -> None:
        with nospace.writing("TensorBoard events", self._path):
            self._writer.flush()
            self._writer.close()


SCHEMA = 2  # of metrics.jsonl; 2: one time base and a ``run`` line first
LOSS_EMA = 0.1  # the weight of a push's loss in TensorBoard's train/loss
BUFFERED = 1 << 16  # bytes of push lines held before they are written (events are written at once) ...
FLUSH_S = 0.5       # ... or for at most this long: a reader of the file is never far behind the run


class _Window:
    """The push scalars since the last flush, written to TensorBoard as one point a tag at
    the last push's number: each tag's mean over the pushes, or its last value. A point a
    push cost the coordinator a protobuf a push (issue 55), and TensorBoard thins such
    series when it shows them anyway."""

    def __init__(self):
        self.sums: dict[str, list] = {}
        self.values: dict[str, float] = {}
        self.step: int | None = None

    def mean(self, values: dict) -> None:
        for k, v in values.items():
            if v is not None:
                s = self.sums.setdefault(k, [0.0, 0])
                s[0] += v
                s[1] += 1

    def last(self, step: int, values: dict) -> None:
        self.step = step
        self.values.update(values)

    def take(self) -> dict:
        out = {**{k: total / n for k, (total, n) in self.sums.items()}, **self.values}
        self.sums, self.values, self.step = {}, {}, None
        return out


class RunRecorder:
    def __init__(self, run_dir: str, tensorboard: bool = True):
        self.run_dir = run_dir
        os.makedirs(run_dir, exist_ok=True)
        self._path = os.path.join(run_dir, "metrics.jsonl")
        self._pending, self._pending_bytes = [], 0  # whole lines not yet written
        self._flushed = time.monotonic()
        self._metrics = self._open()
        self._tb = EventWriter(os.path.join(run_dir, "tb")) if tensorboard else None
        self.origin = time.time()  # the time base: the run's first start (``begin``)
        self._loss = None  # train/loss: the pushes' losses, averaged over about 1 / LOSS_EMA pushes
        self._scalars = _Window()   # the push scalars since the last flush

    def begin(self, now: float, resume: bool = False, **fields) -> None:
        """The run (or its resumption, ``resume``) starts at Unix time ``now``: write its
        ``run`` line; a resumed run keeps the time base of the file's first ``run`` line."""
        first = run_header(self._path) if resume else None
        self.origin = float(first["started_at"]) if first else now
        self._write({"event": "run", "schema": SCHEMA, "time": round(now - self.origin, 4), "started_at": now,
                     "resumed": first is not None, **fields})

    def since(self, now: float | None = None) -> float:
        """Seconds since the run first started (``now``: a Unix time; default: now)."""
        return (time.time() if now is None else now) - self.origin

    def push(self, record: dict) -> None:
        """A push record (``pushlog.push_record``; ``time`` already on the run's base, the
        worker's ``start`` and ``end`` Unix times, put on it here)."""
        times = {k: round(record[k] - self.origin, 6) for k in ("start", "end") if k in record}
        if self._tb is not None:   # before the line: a line that fills the buffer writes both
            w, loss = record["worker"], record["loss"]
            self._scalars.mean({f"loss/worker{w}": loss, f"samples_per_s/worker{w}": record["samples_per_s"],
                                f"batch_size/worker{w}": record["batch_size"], "train/staleness": record["staleness"]})
            last = {"train/lr": record["lr"], "train/samples": record["samples"]}
            if loss is not None and np.isfinite(loss) and not record["dropped"]:
                self._loss = loss if self._loss is None else (1 - LOSS_EMA) * self._loss + LOSS_EMA * loss
                last["train/loss"] = self._loss
            self._scalars.last(record["pushes"], last)
        self._append(json.dumps({**record, **times}) + "\n")

    def phase(self, start: dict, pushes: int, index: int) -> None:
        """A ``phase`` event; in TensorBoard, the protocol as text (``protocol``) and as the
        scalar ``train/phase`` (0, 1, 2, ...: a step where it changes marks the switch)."""
        self.event("phase", **start)
        if self._tb is not None:
            self._tb.text(pushes, "protocol", f"{start['protocol']} from sample {start['samples']} "
                                              f"(update {start['updates']}, {start['time']:.1f} s)")
            self._tb.scalars(pushes, {"train/phase": index})

    def evaluation(self, record: dict, step: int) -> None:
        """An ``eval`` event (``Evaluation.to_dict``) and its numbers as TensorBoard scalars
        ``test/loss``, ``test/accuracy``, ``test/<metric>`` at ``step``."""
        self.event("eval", **record)
        if self._tb is not None:
            values = {"loss": record.get("loss"), "accuracy": record.get("accuracy"), **record.get("metrics", {})}
            self._tb.scalars(step, {f"test/{k}": v for k, v in values.items() if v is not None})

    def event(self, kind: str, **fields) -> None:
        """An event line: ``time`` is now on the run's time base unless ``fields`` give it."""
        self._write({"event": kind, "time": round(self.since(), 4), **fields})

    def _write(self, record: dict) -> None:
        self._append(json.dumps(record) + "\n", flush=True)

    def _append(self, line: str, flush: bool = False) -> None:
        self._pending.append(line)
        self._pending_bytes += len(line)
        if flush or self._pending_bytes >= BUFFERED or time.monotonic() - self._flushed >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        """Write the lines held (and to TensorBoard, the push scalars since the last flush);
        the file only ever ends at a whole line: a write that fails (a full disk) is cut
        back to where it began, and its lines are lost with the run."""
        self._flushed = time.monotonic()
        if self._tb is not None and self._scalars.step is not None:
            self._tb.scalars(self._scalars.step, self._scalars.take())
        if not self._pending:
            return
        data = memoryview("".join(self._pending).encode())
        self._pending, self._pending_bytes = [], 0
        end = os.fstat(self._metrics.fileno()).st_size
        with nospace.writing("the run's records (metrics.jsonl)", self._path, len(data)):
            try:
                while data:
                    data = data[self._metrics.write(data):]
            except BaseException:
                os.ftruncate(self._metrics.fileno(), end)
                raise

    def _open(self):
        return safefile.open_append(self._path, binary=True, buffering=0)

    def rewind(self, pushes: int, why: str) -> int:
        """Training goes on from the checkpoint taken after push ``pushes``: move the push
        records after it (and lines a crash cut short) out to ``metrics.discarded.jsonl``;
        returns how many records went."""
        self.flush()
        self._metrics.close()
        kept, gone = [], []
        with open(self._path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:  # a line cut short by a crash
                    continue
                if "worker" in rec and rec.get("pushes", 0) > pushes:
                    gone.append({**rec, "discarded": why})
                else:
                    kept.append(line if line.endswith("\n") else line + "\n")
        if gone:
            with safefile.open_append(os.path.join(self.run_dir, "metrics.discarded.jsonl")) as f:
                f.writelines(json.dumps(r) + "\n" for r in gone)
        safefile.write(self._path, "".join(kept))
        self._metrics = self._open()
        self.event("rewind", pushes=pushes, discarded=len(gone), why=why)
        return len(gone)

    def summary(self, data: dict) -> str:
        text = json.dumps(data, indent=2)
        path = os.path.join(self.run_dir, "summary.json")
        with nospace.writing("the run's summary", path, len(text)):
            return safefile.write(path, text)

    def close(self, strict: bool = True) -> None:
        """Write what is held and close; not ``strict`` (a run that failed already), a full
        disk is logged, not raised, so that it does not hide the run's own error."""
        try:
            if not self._metrics.closed:
                try:
                    self.flush()
                finally:
                    self._metrics.close()
            if self._tb is not None:
                tb, self._tb = self._tb, None
                tb.close()
        except nospace.NoSpaceError as e:
            if strict:
                raise
            logger.warning("%s", e)


def run_header(path: str) -> dict | None:
    """The first ``run`` line of a ``metrics.jsonl`` (None: none, or a file older than schema 2)."""
    try:
        with open(path) as f:
            for line in f:
                if '"run"' in line:
                    rec = json.loads(line)
                    if rec.get("event") == "run":
                        return rec
    except (OSError, ValueError):
        pass
    return None


def checkpoint_events(run_dir: str) -> list[dict]:
    """The checkpoint events in ``run_dir/metrics.jsonl`` whose files still exist (path,
    updates, samples, pushes, round, workers), oldest first."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    found = []
    with open(path) as f:
        for line in f:
            if '"checkpoint"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut short by a crash
                continue
            if rec.get("event") == "checkpoint" and os.path.exists(rec["path"] + ".index"):
                found = [e for e in found if e["path"] != rec["path"]]   # written again after a rewind
                found.append({k: rec[k] for k in ("path", "updates", "samples", "pushes", "round", "workers")
                              if k in rec})
    return found


def last_checkpoint(run_dir: str) -> dict | None:
    """The newest checkpoint event of ``run_dir`` whose files exist (None: none)."""
    found = checkpoint_events(run_dir)
    return found[-1] if found else None


def last_intact_checkpoint(run_dir: str) -> tuple[dict | None, list]:
    """Where `tfsync resume` restarts: the newest checkpoint of ``run_dir`` that reads
    back whole, and ``[(path, why)]`` of the newer ones it skipped (a damaged file)."""
    return newest_intact(checkpoint_events(run_dir), path=lambda e: e["path"])


PREVIOUS_OUTPUTS = ("metrics.jsonl", "metrics.discarded.jsonl", "summary.json", "tb", "checkpoints", "logs",
                    "report.html", "report_files")


def finished(run_dir: str, epochs: float) -> dict | None:
    """The summary of the run in ``run_dir`` where it trained its whole workload and a
    workload of ``epochs`` would add nothing (not stopped, not failed); else None."""
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        wanted = round(epochs * summary["meta"]["train_examples"])
        done = summary["samples"] >= max(summary["workload_samples"], wanted)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return summary if done and not summary.get("stopped") and "failed" not in summary else None


def set_aside_previous_run(run_dir: str) -> str | None:
    """Move an earlier run's outputs in ``run_dir`` to ``run_dir/previous/<UTC time>/`` so a
    new run starts clean and nothing is lost; returns where they went (None: nothing there).
    `tfsync resume` does not call this: it continues the run it finds."""
    found = [n for n in PREVIOUS_OUTPUTS if os.path.exists(os.path.join(run_dir, n))]
    if not found:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = os.path.join(run_dir, "previous", stamp)
    n = 1
    while os.path.exists(dest):  # two runs within a second
        dest, n = os.path.join(run_dir, "previous", f"{stamp}-{n}"), n + 1
    os.makedirs(dest)
    for name in found:
        os.replace(os.path.join(run_dir, name), os.path.join(dest, name))
    return dest
