"""Task ports only this machine can reach: a private network namespace for a local cluster.

TensorFlow's gRPC server listens on every interface (it binds ``0.0.0.0``/``[::]``; there
is no option to bind one address) and has no authentication: anyone who reaches a PS,
worker or coordinator port can run TF operations as the job's user. So the tasks of a
local cluster run in a network namespace of their own, linked to this one by a veth
pair that carries a /30 of 198.19.128.0/17 (RFC 2544's benchmarking range, never routed
on the Internet). Inside, the only interfaces are loopback and the link's end, and the
only route is the link's own, so a connection from another machine gets no answer
(and this namespace does not forward to it unless the host forwards packets and another
machine routes 198.19.128.0/17 here). The coordinator's own TF server (the chief's,
which ParameterServerStrategy starts in the calling process) is created while the
calling thread is inside the namespace (:meth:`PrivateNetwork.entered`), so it listens
there too. The coordinator's other threads reach the tasks over the link.

One namespace serves a whole process (:func:`shared`): every cluster generation and
every engine of the process places its tasks there on ports free inside it. It is
removed at exit; namespaces left by a process that died are removed by the next one.

Other users of this machine are kept out too: the link's host end has an nftables guard
that lets only root and the tasks' user connect (``tfsync.base.netguard``). Root is needed
only to make the namespace, so when ``sudo`` started this process the tasks run as the
user who ran it (:func:`task_user`), with that user's rights, not root's.

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's ``ip``; the guard also needs
``nft`` (without it a warning says that every local user reaches the task ports). Where either is
missing :func:`shared` returns None and :func:`unavailable_reason` says why: the task
ports then listen on every interface, and the caller says so.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import logging
import os
import re
import shutil
import subprocess
import threading

from . import isolation, netguard, nft, ports
from .exits import TfsyncError

logger = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
SUBNETS = ipaddress.ip_network("198.19.128.0/17")   # /30 each: host end .1, namespace end .2
_NAME = re.compile(r"tfsync-(\d+)-(\d+)")
_lock = threading.Lock()
_shared: "PrivateNetwork | None" = None
_reason: str | None = None
_tried = False


class NetnsError(TfsyncError, RuntimeError):
    """A namespace or link could not be made (the message says which command failed)."""


def _ip(*args: str) -> str:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {r.stderr.strip() or r.returncode}")
    return r.stdout


def _setns(path: str) -> None:
    """Move the calling thread into the network namespace at ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns({path}) failed: {os.strerror(err)}")
    finally:
        os.close(fd)


def join(name: str) -> None:
    """Move the calling thread (a process's only one, after a fork) into network
    namespace ``name`` for good (root)."""
    _setns(os.path.join(NETNS_DIR, name))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_name(name: str) -> str:
    """``name`` if it names an existing tfsync private network (else ValueError)."""
    if not _NAME.fullmatch(name or ""):
        raise ValueError(f"network namespace {name!r} is not a tfsync private network (tfsync-<pid>-<n>)")
    if not os.path.exists(os.path.join(NETNS_DIR, name)):
        raise ValueError(f"network namespace {name!r} does not exist on this node")
    return name


def task_user() -> tuple[int, int] | None:
    """``(uid, gid)`` the tasks of a private network run as: the user who ran ``sudo``
    (``SUDO_UID``, ``SUDO_GID``) when this process is root through it. None: they run as
    this process (it is not root, or root started it without sudo)."""
    return isolation.sudo_user()


def command_in(name: str, argv: list[str]) -> list[str]:
    """``argv`` run inside namespace ``name`` (``ip netns exec`` execs it: same pid), as
    :func:`task_user` where there is one (``setpriv``: no supplementary groups)."""
    user = task_user()
    drop = ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--"] if user else []
    return ["ip", "netns", "exec", name, *drop, *argv]


