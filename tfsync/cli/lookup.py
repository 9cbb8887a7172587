"""A job named on the command line, by its job file or its run directory: where it runs
(``run_dir_of``) and how to reach its manager (``locate``: the ``control/manager.json`` and
``control/token`` it left there). `tfsync status`, `tfsync runs` and the control commands
share it."""

from __future__ import annotations

import json
from pathlib import Path

from tfsync.base.exits import BadInput


class ControlError(BadInput, RuntimeError):
    pass


class NotRunning(ControlError):
    """No manager answers for the job: none was started, or it has ended. ``info``: the
    manager.json left behind, if any (its job_id and store say where to look it up)."""

    def __init__(self, message: str, info: dict | None = None):
        super().__init__(message)
        self.info = info or {}


def run_dir_of(target: str) -> Path:
    """The run directory of ``target``: a job file's run_dir, else ``target`` itself
    (absolute: the first of :func:`run_dirs` that exists, else the first)."""
    places = run_dirs(target)
    return next((p for p in places if p.is_dir()), places[0])


def run_dirs(target: str) -> list[Path]:
    """Where the job at ``target`` may run, absolute: ``target`` itself (a run directory),
    or a job file's run_dir as `tfsync run` resolves it (against the folder it ran in:
    this one), then against the job file's folder, then the run directories of running
    jobs of that name in the job store that end so (a job file named from another folder)."""
    path = Path(target)
    if not path.is_file():
        return [path.absolute()]
    from tfsync.job.config import load_job
    from tfsync.job.errors import ConfigError
    try:
        job = load_job(str(path)).job
    except ConfigError as e:
        raise ControlError(str(e)) from None
    given = Path(job.run_dir)
    found = [given.absolute()] if given.is_absolute() else [given.absolute(), (path.parent / given).absolute()]
    if not given.is_absolute():
        found += [Path(d) for d in _stored_run_dirs(job.name) if Path(d).parts[-len(given.parts):] == given.parts]
    return list(dict.fromkeys(p.resolve() for p in found))


def _stored_run_dirs(name: str) -> list[str]:
    """Run directories of the running jobs named ``name`` in this user's job store, newest first."""
    import os

    from tfsync.manager.home import default_store
    store_path = default_store()
    if not os.path.isfile(store_path):
        return []
    from tfsync.manager.store import Store, StoreError
    try:
        with Store(store_path) as store:
            return [j.run_dir for j in store.jobs()[::-1] if j.name == name and j.state == "running" and j.run_dir]
    except (StoreError, OSError):
        return []


def locate(target: str) -> tuple[dict, str]:
    """(manager.json contents, token) of the job at ``target`` (job file or run dir)."""
    from tfsync.api.auth import read_token

    places = run_dirs(target)
    path = next((p for p in places if (p / "control" / "manager.json").is_file()), None)
    if path is None:
        looked = " nor ".join(str(p / "control" / "manager.json") for p in places)
        raise NotRunning(f"{target}: no running job there (no {looked}); start it with `tfsync run JOB`")
    info = path / "control" / "manager.json"
    try:
        found = json.loads(info.read_text())
        if not isinstance(found, dict) or not {"address", "job_id"} <= found.keys():
            raise ValueError("no address or job_id")
    except ValueError:
        raise ControlError(f"{info} is damaged (expected the JSON the job's manager wrote, with its address and "
                           "job_id); if the job still runs, restart it with `tfsync resume`") from None
    return found, read_token(path / "control" / "token")
