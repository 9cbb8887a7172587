"""Files tfsync writes in run and home directories, never through a symbolic link.

A run directory may sit in shared space: a link planted at ``run_dir/control/token`` must
not make the job overwrite the file it points to. So a file tfsync appends to is opened
with ``O_NOFOLLOW`` (a link there is refused with :class:`UnsafePathError`), and a whole
file is written to a new temporary file (``O_EXCL``) in the same directory and renamed
over the target, which replaces a link instead of following it; both with the mode the
file needs. Directories tfsync makes inside those directories must not be links either.

Files tfsync reads whole (job files, tokens, TLS files) are read with :func:`read_regular`: a FIFO
would block the read forever and ``/dev/zero`` fill the memory, so anything but a regular
file of bounded size is refused before a byte is read.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tempfile
from .exits import BadInput, TfsyncError


class UnsafePathError(TfsyncError, OSError):
    """A path tfsync would write through is a symbolic link."""


class NotPrivateError(BadInput, UnsafePathError):
    """A folder given to tfsync is not this user's alone (exit 2: choose another)."""


class NotRegularFileError(BadInput, ValueError):
    """A file to be read whole is not a regular file (a FIFO, device, socket or
    directory), or is larger than its limit; the message names the path."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def not_regular(path: str | os.PathLike, st: os.stat_result) -> NotRegularFileError | None:
    """The error for ``path`` (whose ``stat`` is ``st``) if it is no regular file, else None."""
    if stat.S_ISREG(st.st_mode):
        return None
    what = next((name for test, name in _KINDS if test(st.st_mode)), "a special file")
    return NotRegularFileError(f"{os.fspath(path)} is {what}, not a regular file")


def read_regular(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path`` (links followed), at most ``limit``; ``what``
    names the kind of file in the message. Anything else, or a larger file, is a
    NotRegularFileError before anything is read: stat first (a socket cannot even be
    opened), open without blocking (a FIFO put there meanwhile) and check again, then read
    at most ``limit`` + 1 bytes (a file that grows, a /proc file that says it is empty)."""
    path = os.fspath(path)
    problem = not_regular(path, os.stat(path))
    if problem:
        raise problem
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        problem = not_regular(path, st)
        if problem:
            raise problem
        data = b"" if st.st_size > limit else f.read(limit + 1)
    if max(st.st_size, len(data)) > limit:
        raise NotRegularFileError(f"{path} is larger than {_size(limit)}, the limit for a {what}")
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 2**20 and not n % 2**20 else f"{n >> 10} KiB" if not n % 1024 else f"{n} bytes"


def _refuse(path: str) -> UnsafePathError:
    return UnsafePathError(f"{path} is a symbolic link; tfsync does not write through links "
                           "(remove it, or choose another run directory)")


def not_private(path: str, st: os.stat_result) -> str | None:
    """Why the folder ``path`` (``st``: its ``lstat``) is not this user's alone to change:
    a link or not a folder, another user's, or writable by others; None where it is."""
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path} is {'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'not a folder'}"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}), who could rename or replace " \
               "what is written there"
    if others_may_replace(st):
        return f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def others_may_replace(st: os.stat_result) -> bool:
    """Whether every user may rename what a folder (``st``) holds: writable by others,
    without the sticky bit that keeps ``/tmp``'s entries their owners'."""
    return bool(st.st_mode & 0o002) and not st.st_mode & stat.S_ISVTX


def private_dir(path: str | os.PathLike) -> str:
    """The folder ``path``, made 0700 where missing; an existing one that is not this
    user's alone (:func:`not_private`) raises NotPrivateError naming it. Nothing is
    followed: a link there is refused."""
    path = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    problem = not_private(path, os.lstat(path))
    if problem:
        raise NotPrivateError(f"{problem}; tfsync keeps its files in folders of its own user's only: remove it or "
                              "choose another")
    return path


def make_dir(path: str | os.PathLike, mode: int = 0o755) -> str:
    """``os.makedirs(path)``, refusing a ``path`` that is a link."""
    path = os.fspath(path)
    if os.path.islink(path):
        raise _refuse(path)
    os.makedirs(path, mode=mode, exist_ok=True)
    return path


def open_append(path: str | os.PathLike, mode: int = 0o644, binary: bool = False, **kw):
    """``path`` opened for appending (created with ``mode``); a link there is refused."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse(path) from None
        raise
    return os.fdopen(fd, "ab" if binary else "a", **kw)


def create_new(path: str | os.PathLike, mode: int = 0o644) -> str:
    """Create the empty file ``path``, which must not exist yet (a link there is refused):
    for writers that only take a path, such as ``tf.io.TFRecordWriter``."""
    path = os.fspath(path)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode))
    except FileExistsError:
        if os.path.islink(path):
            raise _refuse(path) from None
        raise
    return path


def umask() -> int:
    """This process's umask, read without changing it (``os.umask`` sets it, for a moment,
    for every thread)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    return 0o022


@contextlib.contextmanager
def replacing(path: str | os.PathLike, mode: int = 0o644, binary: bool = False, **kw):
    """A file object whose content replaces ``path`` (a link there is replaced, never
    followed) when the block ends without an error; an error leaves ``path`` as it was.
    ``mode`` less the umask, as ``open`` would."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode & ~umask())
        with os.fdopen(fd, "wb" if binary else "w", **kw) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write(path: str | os.PathLike, data: str | bytes, mode: int = 0o644) -> str:
    """Replace ``path`` with ``data`` (see :func:`replacing`)."""
    with replacing(path, mode, binary=isinstance(data, bytes)) as f:
        f.write(data)
    return os.fspath(path)


def sha256(path: str | os.PathLike) -> str:
    """The SHA-256 (hex) of the file at ``path``, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(2**20):
            h.update(block)
    return h.hexdigest()
