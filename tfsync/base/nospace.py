"""A write that fails for want of space (a full disk, a quota) reported in one line: what
was being written, where, how many bytes it needed and how many are free there, instead
of a traceback from whichever layer hit it (Python's ``OSError``, TensorFlow's
``ResourceExhaustedError`` from a checkpoint's ``SaveV2``).

Writers wrap each write in :func:`writing`; the run then stops (exit 1) with that line,
keeping what it wrote whole (``metrics.jsonl`` ends at a whole line) so that `tfsync
resume` can go on once space is freed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from .exits import TfsyncError

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# how TensorFlow's file system layer words those errors (a checkpoint written by SaveV2)
NO_SPACE_WORDS = ("No space left on device", "Disk quota exceeded")


class NoSpaceError(TfsyncError):
    """``what`` (e.g. "checkpoint ckpt-40") could not be written to ``path`` for want of
    space; ``needed``: its size in bytes when known; ``free``: bytes free there now."""

    def __init__(self, what: str, path: str, needed: int | None = None,
                 then: str = "`tfsync resume` goes on from the last checkpoint"):
        self.what, self.path, self.needed = what, os.fspath(path), needed
        self.free = free_bytes(self.path)
        need = f"it needs {size(needed)}, " if needed else ""
        free = f"{size(self.free)} free there" if self.free is not None else "free space unknown"
        super().__init__(f"disk full: cannot write {what} to {self.path} ({need}{free}); free some space "
                         f"(or set job.run_dir on another disk), then {then}")

    def then(self, step: str) -> "NoSpaceError":
        """The same failure with another next step (a job with no checkpoint yet starts again)."""
        return NoSpaceError(self.what, self.path, self.needed, step)


def is_no_space(e: BaseException) -> bool:
    """Whether ``e`` says the disk (or the user's quota) is full."""
    if isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS:
        return True
    text = getattr(e, "message", None)   # a TensorFlow OpError's; a plain exception's str
    return any(w in (text if isinstance(text, str) else str(e)) for w in NO_SPACE_WORDS)


@contextlib.contextmanager
def writing(what: str, path: str | os.PathLike, needed: int | None = None):
    """Turn a no-space failure inside the block into :class:`NoSpaceError`; anything else
    passes through unchanged."""
    try:
        yield
    except NoSpaceError:
        raise
    except Exception as e:
        if is_no_space(e):
            raise NoSpaceError(what, os.fspath(path), needed) from None
        raise


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding ``path`` (or
    its nearest existing parent); None if that cannot be read."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def size(n: int) -> str:
    """``n`` bytes for a person: 512 bytes, 31.4 KB, 2.7 MB, 1.2 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
