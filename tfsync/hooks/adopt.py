"""A hook restarted in place (SIGHUP: it re-executes itself, same process id) keeps its
tasks: before the exec it writes its task table beside its logs, and the new program
adopts the tasks listed there that still run. They are still its children (an exec keeps
them; a forked task's fork server ends at the exec, and the hook, a subreaper, becomes its
parent) and their ``--parent-pid`` still names it, so nothing about them changes; the
coordinator sees their ports answer meanwhile (tfsync.engine.hook_cluster) and goes on.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import time

from tfsync.base import safefile
from tfsync.base import forkserver

logger = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36   # prctl(2)
ENV = "TFSYNC_HOOK_ADOPT"   # set across the exec: the task table to adopt
FIELDS = ("job_id", "job", "index", "spec_json", "env", "address", "log_path", "netns", "cwd", "started",
          "restarts", "sources", "ready")


class Adopted:
    """The ``subprocess.Popen`` calls the supervisor makes, for a child this program did
    not start (its parent before the exec did)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:   # reaped already, or not ours yet (its fork server is ending)
                if not forkserver.running(self.pid):
                    self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def become_subreaper() -> None:
    """Make this process the parent of its descendants that lose theirs (Linux; kept
    across exec): a task forked by a fork server (``tfsync.base.forkserver``) that ends
    when this process re-executes itself becomes its child, which it adopts."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        logger.warning("tfsync hook: cannot become a subreaper (%s): forked tasks end at the restart",
                       os.strerror(ctypes.get_errno()))


def save(path: str, tasks) -> str:
    """Write the live tasks' table (JSON) to ``path``."""
    rows = [{**{k: getattr(t, k) for k in FIELDS}, "pid": t.proc.pid} for t in tasks if t.proc.poll() is None]
    safefile.write(path, json.dumps(rows), mode=0o600)
    return path


def load(path: str) -> list[dict]:
    """The table written before the exec (removed once read); [] when there is none."""
    try:
        with open(path) as f:
            rows = json.load(f)
    except FileNotFoundError:
        return []
    finally:
        if os.path.lexists(path):
            os.unlink(path)
    return rows
