"""Batch sizers that need no prediction. LB-BSP's adaptive sizers live in tfsync.batching."""

from __future__ import annotations

from typing import Sequence

from ..base import plainstate
from .base import BatchSizer, ClusterView, check_resize_count


class FixedSizer(BatchSizer):
    """A fixed batch size per worker, e.g. ``FixedSizer([48, 16])``."""

    def __init__(self, sizes: Sequence[int]):
        sizes = [int(s) for s in sizes]
        if not sizes or min(sizes) < 1:
            raise ValueError(f"FixedSizer needs one batch size >= 1 per worker, got {list(sizes)!r}")
        super().__init__(max(sizes))
        self.per_worker = tuple(sizes)

    def size(self, worker: int, view: ClusterView) -> int:
        if worker >= len(self.per_worker):
            raise ValueError(
                f"FixedSizer has {len(self.per_worker)} sizes but worker {worker} asked; "
                "give one batch size per worker"
            )
        return self.per_worker[worker]

    def prepare_resize(self, workers: int) -> plainstate.Apply:
        """Workers >= ``workers`` lose their sizes; prior: a new worker gets the mean of
        the sizes set before, rounded half up (the round total grows by one mean share)."""
        check_resize_count(workers, "FixedSizer")
        old = self.per_worker
        prior = max(1, (2 * sum(old) + len(old)) // (2 * len(old)))  # the mean, half up, exactly
        sizes = old[:workers] + (prior,) * (workers - len(old))

        def apply():
            self.per_worker, self.batch_size = sizes, max(sizes)
        return apply

    def describe(self) -> dict:
        return {"name": "FixedSizer", "batch_sizes": list(self.per_worker)}
