"""The one format of a per-push record (a line of ``metrics.jsonl``), shared by the engine
and the simulator so that the same analysis reads both. TF-free."""

from __future__ import annotations

import json
import os
from typing import Iterable

from ..base import safefile
from .base import Push


def push_record(push: Push, *, time: float, pushes: int, updates: int, samples: int,
                protocol: str, lr: float, predicted: float | None = None) -> dict:
    """``time``: seconds since the run began; ``pushes``/``updates``/``samples``: the run's
    counters after this push; ``staleness``: updates by others while the step ran;
    ``predicted``: the speed (samples/s) the policy predicted for this step (LB-BSP), kept
    only where there is one, with ``turnaround_s``, the time the speed it learns from is
    measured over (``Push.turnaround``)."""
    record = {
        "time": round(time, 6), "pushes": pushes, "updates": updates, "samples": samples,
        "worker": push.worker, "step": push.step, "protocol": protocol, "batch_size": push.batch_size,
        "start": push.start, "end": push.end, "compute_s": round(push.compute_time, 6),
        "samples_per_s": round(push.samples_per_s, 3), "loss": push.loss, "mode": push.mode.value,
        "round": push.round, "dropped": push.dropped, "version": push.version,
        "staleness": push.pushes_during, "lr": lr,
    }
    if predicted is not None:
        record["predicted"] = round(float(predicted), 3)
        record["turnaround_s"] = round(push.turnaround, 6)
    return record


def write_jsonl(path: str, records: Iterable[dict]) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with safefile.replacing(path) as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path
