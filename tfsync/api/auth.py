"""Per-job secret tokens, and the gRPC interceptors that require them on every call.

A job's token is ``secrets.token_urlsafe(32)``, kept in a file only its owner can read
(0600). Clients send it in the ``authorization`` metadata as ``Bearer <token>``; the
server interceptor refuses any call without it, or with another token, with
UNAUTHENTICATED, and logs the method and the peer (never the token).

Transport (plaintext on loopback, TLS elsewhere) is in ``tfsync.api.transport``.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
import threading
import time

import grpc

from tfsync.base import safefile
from tfsync.base.exits import BadInput

logger = logging.getLogger(__name__)

METADATA_KEY = "authorization"
SCHEME = "Bearer "
MIN_TOKEN_CHARS, MIN_DISTINCT_CHARS = 22, 8   # a token guessed no sooner than 128 random bits
MAX_TOKEN_FILE = 4096  # bytes: a token is 43 characters; more is not a token file (nor read into memory)


class TokenFileError(BadInput, PermissionError):
    """A token file is missing, empty, not one token, not a regular file, or readable by
    others than its owner."""


def new_token() -> str:
    """A fresh secret: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def write_token(path: str | os.PathLike, token: str | None = None) -> str:
    """Write ``token`` (a new one if None) to ``path`` with mode 0600; return the token.

    The file is created 0600 (never briefly world-readable) and renamed over ``path``: an
    existing file, or a link planted there, is replaced, never written through. A missing
    parent directory is made 0700.
    """
    token = new_token() if token is None else token
    if not usable(token) or weakness(token):
        raise ValueError("a token must be a string of printable ASCII without whitespace, at least "
                         f"{MIN_TOKEN_CHARS} random characters; use tfsync.api.auth.new_token()")
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    safefile.write(path, token + "\n", mode=0o600)
    return token


def read_token(path: str | os.PathLike) -> str:
    """Read a token file written by :func:`write_token`; refuse one others can read."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TokenFileError(f"token file {path!r} does not exist; expected the file the manager "
                             "wrote when the job was submitted (tfsync.api.auth.write_token)") from None
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise TokenFileError(f"token file {path!r} has mode {mode:04o}: group or others can access it; "
                             f"expected 0600; fix: chmod 600 {path!r}, or better, issue a new token "
                             "since this one may have been read")
    try:
        token = safefile.read_regular(path, MAX_TOKEN_FILE, "token file").strip()
    except safefile.NotRegularFileError as e:
        raise TokenFileError(f"token file {e}; expected the file of one token line that "
                             "tfsync.api.auth.write_token writes") from None
    if not token:
        raise TokenFileError(f"token file {path!r} is empty; expected one token line; "
                             "write one with tfsync.api.auth.write_token")
    if not usable(token):
        raise TokenFileError(f"token file {path!r} does not hold one token: it has spaces, control characters "
                             "or non-ASCII bytes (a token is one word of printable ASCII); "
                             "write a new one with tfsync.api.auth.write_token")
    weak = weakness(token.decode("ascii"))
    if weak:
        raise TokenFileError(f"token file {path!r}: {weak}; write a new one (`tfsync hook --init-token`, or "
                             "python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token.decode("ascii")


def weakness(token: str) -> str | None:
    """Why ``token`` is too easy to guess (None: long enough): fewer than 22 characters
    (128 bits as random base64) or fewer than 8 distinct ones. Generated tokens have 43."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"the token has {len(token)} characters, fewer than {MIN_TOKEN_CHARS} (128 random bits)"
    if len(set(token)) < MIN_DISTINCT_CHARS:
        return f"the token repeats {len(set(token))} characters; a random one has many more"
    return None


def usable(token: str | bytes) -> bool:
    """Whether ``token`` can be sent as gRPC metadata: printable ASCII without spaces."""
    data = token.encode("utf-8", "surrogatepass") if isinstance(token, str) else token
    return bool(data) and all(0x21 <= b <= 0x7E for b in data)


