"""Old import paths of modules that moved, kept for code written against them.

``tfsync.data`` is now ``tfsync.base.data``, ``tfsync.config`` is ``tfsync.job.config`` and
``tfsync.workload`` is ``tfsync.engine.workload``: the folders are the layers
(docs/internals/architecture.md). Importing an old name warns once and gives the module itself, so
``from tfsync.data import load`` and ``"tfsync.workload:as_in_fit"`` in a job file still work.
"""

from __future__ import annotations

import importlib
import sys
import warnings


def moved(old: str, new: str) -> None:
    """Make module ``old`` the module ``new``, with a FutureWarning (shown by default)."""
    warnings.warn(f"{old} has moved to {new}; import it from there (the old name will be removed)",
                  FutureWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
