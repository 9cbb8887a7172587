"""tfsync: synchronization protocols for TensorFlow parameter-server training.

The names below are tfsync's public API, the only ones its documentation uses; every
other module is internal and may move::

    import tfsync

    summary = tfsync.run("job.toml", ["train.epochs=2"])      # a job file, as `tfsync run` does

Each name is imported on first use, not with the package: ``import tfsync`` imports
neither NumPy nor TensorFlow (``python -m tfsync.base.isolation`` must make a user
namespace while the process has one thread, and NumPy starts more). tf_keras (Keras 2)
is the Keras that works under ParameterServerStrategy (Keras 3 rejects a dataset function
there; its maintainers do not support PS training: keras-team/keras issue 18624), so
tfsync asks TensorFlow for it before TF is imported.
"""

from __future__ import annotations

import importlib as _importlib
import os as _os

from .base.version import VERSION as _VERSION

_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = _VERSION

# public name -> the module that holds it (and its name there, where it differs)
_PUBLIC = {
    # a job file: its configuration (run: below)
    "JobConfig": "job.config", "load_job": "job.config",
    # your model on the engine (the Python API)
    "TrainSetup": "engine.generation", "Engine": "engine.engine", "Phase": "engine.phase",
    "Callback": "engine.callbacks", "as_in_fit": "engine.workload",
    "DatasetFactory": "base.pipeline", "worker_index": "base.pipeline", "load_dataset": ("base.data", "load"),
    # Keras: your own model.fit
    "local_cluster": "keras", "SyncSwitch": "keras", "TensorBoard": "keras",
    # the protocols, and the interface a protocol of your own implements
    "BSP": "policy", "ASP": "policy", "SSP": "policy", "LBBSP": "policy", "FixedSizer": "policy",
    "Policy": "policy", "Decision": "policy", "Grant": "policy", "Push": "policy", "ClusterView": "policy",
    "BatchSizer": "policy", "Option": "policy", "register": "policy",
}

__all__ = sorted([*_PUBLIC, "run"])


def run(job, overrides=(), *, data: str | None = None, progress: bool = True) -> dict:
    """Train a job as ``tfsync run JOB --set ...`` does, without its manager (no
    ``tfsync status`` / ``switch`` for this run) and without its report; returns the run's
    summary (also in ``<run_dir>/summary.json``). ``job``: a job file's path, or a
    :class:`JobConfig` (``overrides`` then refused); ``overrides``: ``"field=value"`` as
    ``--set`` takes them; ``data``: the data set's path, as ``--data``. As the command
    line: a switch point ``tfsync search`` stored for the job (``switch.point = "auto"``)
    is used, the run directory is claimed (made private, and locked while the job runs:
    another run there is refused), and a previous run's outputs in it are moved aside."""
    from .base import rundir
    from .base.progress import Progress
    from .cli.jobrun import run_job, with_run_dir
    from .cli.search import stored_switch_point
    from .engine.records import set_aside_previous_run
    from .job.config import JobConfig, load_job
    from .job.errors import ConfigError

    if isinstance(job, JobConfig):
        if overrides:
            raise ConfigError("overrides: a JobConfig is already loaded; pass the job file's path to override "
                              "its fields", "overrides")
        cfg = job
    else:
        cfg = load_job(job, [overrides] if isinstance(overrides, str) else list(overrides))
    cfg, _ = stored_switch_point(cfg)
    with rundir.claim(cfg.job.run_dir, "tfsync.run") as run_dir:
        set_aside_previous_run(run_dir)
        bar = Progress() if progress else None
        try:
            return run_job(with_run_dir(cfg, run_dir), progress=bar, data_path=data)
        finally:
            if bar:
                bar.done()


def __getattr__(name):
    where = _PUBLIC.get(name)
    if where is None:
        raise AttributeError(f"module 'tfsync' has no attribute {name!r}")
    module, attr = where if isinstance(where, tuple) else (where, name)
    value = getattr(_importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_PUBLIC])
