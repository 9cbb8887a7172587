"""The command line and environment of one TF task process (``python -m
tfsync.engine.server``), built here once for both launchers: the engine's local cluster
(``tfsync.engine.cluster``) and the node hook (``tfsync.hooks.tasks``).

TF-free and tfsync-free (standard library only), so the lowest layer can import it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import threading
import time

# The program of a task: the TF server of one PS or worker. Launchers append the
# arguments ``task_command`` builds (the hook's tests run a stand-in program instead).
SERVER = (sys.executable, "-m", "tfsync.engine.server")
# The directory that holds the tfsync package: put first on a task's PYTHONPATH, so the
# task imports the same tfsync as its launcher.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def task_command(spec_json: str, job: str, index: int, program=SERVER) -> list[str]:
    """``program --cluster SPEC --job JOB --index I --parent-pid PID``: the task of
    ``job``:``index`` in the cluster spec ``spec_json``; it exits when this process (its
    launcher, ``PID``) is gone."""
    return [*program, "--cluster", spec_json, "--job", job, "--index", str(index),
            "--parent-pid", str(os.getpid())]


_SCOPED: dict[str, tuple[int, str | None]] = {}   # scoped_env's variables: (depth, the value before)
_scoped_lock = threading.Lock()


@contextlib.contextmanager
def scoped_env(name: str, value: str, default: str):
    """``name=value`` in this process's environment for the ``with`` block (for a library
    that reads it there, from other threads too); tasks started meanwhile get the value
    from before. Where it had none, it is ``default`` (the library's) afterwards: a
    variable is never removed while other threads may read the environment."""
    with _scoped_lock:
        depth, old = _SCOPED.get(name, (0, os.environ.get(name)))
        _SCOPED[name] = (depth + 1, old)
        os.environ[name] = value
    try:
        yield
    finally:
        with _scoped_lock:
            depth, old = _SCOPED[name]
            if depth == 1:
                os.environ[name] = default if old is None else old
                del _SCOPED[name]
            else:
                _SCOPED[name] = (depth - 1, old)


def task_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a task: TF's info logs off, no GPU, no TF_CONFIG
    (the spec is on the command line), ``extra`` added, tfsync first on PYTHONPATH."""
    with _scoped_lock:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        for name, (_, old) in _SCOPED.items():
            if old is None:
                env.pop(name, None)
            else:
                env[name] = old
    env.pop("TF_CONFIG", None)
    env.update(extra or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PACKAGE_ROOT, env.get("PYTHONPATH")]))
    return env


def exit_with_parent(parents, interval: float = 0.5) -> None:
    """Exit as soon as this process's parent is none of ``parents`` (a pid or several):
    the launcher is gone and this process was handed to another."""
    parents = {parents} if isinstance(parents, int) else set(parents)

    def watch():
        while True:
            if os.getppid() not in parents:
                os._exit(0)
            time.sleep(interval)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


PR_SET_NAME, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 15, 4, 36   # prctl(2)
_NAME = re.compile(r"tfsync-(ps|worker|p|w)(\d+)")


def prctl(option: int, value) -> bool:
    """prctl(2) on this process (Linux); False where it failed or there is none."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def process_name(job: str, index: int) -> str:
    """What ``ps`` and ``top`` show for task ``job``:``index``: ``tfsync-ps0``,
    ``tfsync-worker1`` (``tfsync-w100`` where that is over Linux's 15 characters)."""
    name = f"tfsync-{job}{index}"
    return name if len(name) <= 15 else f"tfsync-{job[0]}{index}"


def task_of_name(name: str) -> tuple[str, int] | None:
    """``(job, index)`` of a task process named by :func:`process_name`; None for any
    other process."""
    m = _NAME.fullmatch(name)
    return ({"p": "ps", "w": "worker"}.get(m.group(1), m.group(1)), int(m.group(2))) if m else None
