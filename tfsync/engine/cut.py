"""Cutting this process's TCP connections to tasks behind a partition.

When a new generation connects, TF's eager context closes its contexts on every task of
the old cluster (``set_server_def`` -> ``CloseRemoteContexts``) and waits for each answer
with no deadline. A task behind a partition never answers, and the connection to it
stays open through minutes of TCP retransmissions (or for good, where a relay acks on
its behalf). gRPC keepalive would notice, but TF's servers answer frequent pings with a
GOAWAY "too_many_pings" that fails the running steps (tried: a 2 s keepalive ended a
30 s step), and a server's ping policy cannot be set from outside. So the coordinator
shuts down its own sockets to a task its hook no longer answers for: gRPC fails the
calls on them at once (UNAVAILABLE), TF logs it and goes on.

The cut is made just before the new generation connects (a thread cannot do it during
the connect: ``set_server_def`` holds the GIL). TF's close dials the lost task again, and
that connection waits out gRPC's connect timeout, 20 s by default: ``bound_redials``
shortens it to ``CONNECT_TIMEOUT_MS`` for this process's TF channels.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_MS = 5000
_GRPC_ENV = "TF_GRPC_DEFAULT_OPTIONS"   # read by TF once, when it makes its first channel
_CONNECT_TIMEOUT = "grpc.min_reconnect_backoff_ms"   # gRPC's name for the connect timeout's floor


def bound_redials() -> None:
    """Give TF's channels in this process a connect timeout of ``CONNECT_TIMEOUT_MS``
    (before its first channel; a value the user set is kept)."""
    options = [o for o in os.environ.get(_GRPC_ENV, "").split(",") if o]
    if not any(o.split("=")[0] == _CONNECT_TIMEOUT for o in options):
        os.environ[_GRPC_ENV] = ",".join([*options, f"{_CONNECT_TIMEOUT}={CONNECT_TIMEOUT_MS}"])


def _endpoint(hex_address: str) -> tuple[str, int]:
    """An address of /proc/net/tcp{,6} ("0100007F:1F90") as (ip, port)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))   # each 32-bit word little-endian
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def _resolve(address: str) -> set[tuple[str, int]]:
    host, port = address.rsplit(":", 1)
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {(str(ipaddress.ip_address(info[4][0])), int(port)) for info in infos}


def cut(addresses) -> int:
    """Shut down every TCP connection of this process to ``addresses`` ("host:port");
    returns how many. Linux only (/proc); elsewhere it cuts nothing."""
    if not addresses:
        return 0
    targets = set().union(*(_resolve(a) for a in addresses))
    inodes = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if _endpoint(fields[2]) in targets:
                inodes.add(fields[9])
    cut_count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            try:
                with socket.socket(fileno=os.dup(int(fd))) as s:   # shutdown acts on the socket, every fd of it
                    s.shutdown(socket.SHUT_RDWR)
                cut_count += 1
            except OSError as e:
                logger.debug("cutting fd %s: %s", fd, e)
    logger.info("cut %d connection(s) to %s", cut_count, ", ".join(addresses))
    return cut_count
