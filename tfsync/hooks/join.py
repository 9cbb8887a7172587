"""A node hook announces itself to a running job's manager (``tfsync hook --join``).

    message = announce("10.0.0.1:7000", manager_token, "10.0.0.5:7070", job_id="")

The manager queues a ``join`` for the job's coordinator, which checks that the hook
answers with the job's hook token, adds the node, and grows the job onto it at a step
boundary (``tfsync.engine.scaling.join``); the call answers with what was done. Only the
API's stubs are needed here: the hook knows nothing of the manager's code.
"""

from __future__ import annotations

import time
import uuid

from tfsync.api import client, transport
from tfsync.api.v1 import manager_pb2, manager_pb2_grpc
from tfsync.base.exits import BadInput, TfsyncError

REACH_S = 60.0      # how long a manager that does not answer yet is retried
ANSWER_S = 330.0    # the manager waits 5 x 60 s for a scale to be carried out, a little less than this

# what the manager answers when the job, or the manager itself, said no: the hook is not taken
# (FAILED_PRECONDITION among the Refused: the others, RESOURCE_EXHAUSTED for one, may be gRPC's own and pass)
REFUSALS = (client.InvalidArgument, client.NotFound, client.TokenRefused, client.Unsupported)


def refused(e: client.CallFailed) -> bool:
    return isinstance(e, REFUSALS) or (isinstance(e, client.Refused) and e.code == "FAILED_PRECONDITION")


class JoinRefused(BadInput):
    """The manager or the job refused the join (one line: why)."""


class JoinUnknown(TfsyncError, RuntimeError):
    """The manager was reached, but whether the job took the hook is not known (no answer
    in time, an internal error): the job may still take it."""


def announce(manager: str, token: str, hook_address: str, job_id: str = "", workers: int = 1,
             tls: transport.TlsConfig | None = None, reach_s: float = REACH_S) -> str:
    """Ask the manager at ``manager`` to let the hook at ``hook_address`` join ``job_id``
    (empty: the manager's only running job), adding ``workers``; returns the answer's line
    (which says "queued" where the job had not acted when the manager stopped waiting).
    A manager that does not answer is retried for ``reach_s`` (the same request id: the
    join is issued once). JoinRefused for a refusal; TransportError when the manager never
    answers; JoinUnknown when it answered with neither."""
    request = manager_pb2.JoinRequest(request_id=uuid.uuid4().hex, job_id=job_id, hook_address=hook_address,
                                      workers=workers)
    channel = transport.make_channel(manager, token=token, tls=tls)
    deadline = time.monotonic() + reach_s
    try:
        stub = client.Client(manager_pb2_grpc.ManagerStub(channel))
        while True:
            try:
                return stub.Join(request, timeout=ANSWER_S).message
            except client.CallFailed as e:
                if refused(e):
                    raise JoinRefused(str(e)) from None
                if e.code != "UNAVAILABLE":
                    raise JoinUnknown(str(e)) from None
                if time.monotonic() > deadline:
                    raise transport.TransportError(f"the manager at {manager} does not answer "
                                                   f"({e.details})") from None
                time.sleep(1.0)
    finally:
        channel.close()