def hand_over(directory: str, files=(), program: tuple = ()) -> None:
    """Give :func:`task_user` (where there is one) ``directory`` and ``files`` in it
    (relative paths): what its tasks read there. Raises NetnsError naming the first of
    them, or of ``program``'s files, that the user still cannot read (a parent directory
    closed to it)."""
    user = task_user()
    if user is None:
        return
    paths = [directory, *(os.path.join(directory, f) for f in files)]
    for path in sorted({*paths, *(os.path.dirname(p) for p in paths[1:])}):
        os.chown(path, *user, follow_symlinks=False)
    check = 'for p; do [ -r "$p" ] || { echo "$p"; exit 1; }; done'
    r = subprocess.run(["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--",
                        "sh", "-c", check, "sh", *program, *paths], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise NetnsError(f"the tasks run as uid {user[0]} (who ran sudo) and cannot read "
                         f"{r.stdout.strip() or r.stderr.strip()}: run from a directory that user can read")


def remove_stale() -> list[str]:
    """Remove the namespaces of tfsync processes that no longer run; returns their names."""
    removed = []
    for name in os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else ():
        m = _NAME.fullmatch(name)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            with contextlib.suppress(NetnsError):
                _ip("netns", "del", name)
                removed.append(name)
    if nft.unavailable_reason() is None:
        with contextlib.suppress(nft.NftError):
            removed += netguard.remove_stale(lambda pid: pid == os.getpid() or pid_alive(pid))
    return removed


class PrivateNetwork:
    """A network namespace linked to this one by a veth pair with a /30 of ``SUBNETS``.

    ``address``: the namespace's end of the link (task addresses); ``peer``: this
    namespace's end (what the tasks see connections come from). ``users``: the uids
    whose connections reach the tasks; ``unguarded``: why every local user does (None:
    the guard is in place).
    """

    def __init__(self, name: str, index: int):
        self.name, self.index = name, index
        net = list(SUBNETS.subnets(new_prefix=30))[index]
        self.peer, self.address = str(net[1]), str(net[2])
        self.path = os.path.join(NETNS_DIR, name)
        self.guard = netguard.table_name(os.getpid(), index)
        self.users = sorted({os.geteuid(), *(u[0] for u in [task_user()] if u)})
        self.unguarded: str | None = "not made yet"
        self.closed = False

    @classmethod
    def open(cls) -> "PrivateNetwork":
        """Make a namespace with its link (raises NetnsError; nothing is left on failure)."""
        remove_stale()
        used = set(re.findall(r"inet (198\.19\.\d+\.\d+)/", _ip("-o", "-4", "addr", "show")))
        count = SUBNETS.num_addresses // 4
        start = (os.getpid() * 7) % count
        for k in range(count):
            index = (start + k) % count
            net = cls(f"tfsync-{os.getpid()}-{index}", index)
            if net.peer in used or os.path.exists(net.path):
                continue
            try:
                net._make()
            except NetnsError:
                net.close()
                raise
            atexit.register(net.close)
            return net
        raise NetnsError(f"no free /30 left in {SUBNETS}")

    def _make(self) -> None:
        host_end, ns_end = f"tfs{self.index}h", f"tfs{self.index}n"
        _ip("netns", "add", self.name)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end, "netns", self.name)
        _ip("addr", "add", f"{self.peer}/30", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", self.name, "addr", "add", f"{self.address}/30", "dev", ns_end)
        _ip("-n", self.name, "link", "set", ns_end, "up")
        _ip("-n", self.name, "link", "set", "lo", "up")
        self.unguarded = nft.unavailable_reason()
        if self.unguarded is None:
            try:
                netguard.install(self.guard, host_end, self.users)
            except nft.NftError as e:
                self.unguarded = str(e)

    @contextlib.contextmanager
    def entered(self):
        """The calling thread inside the namespace for the ``with`` block (sockets it
        creates there stay there)."""
        back = os.open(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(self.path)
            try:
                yield self
            finally:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(back, CLONE_NEWNET) != 0:  # pragma: no cover - setns back cannot fail as root
                    raise NetnsError(f"could not leave namespace {self.name}: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(back)

    def command(self, argv: list[str]) -> list[str]:
        return command_in(self.name, argv)

    def free_ports(self, count: int) -> list[int]:
        """``count`` distinct ports free on ``address`` inside the namespace."""
        with self.entered():
            return ports.free_ports(count, self.address)

    def close(self) -> None:
        """Remove the namespace (its link goes with it once no socket or process holds it)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(NetnsError, OSError):
            if os.path.exists(self.path):
                _ip("netns", "del", self.name)
        if self.unguarded is None:
            with contextlib.suppress(nft.NftError):
                netguard.remove(self.guard)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def unavailable_reason() -> str | None:
    """Why a private network cannot be made here (None: it can, or was made)."""
    if os.environ.get("TFSYNC_NO_NETNS"):
        return "TFSYNC_NO_NETNS is set"
    if _shared is not None:
        return None
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not running as root (a network namespace needs CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    return _reason


def shared() -> PrivateNetwork | None:
    """This process's private network, made on first use. None where the process has a
    network of its own (``tfsync.base.isolation``: its loopback is private already), or
    where none can be made or guarded and the user accepted open ports (a warning, once);
    else IsolationError: a local cluster is refused rather than left open."""
    global _shared, _reason, _tried
    if isolation.active():
        return None
    with _lock:
        if _shared is not None and not _shared.closed:
            return _shared
        if _tried and _shared is None:
            return None
        reason = unavailable_reason()
        if reason is None:
            try:
                net = PrivateNetwork.open()
            except (NetnsError, OSError, subprocess.SubprocessError) as e:
                reason = _reason = str(e)
            else:
                if net.unguarded is None or isolation.accepted_open_ports():
                    _tried, _shared = True, net
                    logger.debug("task ports in network namespace %s (%s)", net.name, net.address)
                    if net.unguarded:
                        logger.warning("TF task ports will be reachable by every user of this machine (%s=1): %s",
                                       isolation.OPEN_ENV, net.unguarded)
                    return net
                net.close()
                reason = f"the task ports' namespace has no guard against other local users: {net.unguarded}"
        if not isolation.accepted_open_ports():
            raise isolation.IsolationError(isolation.refusal(
                f"this process cannot keep a local cluster's task ports private ({reason})", in_process=True))
        _tried = True
        logger.warning("TF task ports will listen on every interface of this machine, unprotected (%s=1): %s",
                       isolation.OPEN_ENV, reason)
        return None


def describe(net: PrivateNetwork | None) -> str:
    """What protects a cluster's task ports (for summaries): ``net`` is its private network."""
    if net is None and isolation.active():
        return "private network namespace of this process (loopback only): no other user or machine reaches them"
    if net is not None:
        where = f"private network namespace {net.name} ({net.address}): reachable from this machine only"
        if net.unguarded:
            return f"{where}, by every user of it: {net.unguarded}"
        return f"{where}, by uid {' and '.join(map(str, net.users))} only (nftables table inet {net.guard})"
    why = unavailable_reason() or "tasks on other nodes or on a host address that is not loopback"
    return f"every interface, unprotected: {why}"
