"""What a run writes to its directory: ``metrics.jsonl`` (one line per push),
TensorBoard scalars (``tb/``) and ``summary.json`` at the end."""

from __future__ import annotations

import json
import os
import time

import tensorflow as tf


class RunRecorder:
    def __init__(self, run_dir: str, tensorboard: bool = True):
        self.run_dir = run_dir
        os.makedirs(run_dir, exist_ok=True)
        self._metrics = open(os.path.join(run_dir, "metrics.jsonl"), "a", buffering=1 << 16)
        self._tb = tf.summary.create_file_writer(os.path.join(run_dir, "tb")) if tensorboard else None

    def push(self, record: dict) -> None:
        self._metrics.write(json.dumps(record) + "\n")
        if self._tb is not None:
            with self._tb.as_default(step=record["pushes"]):
                w = record["worker"]
                tf.summary.scalar(f"loss/worker{w}", record["loss"])
                tf.summary.scalar(f"samples_per_s/worker{w}", record["samples_per_s"])
                tf.summary.scalar(f"batch_size/worker{w}", record["batch_size"])

    def event(self, kind: str, **fields) -> None:
        self._metrics.write(json.dumps({"event": kind, "time": time.time(), **fields}) + "\n")
        self._metrics.flush()

    def scalar(self, name: str, value: float, step: int) -> None:
        if self._tb is not None:
            with self._tb.as_default(step=step):
                tf.summary.scalar(name, value)

    def summary(self, data: dict) -> str:
        path = os.path.join(self.run_dir, "summary.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, path)
        return path

    def close(self) -> None:
        self._metrics.close()
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
