"""Reading an accuracy curve: where it converged, and its converged accuracy (Sync-Switch
§VI-A: "not changed for more than 0.1 % for five evaluations"). Used by the engine's
run summary and by Sync-Switch's search (``tfsync.switch.search``). Standard library only.
"""

from __future__ import annotations

import logging
from typing import Sequence

logger = logging.getLogger(__name__)


def convergence_index(values: Sequence[float], tol: float = 0.001, window: int = 5) -> int | None:
    """Index of the evaluation at which the curve has converged: the last of the first
    ``window`` consecutive evaluations that lie within ``tol`` of one another
    (§VI-A: "not changed for more than 0.1 % for five evaluations"); None if never."""
    if int(window) < 2:
        raise ValueError(f"window = {window!r}: must be >= 2 evaluations")
    for i in range(len(values) - window + 1):
        chunk = values[i:i + window]
        if max(chunk) - min(chunk) <= tol:
            return i + window - 1
    return None


def converged_accuracy(curve: Sequence, tol: float = 0.001, window: int = 5) -> float:
    """Converged test accuracy of a curve of accuracies (or (step, accuracy) pairs, last
    item used). ``tol`` is absolute (0.001 = 0.1 % of accuracy). A curve that never
    converges gives its final accuracy."""
    values = [float(v[-1]) if isinstance(v, (tuple, list)) else float(v) for v in curve]
    if not values:
        raise ValueError("converged_accuracy of an empty curve; expected at least one evaluation")
    i = convergence_index(values, tol, window)
    if i is None:
        logger.debug("curve of %d evaluations never converged (tol %g, window %d); using the last",
                     len(values), tol, window)
        return values[-1]
    return values[i]
