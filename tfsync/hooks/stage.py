"""A job's files on this node (NodeHook.StageFile): data sent by the coordinator, so the
nodes need no shared filesystem.

Each job has a stage directory, ``<hook dir>/stage/<stage_id>/``; its tasks run there
(``StartTasks.stage_id``), so a relative path such as ``data/train_x.bin`` in a cluster's
dataset graph reaches the staged copy on every node. A file is written beside its final
name and renamed there only once its size and SHA-256 match what the first chunk
announced; a file already there with the same digest is kept and nothing is read.
Staged files stay until the hook's directory is removed (a cache for the job's next
generation: a restart switch or a recovery stages nothing again).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil

from tfsync.base import safefile

from tfsync.base.exits import shown
from .tasks import TaskLaunchError, TaskRequestError, check_job_id

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
MAX_NAME = 255
SPARE_BYTES = 64 * 2**20     # what staging leaves free on the hook's disk


class Stage:
    def __init__(self, root: str):
        self.root = root

    def dir(self, stage_id: str) -> str:
        """The stage directory of ``stage_id`` (made if missing)."""
        check_job_id(stage_id)
        return safefile.make_dir(os.path.join(safefile.make_dir(self.root, 0o700), stage_id), 0o700)

    def receive(self, chunks) -> tuple[bool, int]:
        """Keep the file the chunks carry; returns (it was there already, its size)."""
        chunks = iter(chunks)
        first = next(chunks, None)
        if first is None or not first.name:
            raise TaskRequestError("StageFile: the first chunk must name the file (stage_id, name, sha256, size)")
        name, size, digest = first.name, first.size, first.sha256.lower()
        if len(name) > MAX_NAME or not _NAME.fullmatch(name):
            raise TaskRequestError(f"StageFile: name {shown(name)} is not a relative path of letters, digits, "
                                   f"'.', '_' and '-' (no '..', at most {MAX_NAME} characters)")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise TaskRequestError(f"StageFile: sha256 {shown(first.sha256)} is not 64 hex digits")
        if size < 0:
            raise TaskRequestError(f"StageFile: size {size} is negative")
        folder = self.dir(first.stage_id)
        path = os.path.join(folder, name)
        if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) == size \
                and safefile.sha256(path) == digest:
            return True, size
        parent = os.path.dirname(path)
        os.makedirs(parent, mode=0o700, exist_ok=True)
        if not os.path.realpath(parent).startswith(os.path.realpath(folder)):
            raise safefile.UnsafePathError(f"StageFile: {shown(name)} leads out of the stage directory (a link)")
        free = shutil.disk_usage(parent).free
        if size > free - SPARE_BYTES:
            raise TaskLaunchError(f"StageFile: {name} has {size} bytes; this node has {free} free "
                                  f"(staging leaves {SPARE_BYTES // 2**20} MiB)")
        h, got = hashlib.sha256(), 0
        with safefile.replacing(path, mode=0o600, binary=True) as f:
            for chunk in _data(first, chunks):
                got += len(chunk)
                if got > size:
                    raise TaskRequestError(f"StageFile: {name} is longer than the {size} bytes announced")
                h.update(chunk)
                f.write(chunk)
            if got != size or h.hexdigest() != digest:
                raise TaskRequestError(f"StageFile: {name} arrived with {got} bytes and SHA-256 {h.hexdigest()[:12]}; "
                                       f"announced {size} bytes, {digest[:12]}: not kept")
        return False, size


def _data(first, chunks):
    if first.data:
        yield first.data
    for chunk in chunks:
        yield chunk.data