def call_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Metadata that authenticates one call (for clients that pass metadata themselves)."""
    return ((METADATA_KEY, SCHEME + token),)


# -- server side --------------------------------------------------------------------------
class RefusalLog:
    """Warn of refused calls at most once every ``interval`` seconds: a client that
    retries, or someone trying tokens, must not flood the run's output. A warning says
    how many refusals were held back since the one before."""

    def __init__(self, interval: float = 10.0, clock=time.monotonic):
        self.interval, self._clock = interval, clock
        self._last, self._held = None, 0
        self._lock = threading.Lock()

    def refused(self, method: str, peer: str, reason: str) -> None:
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last < self.interval:
                self._held += 1
                return
            held, self._last, self._held = self._held, now, 0
        logger.warning("refused %s from %s: %s%s", method, peer, reason,
                       f" ({held} more refused calls not shown since the last warning)" if held else "")


def _denial_handler(handler: grpc.RpcMethodHandler, method: str, reason: str, log: RefusalLog):
    """A handler of the same kind as ``handler`` that refuses the call."""

    def deny(_request_or_iterator, context):
        log.refused(method, context.peer(), reason)
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      f"{reason}; send the job's token as '{METADATA_KEY}: {SCHEME}<token>' metadata")

    def deny_stream(request_or_iterator, context):
        deny(request_or_iterator, context)
        yield  # pragma: no cover - abort raises

    return handler_like(handler, deny, deny_stream)


def handler_like(handler: grpc.RpcMethodHandler, unary_reply, streaming_reply):
    """A method handler of ``handler``'s kind (same serializers) that calls ``unary_reply``
    for methods with one response and ``streaming_reply`` for streamed responses."""
    kind = (handler.request_streaming, handler.response_streaming)
    des, ser = handler.request_deserializer, handler.response_serializer
    if kind == (False, False):
        return grpc.unary_unary_rpc_method_handler(unary_reply, des, ser)
    if kind == (False, True):
        return grpc.unary_stream_rpc_method_handler(streaming_reply, des, ser)
    if kind == (True, False):
        return grpc.stream_unary_rpc_method_handler(unary_reply, des, ser)
    return grpc.stream_stream_rpc_method_handler(streaming_reply, des, ser)


class TokenCheck:
    """Compares the token a call presents with the expected one (constant time)."""

    def __init__(self, token: str):
        if not token:
            raise ValueError("a server needs a non-empty token; use new_token() or read_token(path)")
        self._expected = (SCHEME + token).encode("utf-8")

    def problem(self, metadata) -> str | None:
        """None if ``metadata`` carries the token, else why not ("no token" / "wrong token")."""
        for key, value in metadata or ():
            if key == METADATA_KEY:
                presented = value.encode("utf-8") if isinstance(value, str) else value
                return None if hmac.compare_digest(presented, self._expected) else "wrong token"
        return "no token"


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Refuse every call that does not carry ``token`` (UNAUTHENTICATED, logged at most
    once every ``log_interval`` seconds)."""

    def __init__(self, token: str, log_interval: float = 10.0):
        self._check = TokenCheck(token)
        self.refusals = RefusalLog(log_interval)

    def intercept_service(self, continuation, handler_call_details):
        reason = self._check.problem(handler_call_details.invocation_metadata)
        handler = continuation(handler_call_details)
        if reason is None or handler is None:  # None: unknown method, gRPC answers UNIMPLEMENTED
            return handler
        return _denial_handler(handler, handler_call_details.method, reason, self.refusals)


# -- client side --------------------------------------------------------------------------
class _ClientCallDetails(grpc.ClientCallDetails):
    def __init__(self, details, metadata):
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class TokenClientInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                             grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Attach the token to every call of a channel (works on plaintext channels too,
    unlike ``grpc.metadata_call_credentials``)."""

    def __init__(self, token: str):
        if not token:
            raise ValueError("TokenClientInterceptor needs a non-empty token; read it with read_token(path)")
        self._pair = call_metadata(token)[0]

    def _details(self, details):
        metadata = [m for m in (details.metadata or ()) if m[0] != METADATA_KEY]
        return _ClientCallDetails(details, metadata + [self._pair])

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)
