"""Batch sizers that need no prediction. LB-BSP's adaptive sizers live in tfsync.batching."""

from __future__ import annotations

from typing import Sequence

from .base import BatchSizer, ClusterView


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

    def describe(self) -> dict:
        return {"name": "FixedSizer", "batch_sizes": list(self.per_worker)}
