"""The coordinator-side training hook: the engine's :class:`Controller` over gRPC.

It keeps one ``Attach`` stream to the manager. Push records go out through a bounded
queue (``record`` never blocks the engine's loop: when the manager falls behind, the
oldest records are dropped and counted); commands come back on a reader thread and wait
in a queue until the engine asks for them at its next step boundary.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time

import grpc

from tfsync.api import client
from tfsync.api.v1 import manager_pb2, manager_pb2_grpc
from tfsync.engine.commands import Command, CommandResult, Controller
from tfsync.manager.service import switch_fields

logger = logging.getLogger(__name__)

_DONE = object()


def to_command(msg: manager_pb2.Command) -> Command:
    kind = msg.WhichOneof("kind")
    if kind == "switch":
        options, method, lr_scale = switch_fields(msg.switch)
        return Command(msg.command_id, "switch", protocol=msg.switch.protocol, options=options, method=method,
                       lr_scale=lr_scale)
    if kind == "set_batch_sizes":
        return Command(msg.command_id, "batch_sizes", batch_sizes=tuple(msg.set_batch_sizes.batch_sizes))
    if kind == "checkpoint":
        return Command(msg.command_id, "checkpoint")
    if kind == "scale":
        return Command(msg.command_id, "scale", workers=msg.scale.workers)
    if kind == "join":
        return Command(msg.command_id, "join", hook=msg.join.hook_address, workers=msg.join.workers or 1)
    return Command(msg.command_id, "stop", save=msg.stop.checkpoint)


class ManagerLink(Controller):
    """``ManagerLink(channel, job_id, run_id, workers, protocol)``; ``close()`` when done."""

    def __init__(self, channel: grpc.Channel, job_id: str, run_id: int, workers: int, protocol: str = "",
                 capacity: int = 10_000):
        self.job_id, self.run_id, self.dropped = job_id, run_id, 0
        self._out: queue.Queue = queue.Queue(maxsize=capacity)
        self._in: queue.Queue = queue.Queue()
        hello = manager_pb2.CoordinatorMessage(hello=manager_pb2.AttachHello(
            job_id=job_id, run_id=run_id, workers=workers, protocol=protocol))
        self._out.put(hello)
        self._stream = client.Client(manager_pb2_grpc.ManagerStub(channel)).Attach(self._outgoing())
        self._reader = threading.Thread(target=self._read, daemon=True, name="tfsync-manager-link")
        self._reader.start()

    def _outgoing(self):
        while True:
            msg = self._out.get()
            if msg is _DONE:
                return
            yield self._step(msg) if isinstance(msg, dict) else msg

    def _step(self, record: dict) -> manager_pb2.CoordinatorMessage:
        loss = record.get("loss")
        return manager_pb2.CoordinatorMessage(step=manager_pb2.StepRecord(
            job_id=self.job_id, run_id=self.run_id, worker=record["worker"], step=record["pushes"],
            start=record["start"], end=record["end"], samples=record["samples"],
            loss=loss if loss is not None and math.isfinite(loss) else float("nan"),
            batch_size=record["batch_size"], protocol=record["protocol"]))

    def _read(self) -> None:
        try:
            for msg in self._stream:
                self._in.put(to_command(msg))
        except client.Cancelled:
            pass   # closed by this side
        except client.CallFailed as e:
            logger.warning("manager link closed: %s", e.details)

    # -- Controller ------------------------------------------------------------------------
    def record(self, record: dict) -> None:
        try:  # the message is built on gRPC's sending thread, off the engine's loop
            self._out.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def event(self, kind: str, detail: dict) -> None:
        self._out.put(manager_pb2.CoordinatorMessage(event=manager_pb2.RunEvent(
            kind=kind, time=time.time(), detail_json=json.dumps(detail, default=str))))

    def commands(self) -> list[Command]:
        out = []
        while True:
            try:
                out.append(self._in.get_nowait())
            except queue.Empty:
                return out

    def result(self, result: CommandResult) -> None:
        self._out.put(manager_pb2.CoordinatorMessage(result=manager_pb2.CommandResult(
            command_id=result.id, ok=result.ok, message=result.message, step=result.updates,
            checkpoint_path=result.checkpoint_path, invalid=result.invalid)))

    def close(self, timeout: float = 5.0) -> None:
        self._out.put(_DONE)
        self._reader.join(timeout)
        if self._reader.is_alive():
            self._stream.cancel()
