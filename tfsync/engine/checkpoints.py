"""A run's checkpoints, kept as ``tf.train.CheckpointManager`` keeps them: the newest
``keep`` in ``run_dir/checkpoints/ckpt-<updates>``, and the ``checkpoint`` state file that
``tf.train.latest_checkpoint`` reads. Written with the generation's save function, traced
once per generation (``Generation.save``), not the manager's, which traces one per save.

Beside each, ``<prefix>.tfsync.json``: what the TF checkpoint cannot hold:
the ledger and the running policy's learned state (``Loop.save_state``), plain JSON (a
shared run directory must never make loading run code).
"""

from __future__ import annotations

import glob
import json
import os
import shutil

import tensorflow as tf

from ..base import nospace, safefile


STATE = ".tfsync.json"


def damage(prefix: str) -> str | None:
    """Why checkpoint ``prefix`` cannot be restored (None: it is intact): its index or
    data files are missing or unreadable, a tensor fails its checksum when read, or the
    state beside it is not JSON. Reads the whole checkpoint once."""
    if not os.path.exists(prefix + ".index") or not glob.glob(glob.escape(prefix) + ".data-*"):
        return "its .index or .data files are missing"
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
        load_state(prefix)
    except (tf.errors.OpError, OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"{type(e).__name__}: {first[:200]}"
    return None


def newest_intact(candidates: list, path=lambda c: c) -> tuple:
    """The newest of ``candidates`` (oldest first) that is intact, and ``[(prefix, why)]``
    for the newer ones skipped; ``(None, skipped)`` when none is."""
    skipped = []
    for c in reversed(candidates):
        why = damage(path(c))
        if why is None:
            return c, skipped
        skipped.append((path(c), why))
    return None, skipped


def load_state(prefix: str) -> dict | None:
    """The state saved beside checkpoint ``prefix`` (None: none there, as from an older tfsync)."""
    try:
        with open(prefix + STATE) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _files(prefix: str) -> list[str]:
    """The files of checkpoint ``prefix``: its index, data shards and the state beside it."""
    return glob.glob(glob.escape(prefix) + ".index") + glob.glob(glob.escape(prefix) + ".data-*") \
        + glob.glob(glob.escape(prefix) + STATE)


class CheckpointDir:
    def __init__(self, directory: str, keep: int = 3):
        self.directory, self.keep = directory, keep
        state = tf.train.get_checkpoint_state(directory) if os.path.isdir(directory) else None
        self.kept = list(state.all_model_checkpoint_paths) if state else []   # oldest first

    def size_hint(self, generation) -> int:
        """About what the next checkpoint takes: the newest one's files, or (none yet) the
        model's weights."""
        files = _files(self.kept[-1]) if self.kept else []
        if files:
            return sum(os.path.getsize(f) for f in files if os.path.exists(f))
        return sum(v.shape.num_elements() * v.dtype.size for v in generation.model.variables)

    def save(self, generation, number: int, state: dict | None = None) -> str:
        """Checkpoint ``generation`` as ``ckpt-<number>`` and ``state`` beside it; returns its prefix."""
        text = None if state is None else json.dumps(state, allow_nan=False)   # before anything is written
        safefile.make_dir(self.directory)
        prefix = os.path.join(self.directory, f"ckpt-{number}")
        def give_back():  # a new checkpoint no list names: its space back
            for path in [] if prefix in self.kept else _files(prefix):
                os.unlink(path)

        with nospace.writing(f"checkpoint ckpt-{number}", self.directory, self.size_hint(generation)):
            try:
                generation.save(prefix)
                if text is not None:
                    safefile.write(prefix + STATE, text)
            except Exception as e:
                if nospace.is_no_space(e):   # what it wrote is useless
                    shutil.rmtree(prefix + "_temp", ignore_errors=True)
                    give_back()
                raise
        kept = ([p for p in self.kept if p != prefix] + [prefix])[-self.keep:]
        try:  # the list first: the checkpoints it named stay until it names the new one
            with nospace.writing("the checkpoint list", self.directory):
                tf.compat.v1.train.update_checkpoint_state(self.directory, prefix, all_model_checkpoint_paths=kept)
        except nospace.NoSpaceError:
            give_back()
            raise
        for old in self.kept:
            if old not in kept:
                for path in _files(old):
                    os.unlink(path)
        self.kept = kept
        return prefix
