"""Where a user's tfsync state lives: ``$TFSYNC_HOME`` (default ``~/.tfsync``) holds the
job store every command shares (``jobs.db``) and the standalone manager's token. Kept
apart from the embedded manager so that commands which only read the store (`tfsync
jobs`, `runs`, `status`) start without importing TensorFlow."""

from __future__ import annotations

import os
from pathlib import Path

ENV_HOME = "TFSYNC_HOME"


def home() -> Path:
    """``$TFSYNC_HOME``, or ``~/.tfsync``."""
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".tfsync").expanduser()


def default_store() -> str:
    """The job store every command uses unless told otherwise: ``$TFSYNC_HOME/jobs.db``."""
    return str(home() / "jobs.db")
