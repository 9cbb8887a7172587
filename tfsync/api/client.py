"""The client side of every gRPC call: a stub whose calls raise tfsync's errors, never
``grpc.RpcError``. The one place that reads a call's status code: callers catch the class
that says what they can do (retry an unreachable server, report a refusal), and the
command line prints any of them in one line with the exit code its base implies
(``tfsync.base.exits``).

    hook = Client(node_hook_pb2_grpc.NodeHookStub(channel))
    try:
        hook.Health(node_hook_pb2.HealthRequest(), timeout=5)
    except Unreachable:
        ...

Each error's message is ``CODE: details`` (``INVALID_ARGUMENT: batch sizes [0]: ...``),
the server's own line; ``code`` and ``details`` hold the two apart.
"""

from __future__ import annotations

import grpc

from tfsync.base.exits import BadInput, TfsyncError


class CallFailed(TfsyncError, RuntimeError):
    """A gRPC call failed (exit 1): the server's error, or one this class has no
    narrower name for. ``code``: the status name (``"INTERNAL"``); ``details``: its message."""

    def __init__(self, code: str, details: str):
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class Unreachable(CallFailed):
    """No answer: the server is not there, not up yet, gone, or did not answer in time
    (UNAVAILABLE, DEADLINE_EXCEEDED); a retry may succeed."""


class TokenRefused(CallFailed):
    """The server refused the caller's token (UNAUTHENTICATED, PERMISSION_DENIED): the
    client's token file is not the one the server was started with."""


class Refused(CallFailed):
    """The server refused the call in its present state (FAILED_PRECONDITION, ALREADY_EXISTS,
    ABORTED, OUT_OF_RANGE, RESOURCE_EXHAUSTED): the request was sound, the moment or the
    place was not."""


class Unsupported(Refused):
    """The server does not serve this call (UNIMPLEMENTED): an older or another kind of server."""


class Cancelled(CallFailed):
    """The call was cancelled (CANCELLED), most often by this side, which closed it."""


class InvalidArgument(BadInput, CallFailed):
    """The server found the request wrong (INVALID_ARGUMENT; exit 2); ``details`` says which field."""


class NotFound(BadInput, CallFailed):
    """What the request named is not there (NOT_FOUND; exit 2): a job, a task."""


_CLASSES = {
    grpc.StatusCode.UNAVAILABLE: Unreachable, grpc.StatusCode.DEADLINE_EXCEEDED: Unreachable,
    grpc.StatusCode.UNAUTHENTICATED: TokenRefused, grpc.StatusCode.PERMISSION_DENIED: TokenRefused,
    grpc.StatusCode.FAILED_PRECONDITION: Refused, grpc.StatusCode.ALREADY_EXISTS: Refused,
    grpc.StatusCode.ABORTED: Refused, grpc.StatusCode.OUT_OF_RANGE: Refused,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Refused, grpc.StatusCode.UNIMPLEMENTED: Unsupported,
    grpc.StatusCode.CANCELLED: Cancelled, grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
}


def translate(e: grpc.RpcError) -> CallFailed:
    """The tfsync error of a failed call (a ``CallFailed`` subclass chosen by its status code)."""
    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else None) or str(e) or "no details"
    cls = _CLASSES.get(code, CallFailed)
    return cls(code.name if code is not None else "UNKNOWN", details)


class Client:
    """``stub`` (a generated ``...Stub``) whose every method raises ``translate``'s errors:
    ``client.Method(request, timeout=...)`` answers or raises; a call that streams its
    answers returns a ``Stream`` of them; ``client.Method.future(...)`` a ``Future``."""

    def __init__(self, stub):
        self._stub = stub

    def __getattr__(self, name: str) -> "Method":
        return Method(getattr(self._stub, name))


class Method:
    """One method of a ``Client``."""

    def __init__(self, method):
        self._method = method

    def __call__(self, *args, **kwargs):
        try:
            answer = self._method(*args, **kwargs)
        except grpc.RpcError as e:
            raise translate(e) from None
        return Stream(answer) if isinstance(answer, grpc.Call) and hasattr(answer, "__next__") else answer

    def future(self, *args, **kwargs) -> "Future":
        return Future(self._method.future(*args, **kwargs))


class Future:
    """A call in flight (``Method.future``): ``result()`` answers or raises ``translate``'s errors."""

    def __init__(self, future):
        self._future = future

    def result(self, timeout: float | None = None):
        try:
            return self._future.result(timeout)
        except grpc.RpcError as e:
            raise translate(e) from None

    def cancel(self) -> bool:
        return self._future.cancel()


class Stream:
    """A streamed answer whose iteration raises ``translate``'s errors; ``cancel()`` ends it."""

    def __init__(self, call):
        self._call = call

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._call)
        except grpc.RpcError as e:
            raise translate(e) from None

    def cancel(self) -> bool:
        return self._call.cancel()
