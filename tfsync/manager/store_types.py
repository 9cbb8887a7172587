"""The value objects the job store (``tfsync.manager.store``) reads and writes: plain frozen
dataclasses, JSON-able fields, no SQLite."""

from __future__ import annotations

from dataclasses import dataclass

JOB_STATES = ("submitted", "running", "stopped", "failed", "done")
RUN_KINDS = ("train", "resume", "trial")
EVENT_KINDS = ("worker_lost", "worker_rejoined", "task_restarted", "switch", "checkpoint", "scaled")
# what a run's summary leaves in the store's results, besides every test number ("test_*")
RESULT_KEYS = ("wall_s", "train_s", "pushes", "samples", "stopped")


def run_results(summary: dict) -> dict:
    """The results of a run the store keeps from its summary: the counters, wall and
    training time, and every test number (accuracy, loss, each metric: a regression job
    has no accuracy)."""
    return {k: v for k, v in summary.items()
            if k in RESULT_KEYS or (k.startswith("test_") and isinstance(v, (int, float)) and not isinstance(v, bool))}


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    signature: str
    config: dict
    state: str
    created: float
    updated: float
    run_dir: str = ""
    token_path: str = ""


@dataclass(frozen=True)
class Run:
    id: int
    job_id: str
    kind: str
    config: dict
    started: float


@dataclass(frozen=True)
class StepSummary:
    run_id: int
    step: int
    time: float                # Unix time the step ended
    samples: int               # samples of this step, all workers
    loss: float | None
    protocol: str
    batch_sizes: tuple         # per worker, in worker order


@dataclass(frozen=True)
class Event:
    run_id: int
    kind: str                  # one of EVENT_KINDS
    time: float
    detail: dict               # checkpoint: {"path": ..., "step": ...}


@dataclass(frozen=True)
class ResourceRecord:
    node: str
    time: float
    job_id: str
    cpu_percent: float
    memory_percent: float
    processes: tuple = ()      # dicts: task, pid, alive, cpu_percent, rss_bytes
