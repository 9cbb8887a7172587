"""TF_CONFIG, the environment variable that Kubernetes' TFJob operator (and Slurm
scripts, by hand) set for every task of a TensorFlow job: the cluster spec and which task
this process is. tfsync reads it where the platform starts the tasks: each PS and worker
runs ``python -m tfsync.engine.server`` (its task from TF_CONFIG), and the chief runs
``tfsync run JOB`` (the engine connects to the tasks TF_CONFIG lists instead of starting
its own). :func:`generate` writes the TF_CONFIG of every task for a set of addresses.

Standard library only (base layer).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from .exits import BadInput

VARIABLE = "TF_CONFIG"
JOBS = ("chief", "ps", "worker")


class TFConfigError(BadInput, ValueError):
    """TF_CONFIG is set but cannot be used; the message names the field."""


@dataclass(frozen=True)
class TFConfig:
    spec: dict          # {"chief": [addr], "ps": [...], "worker": [...]}
    task_type: str
    task_index: int


def read(env=os.environ) -> TFConfig | None:
    """This process's TF_CONFIG (None when it is not set)."""
    raw = env.get(VARIABLE, "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TFConfigError(f"{VARIABLE} is not JSON: {e.msg} at character {e.pos}") from None
    if not isinstance(value, dict) or not isinstance(value.get("cluster"), dict):
        raise TFConfigError(f"{VARIABLE}.cluster: expected an object of job -> [\"host:port\", ...]")
    spec = {}
    for job, addresses in value["cluster"].items():
        if job not in JOBS:
            raise TFConfigError(f"{VARIABLE}.cluster.{job}: tfsync's jobs are {', '.join(JOBS)} (an evaluator "
                                "runs in the chief)")
        if not isinstance(addresses, list) or not all(
                isinstance(a, str) and a.rpartition(":")[0] and a.rpartition(":")[2].isdigit() for a in addresses):
            raise TFConfigError(f"{VARIABLE}.cluster.{job}: expected a list of \"host:port\"")
        spec[job] = list(addresses)
    for job, count in (("chief", (1,)), ("ps", None), ("worker", None)):
        n = len(spec.get(job, ()))
        if (count is not None and n not in count) or n < 1:
            raise TFConfigError(f"{VARIABLE}.cluster.{job}: {n} listed; tfsync needs "
                                + ("exactly 1 (the coordinator)" if count else "at least 1"))
    task = value.get("task")
    if not isinstance(task, dict) or not isinstance(task.get("type"), str) or task["type"] not in spec:
        raise TFConfigError(f"{VARIABLE}.task.type: expected one of {', '.join(spec)}, got "
                            f"{None if not isinstance(task, dict) else task.get('type')!r}")
    index = task.get("index", 0)
    if not isinstance(index, int) or not 0 <= index < len(spec[task["type"]]):
        raise TFConfigError(f"{VARIABLE}.task.index: {index!r} is not a {task['type']} of the cluster "
                            f"(0..{len(spec[task['type']]) - 1})")
    return TFConfig(spec, task["type"], index)


def generate(spec: dict) -> dict[tuple[str, int], str]:
    """``{(job, index): TF_CONFIG}`` for every task of ``spec`` (chief, ps, worker)."""
    ordered = {job: list(spec[job]) for job in JOBS if job in spec}
    return {(job, i): json.dumps({"cluster": ordered, "task": {"type": job, "index": i}}, separators=(",", ":"))
            for job, addresses in ordered.items() for i in range(len(addresses))}
