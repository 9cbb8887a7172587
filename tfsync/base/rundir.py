"""A run directory: resolved once, private to its owner, held by one run at a time.

- **Where**: ``job.run_dir`` is made absolute once (``..`` resolved as written). It is
  refused, in one line naming the field, when the path or any directory it names is a
  symbolic link (a link planted at ``runs/x`` would send checkpoints, tokens and records
  wherever it points: give the link's target instead), or when it lies in a system
  directory (``/etc``, ``/usr``, ``/bin``, ``/sbin``, ``/lib``, ``/boot``, ``/proc``,
  ``/sys``, ``/dev``, or ``/`` itself).
- **Private**: the directory is made ``0700`` and what the run writes there ``0600``
  whatever the umask (:func:`private` sets the process's umask to ``077`` for the run and
  closes what an earlier run left open), so no other local user reads the model, the
  data records, the logs or the token. A directory of another user's, or inside a folder
  every user may write (without the sticky bit of ``/tmp``), is refused in one line:
  its owner could rename ``control/`` or put a link in place of ``checkpoints``.
- **One run at a time**: ``<run_dir>/.tfsync.lock`` is held (``flock``) for the whole of
  a ``tfsync run``, ``resume`` or trial of ``tfsync search``; a second one on the same
  directory is refused with a line naming the first (its pid and start time).
  The kernel releases the lock when the holder dies, however it dies.

Standard library only (the lowest layer).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from . import safefile
from .exits import BadInput, TfsyncError

FIELD = "job.run_dir"
LOCK = ".tfsync.lock"
SYSTEM_DIRS = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/boot", "/proc", "/sys", "/dev")


class RunDirError(BadInput):
    """A run directory tfsync will not use: a link, a system directory, another user's (exit 2)."""


class RunDirInUse(TfsyncError):
    """A run directory another tfsync process holds (exit 1): it may be free later."""


def resolve(path: str, field: str = FIELD) -> str:
    """``path`` made absolute, or RunDirError: it passes through a link, or it is a
    system directory or inside one."""
    if not path or "\0" in path:
        raise RunDirError(f"{field}: {path!r} is not a directory path")
    absolute = os.path.abspath(os.path.expanduser(path))
    given = os.path.normpath(os.path.expanduser(path))
    start = "/" if os.path.isabs(given) else os.getcwd()   # the links the user's own path names
    walked = start
    for part in given.split(os.sep):
        if part in ("", "."):
            continue
        walked = os.path.normpath(os.path.join(walked, part))
        if os.path.islink(walked):
            raise RunDirError(f"{field}: {walked} is a symbolic link (to {os.readlink(walked)}); "
                              "tfsync does not follow links to a run directory: give its target")
    if absolute == "/" or any(absolute == d or absolute.startswith(d + "/") for d in SYSTEM_DIRS):
        raise RunDirError(f"{field}: {absolute} is a system directory or inside one; choose a run directory of "
                          "your own (default: runs/<job name>)")
    return absolute


def private(run_dir: str) -> None:
    """From now on this process writes files 0600 and directories 0700 (umask 077, for
    the tasks it starts too); ``run_dir`` is made, and what it holds already is closed
    to others (files and directories of this user, never through a link)."""
    os.umask(0o077)
    problem = next((f"{p} is writable by every user" for p in _parents(run_dir)
                    if os.path.isdir(p) and safefile.others_may_replace(os.stat(p))), None)
    if problem is None:
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        problem = safefile.not_private(run_dir, os.lstat(run_dir))
    if problem:
        raise RunDirError(f"{FIELD}: {problem}; choose a run directory of your own (default: runs/<job name>)")
    me = os.geteuid()
    for top, dirs, files in os.walk(run_dir):
        for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
            st = os.lstat(name)
            if st.st_uid == me and not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
                keep = 0o700 if stat.S_ISDIR(st.st_mode) else stat.S_IMODE(st.st_mode) & 0o700
                os.chmod(name, keep)


def _parents(path: str):
    while os.path.dirname(path) != path:
        path = os.path.dirname(path)
        yield path


@contextlib.contextmanager
def claim(path: str, what: str):
    """``path`` resolved (:func:`resolve`), made private (:func:`private`) and held by
    ``what`` for the block (:class:`RunLock`); yields the absolute path."""
    run_dir = resolve(path)
    private(run_dir)
    with RunLock(run_dir, what):
        yield run_dir


class RunLock:
    """``<run_dir>/.tfsync.lock`` held from :meth:`acquire` to :meth:`release` (or exit)."""

    def __init__(self, run_dir: str, what: str):
        self.path, self.what, self.fd = os.path.join(run_dir, LOCK), what, None

    def acquire(self) -> "RunLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _holder(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise RunDirInUse(f"{os.path.dirname(self.path)} is in use by {holder}; wait for it to end, "
                              f"or give this run another {FIELD}") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "what": self.what, "started": time.time()}).encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)   # the lock goes with the descriptor; the file stays (harmless)
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["started"])))
        return f"{info['what']} (pid {int(info['pid'])}, started {when})"
    except (ValueError, KeyError, TypeError, OSError):
        return "another tfsync process"
