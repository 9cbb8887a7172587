"""The manager's view of node resources: hooks report samples (``ReportResources``), the
board keeps the latest per node and writes them to the job store in one transaction once
``flush_interval`` seconds have passed (a report that finds the interval over writes every
node reported since the last write); ``flush()`` writes the rest, at the manager's end.

The board is the manager's ReportResources / StreamReportResources; the rest of the
Manager service is added around it.
"""

from __future__ import annotations

import logging
import math
import threading
import time

import grpc

from tfsync.api.v1 import common_pb2, manager_pb2, manager_pb2_grpc
from tfsync.manager.store import ResourceRecord, Store, StoreError

logger = logging.getLogger(__name__)


MAX_NAME = 256  # characters of a node name or job id in a sample


def sample_problem(sample: common_pb2.ResourceSample) -> str | None:
    """Why the manager refuses a resource sample (None: it is storable)."""
    if not sample.node:
        return "ResourceSample.node is empty; expected the reporting node's name"
    if len(sample.node) > MAX_NAME or len(sample.job_id) > MAX_NAME:
        return f"ResourceSample.node and .job_id: expected at most {MAX_NAME} characters each"
    for name in ("time", "cpu_percent", "memory_percent"):
        value = getattr(sample, name)
        if not (math.isfinite(value) and value >= 0):
            return f"ResourceSample.{name} {value}: expected a finite number >= 0"
    for i, p in enumerate(sample.processes):
        if not (math.isfinite(p.cpu_percent) and p.cpu_percent >= 0):
            return f"ResourceSample.processes[{i}].cpu_percent {p.cpu_percent}: expected a finite number >= 0"
    return None


def _record(sample: common_pb2.ResourceSample) -> ResourceRecord:
    procs = tuple({"job_id": p.job_id, "task": f"{p.task.job}:{p.task.index}", "pid": p.pid, "alive": p.alive,
                   "cpu_percent": p.cpu_percent, "rss_bytes": p.rss_bytes} for p in sample.processes)
    return ResourceRecord(sample.node, sample.time, sample.job_id, sample.cpu_percent, sample.memory_percent, procs)


class ResourceBoard:
    """Latest sample per node, written to ``store`` every ``flush_interval`` seconds of
    ``clock`` (by the report that finds the interval over) and by ``flush()``."""

    def __init__(self, store: Store | None = None, flush_interval: float = 1.0, clock=time.monotonic):
        if flush_interval <= 0:
            raise ValueError(f"flush_interval must be > 0 s, got {flush_interval}")
        self.store = store
        self.flush_interval = flush_interval
        self._clock = clock
        self._latest: dict[str, common_pb2.ResourceSample] = {}
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._flushed_at = clock()
        self.flushed = 0  # records written so far

    def report(self, sample: common_pb2.ResourceSample) -> None:
        with self._lock:
            self._latest[sample.node] = sample
            self._dirty.add(sample.node)
            due = self._clock() - self._flushed_at >= self.flush_interval
        if due:
            self.flush()

    def flush(self) -> int:
        """Write the nodes that reported since the last flush; return how many. A store
        that fails is logged; those samples are dropped, the next ones written."""
        with self._lock:
            samples = [self._latest[n] for n in self._dirty]
            self._dirty.clear()
            self._flushed_at = self._clock()
        if not samples or self.store is None:
            return len(samples)
        try:
            self.store.add_resources([_record(s) for s in samples])
        except StoreError as e:
            logger.warning("%d resource samples not stored: %s", len(samples), e)
            return 0
        with self._lock:
            self.flushed += len(samples)
        return len(samples)


class ResourceReports(manager_pb2_grpc.ManagerServicer):
    """The Manager RPCs that take hooks' resource reports (others answer UNIMPLEMENTED)."""

    def __init__(self, board: ResourceBoard, interval_s: float = 1.0):
        self.board = board
        self.interval_s = interval_s

    def _take(self, request, context) -> None:
        problem = sample_problem(request.sample)
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        self.board.report(request.sample)

    def ReportResources(self, request, context):
        self._take(request, context)
        return manager_pb2.ReportResourcesResponse(interval_s=self.interval_s)

    def StreamReportResources(self, request_iterator, context):
        for request in request_iterator:
            self._take(request, context)
        return manager_pb2.ReportResourcesResponse(interval_s=self.interval_s)

