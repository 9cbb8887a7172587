"""A hook restarted in place (SIGHUP: it re-executes itself, same process id) keeps its
tasks: before the exec it writes its task table beside its logs, and the new program
adopts the tasks listed there that still run. They are still its children (an exec keeps
them; a forked task's fork server ends at the exec, and the hook, a subreaper, becomes its
parent) and their ``--parent-pid`` still names it, so nothing about them changes; the
coordinator sees their ports answer meanwhile (tfsync.engine.hook_cluster) and goes on.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import threading

import psutil

from tfsync.base import forkserver, safefile, taskcmd

logger = logging.getLogger(__name__)

ENV = "TFSYNC_HOOK_ADOPT"   # set across the exec: the task table to adopt
FIELDS = ("job_id", "job", "index", "spec_json", "env", "address", "log_path", "netns", "cwd", "started",
          "restarts", "sources", "ready")


class Adopted(forkserver.PolledProcess):
    """A child this program did not start (its parent before the exec did), as the
    supervisor uses a ``subprocess.Popen``."""

    def __init__(self, pid: int, created: float):
        self.pid, self.created, self.returncode = pid, created, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self._waitpid()
            except ChildProcessError:   # reaped already, or not ours yet (its fork server is ending)
                if not self._same():
                    self.returncode = -1
        return self.returncode

    def _same(self) -> bool:
        """Whether the process that has its pid runs and is the one adopted (not a new one
        that reuses the pid)."""
        try:
            p = psutil.Process(self.pid)
            return p.status() != psutil.STATUS_ZOMBIE and abs(p.create_time() - self.created) < 0.01
        except psutil.Error:
            return False


def become_subreaper() -> None:
    """Make this process the parent of its descendants that lose theirs (Linux; kept
    across exec): a task forked by a fork server (``tfsync.base.forkserver``) that ends
    when this process re-executes itself becomes its child, which it adopts."""
    if not taskcmd.prctl(taskcmd.PR_SET_CHILD_SUBREAPER, 1):
        logger.warning("tfsync hook: cannot become a subreaper (%s): forked tasks end at the restart",
                       os.strerror(ctypes.get_errno()))


def reap_leftovers(keep) -> None:
    """Reap, as they end, this process's children other than ``keep`` (pids): after the
    exec, what the program before it started and no one else waits for (its fork
    servers)."""
    for child in psutil.Process().children():
        if child.pid not in keep:
            threading.Thread(target=_reap, args=(child.pid,), name="tfsync-reap", daemon=True).start()


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def save(path: str, tasks) -> str:
    """Write the live tasks' table (JSON) to ``path``."""
    rows = []
    for t in tasks:
        with contextlib.suppress(psutil.Error):   # ended meanwhile: not handed over
            if t.proc.poll() is None:
                rows.append({**{k: getattr(t, k) for k in FIELDS}, "pid": t.proc.pid,
                             "created": psutil.Process(t.proc.pid).create_time()})
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
