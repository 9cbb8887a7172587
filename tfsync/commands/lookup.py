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
    """The run directory of ``target``: a job file's run_dir, else ``target`` itself."""
    path = Path(target)
    if path.is_file():
        from tfsync.job.config import ConfigError, load_job
        try:
            return Path(load_job(str(path)).job.run_dir)
        except ConfigError as e:
            raise ControlError(str(e)) from None
    return path


def locate(target: str) -> tuple[dict, str]:
    """(manager.json contents, token) of the job at ``target`` (job file or run dir)."""
    from tfsync.api.auth import read_token

    path = run_dir_of(target)
    info = path / "control" / "manager.json"
    if not info.is_file():
        raise NotRunning(f"{target}: no running job there (no {info}); start it with `tfsync run JOB`")
    try:
        found = json.loads(info.read_text())
        if not isinstance(found, dict) or not {"address", "job_id"} <= found.keys():
            raise ValueError("no address or job_id")
    except ValueError:
        raise ControlError(f"{info} is damaged (expected the JSON the job's manager wrote, with its address and "
                           "job_id); if the job still runs, restart it with `tfsync resume`") from None
    return found, read_token(path / "control" / "token")
