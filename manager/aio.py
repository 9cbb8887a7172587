"""asyncio (``grpc.aio``) servers of the control plane, for the many long-lived streams
of a large cluster: one event loop holds thousands of open streams, where the threaded
server needs one thread per open stream. Same token rule and binding rules as
``tfsync.api.transport``.
"""

from __future__ import annotations

import logging

import grpc

from tfsync.api import auth, transport

logger = logging.getLogger(__name__)


def _denial_handler(handler: grpc.RpcMethodHandler, method: str, reason: str, log: auth.RefusalLog):
    async def deny(_request_or_iterator, context):
        log.refused(method, context.peer(), reason)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                            f"{reason}; send the job's token as '{auth.METADATA_KEY}: {auth.SCHEME}<token>' metadata")

    async def deny_stream(request_or_iterator, context):
        await deny(request_or_iterator, context)
        yield  # pragma: no cover - abort raises

    return auth.handler_like(handler, deny, deny_stream)


class AioTokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """The asyncio twin of ``auth.TokenAuthInterceptor``."""

    def __init__(self, token: str, log_interval: float = 10.0):
        self._check = auth.TokenCheck(token)
        self.refusals = auth.RefusalLog(log_interval)

    async def intercept_service(self, continuation, handler_call_details):
        reason = self._check.problem(handler_call_details.invocation_metadata)
        handler = await continuation(handler_call_details)
        if reason is None or handler is None:
            return handler
        return _denial_handler(handler, handler_call_details.method, reason, self.refusals)


def make_aio_server(listen: str = f"{transport.DEFAULT_HOST}:0", *, token: str,
                    tls: transport.TlsConfig | None = None, allow_remote: bool = False,
                    options=()) -> tuple[grpc.aio.Server, int]:
    """A ``grpc.aio`` server (not started) requiring ``token``; returns it and its port.
    Call from inside the event loop that will run it; add servicers, then ``await start()``."""
    transport.check_listen(listen, allow_remote, tls)
    server = grpc.aio.server(interceptors=[AioTokenAuthInterceptor(token)], options=list(options))
    credentials = None if tls is None else transport.server_credentials(tls)  # checked before binding
    try:
        port = (server.add_insecure_port(listen) if tls is None
                else server.add_secure_port(listen, credentials))
    except RuntimeError as e:
        raise transport.TransportError(f"cannot listen on {listen!r} ({e}); the port may be in use: pick "
                                       "another, or port 0 for a free one") from None
    return server, port
