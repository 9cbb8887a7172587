"""gRPC servers and channels of the control plane: loopback by default, TLS on demand,
the job token on every call (``tfsync.api.auth``).

Binding to anything but a loopback address must be asked for (``allow_remote=True``),
and without TLS that logs a warning: the token would cross the network in plaintext.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import stat
import tempfile
from concurrent import futures
from dataclasses import dataclass

import grpc

from tfsync.api import auth
from tfsync.base import safefile
from tfsync.base.exits import BadInput, TfsyncError
from tfsync.base.netns import is_loopback

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
MAX_PEM_FILE = 2**20  # bytes of a certificate, key or CA bundle read whole
MAX_UNIX_PATH = 107   # bytes of a Unix socket's path (sockaddr_un.sun_path, less its NUL)


class TransportError(TfsyncError, RuntimeError):
    """A server could not bind, or could not be reached (exit 1). A failed call's errors are
    ``tfsync.api.client``'s."""


class TransportInputError(BadInput, TransportError, ValueError):
    """What was given cannot be used (exit 2): a TLS file, an address, a non-loopback address
    without ``allow_remote``, TLS settings the server does not share."""


@dataclass(frozen=True)
class TlsConfig:
    """PEM files. Servers need ``cert_file`` + ``key_file``; clients need ``ca_file`` (the CA
    that signed the server's certificate) and, when they dial an address that is not in
    the certificate, ``server_name`` (a name that is)."""

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    server_name: str | None = None


_OPTION = {"cert_file": "a certificate (--tls-cert)", "key_file": "a private key (--tls-key)",
           "ca_file": "a CA certificate (--ca)"}


def _read(path: str | None, what: str) -> bytes:
    if not path:
        raise TransportInputError(f"TLS needs {_OPTION[what]}, got none; pass a PEM file (TlsConfig({what}=PATH))")
    try:
        if what == "key_file":
            _check_key_mode(path)
        return safefile.read_regular(path, MAX_PEM_FILE, f"TLS {what}")
    except safefile.NotRegularFileError as e:
        raise TransportInputError(f"TLS {what} {e}; expected a PEM file") from None
    except OSError as e:
        raise TransportInputError(f"cannot read TLS {what} {path!r}: {e.strerror}; expected a PEM file") from None


def _check_key_mode(path: str) -> None:
    """A private key others can read is refused, as a token file is (tfsync.api.auth):
    whoever read it can pose as this server. Certificates are public."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise TransportInputError(f"TLS key_file {path!r} has mode {mode:04o}: group or others can read it; expected "
                             f"0600; fix: chmod 600 {path!r}, or better, make a new key since this one may have "
                             "been read")


def _check_ca(path: str, what: str = "ca_file") -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except ssl.SSLError:
        raise TransportInputError(f"TLS {what} {path!r} holds no PEM certificate "
                                  "(-----BEGIN CERTIFICATE-----)") from None


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """Checked before any port is bound: both files there, PEM, and the key the certificate's."""
    cert, key = _read(tls.cert_file, "cert_file"), _read(tls.key_file, "key_file")
    _check_ca(tls.cert_file, "cert_file")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(tls.cert_file, tls.key_file)
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise TransportInputError(f"TLS key_file {tls.key_file!r} does not match cert_file {tls.cert_file!r}; "
                                 "pass the key the certificate was made for") from None
        raise TransportInputError(f"TLS key_file {tls.key_file!r} is not an unencrypted PEM private key "
                             f"(-----BEGIN PRIVATE KEY-----): {e.reason or e}") from None
    return grpc.ssl_server_credentials([(key, cert)])


def channel_credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    ca = _read(tls.ca_file, "ca_file")
    _check_ca(tls.ca_file)
    return grpc.ssl_channel_credentials(root_certificates=ca)


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise TransportInputError(f"address {address!r} is not HOST:PORT with a port in 0..65535; e.g. 127.0.0.1:0")
    return host.strip("[]"), int(port)


def unix_address(folder: str, name: str) -> str:
    """``unix:PATH`` of a socket named ``name`` in ``folder`` (a 0700 folder: only its owner
    connects), or, where that path is longer than a socket's address holds (107 bytes), in
    a new 0700 folder of this user's in the temporary directory."""
    path = os.path.abspath(os.path.join(folder, name))
    if len(path.encode()) > MAX_UNIX_PATH:
        path = os.path.join(tempfile.mkdtemp(prefix="tfsync-"), name)
    return f"unix:{path}"


