"""A process with a network of its own: a network namespace holding only loopback.

TensorFlow's task servers listen on every interface and authenticate no one: whoever
reaches a PS or worker port runs TF operations as the job's user (reads and writes its
files). A local run therefore moves its whole process (coordinator, its TF server, the
manager, the fork server and every task it forks) into a new network namespace that holds
nothing but ``lo``, before TensorFlow is imported: every port the run opens is on that
loopback, which no process outside the namespace can reach, whoever it runs as and
whether or not a firewall is installed. The run's manager is reached from outside
through a Unix socket in the run directory (0700: its owner's only).

Root makes the namespace with ``unshare(CLONE_NEWNET)``; under ``sudo`` the process
then becomes the user who ran it (:func:`drop_to_sudo_user`), so nothing of the job
runs as root. An ordinary user makes a user namespace with it (``CLONE_NEWUSER``, the
user mapped to itself: files it writes are still its own), where the kernel allows
unprivileged user namespaces. Where neither can be had :func:`enter` raises
:class:`IsolationError` saying why; the caller refuses the run unless the user accepted
open ports (:func:`accepted_open_ports`).

Children inherit the namespace, and ``TFSYNC_ISOLATED`` (the namespace's id) tells a
child it is in one tfsync made (:func:`active`); ``none`` where it could not be made and
the user accepted open ports.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import pwd
import socket
import struct
import sys

from .exits import TfsyncError

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
ENV = "TFSYNC_ISOLATED"
OPEN_ENV = "TFSYNC_OPEN_PORTS"


class IsolationError(TfsyncError, RuntimeError):
    """No private network could be had for a local run's task ports (the message says why,
    the fix, and how to accept open ports)."""


def namespace_id() -> str:
    """The calling thread's network namespace (``net:[inode]``)."""
    return os.readlink("/proc/thread-self/ns/net")


def only_loopback() -> bool:
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def active() -> bool:
    """Whether this thread runs in a private network tfsync made (here or in a parent
    process): the namespace it marked, holding loopback only."""
    mark = os.environ.get(ENV)
    try:
        return bool(mark) and mark == namespace_id() and only_loopback()
    except OSError:
        return False


def accepted_open_ports() -> bool:
    """Whether the user accepted task ports that other users (and machines) reach:
    ``TFSYNC_OPEN_PORTS=1`` (``--open-ports``)."""
    return os.environ.get(OPEN_ENV, "") not in ("", "0")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def enter() -> None:
    """Move this process into a new network namespace holding only loopback (raises
    IsolationError naming why not). As root, only the calling thread moves (its children
    and the threads it starts later follow): call it before other threads talk on the
    network. As another user, the process must have one thread (a user namespace asks it)."""
    if active():
        return
    root = os.geteuid() == 0
    if not root and threads() > 1:
        raise IsolationError(f"a private network for the task ports needs a process of one thread here, "
                             f"this one has {threads()}")
    uid, gid = os.geteuid(), os.getegid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET if root else CLONE_NEWUSER | CLONE_NEWNET) != 0:
        why = os.strerror(ctypes.get_errno())
        raise IsolationError("no private network for the task ports: unshare failed ("
                             + (why if root else f"unprivileged user namespaces are off on this machine: {why}") + ")")
    try:
        if not root:   # this user is itself inside: what it writes stays its own
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        _loopback_up()
    except OSError as e:
        raise IsolationError(f"no private network for the task ports: the new namespace's loopback could not "
                             f"be brought up ({e.strerror or e}; a security module may restrict user "
                             "namespaces)") from None
    os.environ[ENV] = namespace_id()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s, SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | IFF_UP))


def sudo_user() -> tuple[int, int] | None:
    """``(uid, gid)`` of the user who ran ``sudo``, when this process is root through it."""
    uid = os.environ.get("SUDO_UID", "")
    if os.geteuid() != 0 or not uid.isdigit() or int(uid) == 0:
        return None
    gid = os.environ.get("SUDO_GID", "")
    if gid.isdigit():
        return int(uid), int(gid)
    try:
        return int(uid), pwd.getpwuid(int(uid)).pw_gid
    except KeyError:
        return int(uid), int(uid)


def drop_to_sudo_user() -> tuple[int, int] | None:
    """Become the user who ran ``sudo`` (its groups, ``HOME``, ``USER``): root was needed
    only for the namespace. Returns ``(uid, gid)``, or None when there is no such user."""
    user = sudo_user()
    if user is None:
        return None
    uid, gid = user
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        entry = None
    if entry is not None:
        os.initgroups(entry.pw_name, gid)
        os.environ.update(HOME=entry.pw_dir, USER=entry.pw_name, LOGNAME=entry.pw_name)
    else:
        os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    return user


def refusal(why: str, in_process: bool = False) -> str:
    """The one line that refuses a local run whose task ports cannot be kept private.
    ``in_process``: the cluster was asked for by a program (the Python API, the Keras
    path), whose process already runs: the fix is to start it in a network of its own."""
    if in_process:
        fix = ("start the program in a network of its own: `tfsync isolate -- python YOUR_SCRIPT.py` (or run it as "
               "root with nftables installed)")
    elif os.geteuid() == 0:
        fix = "give this root CAP_SYS_ADMIN (a container: docker run --cap-add SYS_ADMIN, or a pod's securityContext)"
    else:
        fix = ("run it as root, or allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; "
               "Ubuntu: sysctl kernel.apparmor_restrict_unprivileged_userns=0)")
    return (f"{why}: other local users would reach the TF task ports, and through them this user's files. "
            f"Fix: {fix}; or accept open ports with {'--open-ports or ' if not in_process else ''}{OPEN_ENV}=1")


def main(argv: list[str]) -> int:
    """``python -m tfsync.base.isolation CMD...``: CMD in a network of its own, as the user
    who ran sudo where root ran it through sudo. Where none can be had: one line and exit
    1, or CMD with open ports where the user accepted them."""
    if not argv:
        print("usage: python -m tfsync.base.isolation CMD [ARG...]", file=sys.stderr)
        return 2
    try:
        enter()
    except IsolationError as e:
        if not accepted_open_ports():
            print(f"tfsync: error: {refusal(str(e))}", file=sys.stderr)
            return 1
        print(f"tfsync: warning: {e}; TF task ports open to every local user ({OPEN_ENV}=1)", file=sys.stderr)
        os.environ[ENV] = "none"   # tried: CMD does not try again
    drop_to_sudo_user()
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"tfsync: error: cannot run {argv[0]}: {e.strerror}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
