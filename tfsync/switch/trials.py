"""Trial results of the switch-point search and where they are kept, so that a search can
be resumed: a store maps (job signature, switch fraction, run index) to a TrialResult.

A store is any object with ``get(key) -> TrialResult | None`` and ``put(key, result)``.
Here: :class:`MemoryTrials`, :class:`JsonTrials` (one JSON file, rewritten atomically on
every put) and :class:`JobStoreTrials`, an adapter to the manager's SQLite job store
(``tfsync.manager.store.Store``): a trial is a run of kind "trial" whose config carries
``{"search": {"fraction": f, "run": r}}`` and whose results hold the trial's fields;
``Store.runs_by_signature`` finds them again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field

from ..base import safefile

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialResult:
    """One training run with a switch point: its converged test accuracy (see
    ``tfsync.base.curves.converged_accuracy``) and its training time in seconds."""

    converged_accuracy: float
    time: float
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if not math.isfinite(self.converged_accuracy):
            raise ValueError(f"converged_accuracy = {self.converged_accuracy!r}: must be finite; "
                             "report a diverged run as accuracy 0")
        if not self.time >= 0:
            raise ValueError(f"trial time {self.time!r}: must be >= 0 seconds")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrialResult":
        return cls(float(d["converged_accuracy"]), float(d["time"]), dict(d.get("extra") or {}))


@dataclass(frozen=True)
class TrialKey:
    signature: str
    fraction: float  # of the workload trained with BSP before the switch to ASP
    run: int  # 0 .. R-1

    def __post_init__(self):
        object.__setattr__(self, "fraction", round(float(self.fraction), 9))  # one key per setting

    def text(self) -> str:
        return f"{self.signature}|{self.fraction!r}|{self.run}"


def job_signature(model: str, data: str, cluster_size: int, hyper: dict | None = None) -> str:
    """A stable 16-hex-digit hash of what makes two jobs the same recurring job."""
    payload = json.dumps({"model": str(model), "data": str(data), "cluster_size": int(cluster_size),
                          "hyper": hyper or {}}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# Keys of a job config that do not make another recurring job: how often to checkpoint,
# evaluate or time out, how a switch is carried out, and what the search varies or a run
# reacts to (the switch point, the straggler policy, injected stragglers).
NOT_IN_SIGNATURE = {"job": "*", "model": "*", "data": ("path",), "protocol": "*", "inject": "*",
                    "cluster": ("ps", "host"),
                    "train": ("checkpoint_every", "eval_every", "eval_samples", "timeout_s", "metrics", "ps_rounds"),
                    "switch": ("method", "point", "stragglers", "straggler_window_s", "straggler_k",
                               "readmit_after_s")}


def config_signature(config: dict) -> str:
    """The recurring-job signature of a job config (``JobConfig.to_dict()``): model, data,
    cluster size and hyper-parameters (Sync-Switch §IV-B1: a job that recurs "with the same
    configuration"); see ``NOT_IN_SIGNATURE`` for what is left out."""
    hyper = {sec: {k: v for k, v in values.items() if k not in NOT_IN_SIGNATURE.get(sec, ())}
             for sec, values in config.items() if NOT_IN_SIGNATURE.get(sec) != "*" and isinstance(values, dict)}
    data = hyper.pop("data", {})
    workers = hyper.pop("cluster", {}).get("workers", 0)
    model = config.get("model") or {}
    # a bundled model by its name (as before); a user's by its function and arguments
    model = model.get("name") if set(model) <= {"name"} else json.dumps(model, sort_keys=True)
    return job_signature(model, data, workers, hyper)


class MemoryTrials:
    def __init__(self):
        self.data: dict[TrialKey, TrialResult] = {}

    def get(self, key: TrialKey) -> TrialResult | None:
        return self.data.get(key)

    def put(self, key: TrialKey, result: TrialResult) -> None:
        self.data[key] = result


class JsonTrials:
    """Trials in one JSON file ``{"sig|fraction|run": {...}}``."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.data: dict[str, dict] = {}
        if os.path.exists(self.path):
            try:
                with open(self.path) as f:
                    self.data = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise ValueError(f"trial file {self.path!r} is unreadable ({e}); expected JSON written by "
                                 "JsonTrials; move it away to start a new search") from None

    def get(self, key: TrialKey) -> TrialResult | None:
        d = self.data.get(key.text())
        return None if d is None else TrialResult.from_dict(d)

    def put(self, key: TrialKey, result: TrialResult) -> None:
        self.data[key.text()] = result.to_dict()
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        # a crash leaves the old file or the new one, never half
        safefile.write(self.path, json.dumps(self.data, indent=1, sort_keys=True))


class JobStoreTrials:
    """Adapter to the manager's job store: ``JobStoreTrials(store, job_id)``. Reads trials
    of every job with the key's signature (a recurring job reuses earlier searches);
    writes new trials as runs of ``job_id``."""

    def __init__(self, store, job_id: str):
        self.store, self.job_id = store, job_id

    def get(self, key: TrialKey) -> TrialResult | None:
        for run, results in reversed(self.store.runs_by_signature(key.signature)):
            search = (run.config or {}).get("search") or {}
            if (run.kind == "trial" and "converged_accuracy" in results
                    and TrialKey(key.signature, search.get("fraction", -1), search.get("run", -1)) == key):
                return TrialResult.from_dict(results)
        return None

    def put(self, key: TrialKey, result: TrialResult) -> None:
        config = dict(self.store.job(self.job_id).config)
        config["search"] = {"fraction": key.fraction, "run": key.run}
        run = self.store.start_run(self.job_id, kind="trial", config=config)
        for name, value in result.to_dict().items():
            self.store.set_result(run.id, name, value)