def remove_unix_socket(address: str) -> None:
    """Remove the socket of a ``unix:`` address (and the folder :func:`unix_address` made for it)."""
    if not address.startswith("unix:"):
        return
    path = address[len("unix:"):]
    with contextlib.suppress(OSError):
        os.unlink(path)
    folder = os.path.dirname(path)
    if os.path.basename(folder).startswith("tfsync-") and os.path.dirname(folder) == tempfile.gettempdir():
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def check_listen(listen: str, allow_remote: bool, tls: TlsConfig | None, warn: bool = True) -> None:
    """Refuse a non-loopback address unless ``allow_remote``; warn (``warn``) when it has no TLS.
    A ``unix:PATH`` socket is this machine's, reached by who may open PATH."""
    if listen.startswith("unix:"):
        return
    host, _ = split_address(listen)
    if not is_loopback(host):
        if not allow_remote:
            raise TransportInputError(f"refusing to listen on {listen!r}: not a loopback address; expected "
                                 f"{DEFAULT_HOST}:PORT, or pass allow_remote=True (and TLS) to serve other machines")
        if tls is None and warn:
            logger.warning("listening on %s without TLS: tokens and commands cross the network in "
                           "plaintext; pass a TlsConfig with cert_file and key_file", listen)


def make_server(listen: str = f"{DEFAULT_HOST}:0", *, token: str, tls: TlsConfig | None = None,
                allow_remote: bool = False, max_workers: int = 16, options=()) -> tuple[grpc.Server, int]:
    """A gRPC server (not started) that requires ``token`` on every call; returns it and the
    bound port (1 for a ``unix:`` socket). Add servicers, then ``server.start()``."""
    check_listen(listen, allow_remote, tls)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
                         interceptors=[auth.TokenAuthInterceptor(token)], options=list(options))
    credentials = None if tls is None else server_credentials(tls)  # a TLS mistake is not a port in use
    try:
        if tls is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError as e:
        port, cause = 0, e
    else:
        cause = None
    if not port:
        raise TransportError(f"cannot listen on {listen!r} ({cause or 'bind failed'}); the port may be "
                             "in use: pick another, or port 0 for a free one")
    return server, port


def make_channel(target: str, *, token: str, tls: TlsConfig | None = None, options=()) -> grpc.Channel:
    """A channel to ``target`` that sends ``token`` with every call: plaintext when ``tls`` is
    None (loopback only, by convention), else TLS verified against ``tls.ca_file``."""
    opts = list(options)
    if tls is None:
        channel = grpc.insecure_channel(target, options=opts)
    else:
        if tls.server_name:
            opts.append(("grpc.ssl_target_name_override", tls.server_name))
        channel = grpc.secure_channel(target, channel_credentials(tls), options=opts)
    return grpc.intercept_channel(channel, auth.TokenClientInterceptor(token))


def wait_ready(channel: grpc.Channel, timeout: float, what: str = "server", *, target: str | None = None,
               tls: TlsConfig | None = None, options: tuple[str, str] = ("--ca", "--server-name")) -> None:
    """Block until ``channel`` connects, or raise TransportError after ``timeout`` seconds;
    given the channel's ``target`` and ``tls``, the error names a TLS mismatch as the cause
    (then a TransportInputError: the client's TLS settings are not the server's)."""
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        cause = diagnose(target, tls, options) if target else ""
        error = TransportInputError if cause else TransportError
        raise error(f"{what} not reachable within {timeout:.1f} s; "
                    + (cause or "check that it runs and the address, or raise the timeout")) from None


def diagnose(target: str, tls: TlsConfig | None, options: tuple[str, str] = ("--ca", "--server-name")) -> str:
    """Why a gRPC client with ``tls`` may fail to reach ``target`` although something listens
    there: a TLS mismatch, found by a TLS handshake of our own ("" when none is seen).
    ``options``: how the caller's user gives the CA and the server name."""
    ca_option, name_option = options
    try:
        host, port = split_address(target)
        sock = socket.create_connection((host, port), timeout=2.0)
    except (ValueError, OSError):
        return ""  # nothing listens there: the usual causes
    with sock:
        probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        probe.check_hostname, probe.verify_mode = False, ssl.CERT_NONE
        probe.set_alpn_protocols(["h2"])
        try:
            probe.wrap_socket(sock, server_hostname=host).close()
            speaks_tls = True
        except (ssl.SSLError, OSError):
            speaks_tls = False
    if tls is None:
        return (f"it serves TLS and this client spoke plaintext (likely cause): pass {ca_option} PATH, the CA "
                "certificate that signed the server's") if speaks_tls else ""
    if not speaks_tls:
        return f"this client uses TLS ({ca_option}) and the server does not answer TLS: is it started with TLS?"
    try:
        verify = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        verify.load_verify_locations(cafile=tls.ca_file)
        verify.set_alpn_protocols(["h2"])
        with socket.create_connection((host, port), timeout=2.0) as sock:
            verify.wrap_socket(sock, server_hostname=tls.server_name or host).close()
    except ssl.SSLCertVerificationError as e:
        return (f"its TLS certificate was refused (likely cause): {e.verify_message.rstrip('.')}; check {ca_option} (the CA "
                f"that signed it) and that the address, or {name_option}, is a name in the certificate")
    except (ssl.SSLError, OSError):
        pass
    return ""
