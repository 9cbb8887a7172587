"""Task ports only the cluster can reach, on a node: one nftables table per hook.

TensorFlow's gRPC server listens on every interface and has no authentication, so a TF
task that a hook runs in its own network namespace (a node of a multi-machine cluster)
can be reached, and driven, by anyone who can reach the node. The hook therefore puts
its live tasks' ports behind a table of its own, ``inet tfsync_hook_<port>_<pid>`` (the
hook's port and pid: two hooks on one machine never share one), whose ``input`` chain
drops TCP connections to a job's task ports from every source but:

- each host of that job's cluster spec (names resolved once, when its tasks start),
- loopback (127.0.0.0/8, ::1),
- the addresses the hook was told to allow (``tfsync hook --task-allow``: a NAT or a
  relay between the nodes; ``tfsync testbed`` allows the address its relay presents the
  coordinator's node at).

The table is rewritten in one ``nft -f`` transaction (atomic) before new tasks start,
so no task serves unprotected for a moment, and whenever the hook's live tasks change;
it is deleted when none is left and when the hook exits (Ctrl-C, SIGTERM). A table left
by a hook that was killed is deleted by the next hook that starts on the machine.
Tasks in a tfsync private network namespace (``StartTasks.netns``) are isolated already
and not listed.

Needs root (CAP_NET_ADMIN), ``nft`` (Debian: ``apt-get install nftables``) and a kernel
with nf_tables. Without them, or with ``TFSYNC_NO_FIREWALL=1``, :func:`open_firewall`
returns None and a reason: the hook warns once at start and every StartTasks reply says
that the task ports listen on every interface, unprotected.

:func:`ruleset` builds the nft text (pure, tested on its own); :class:`Firewall` runs it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from dataclasses import dataclass

from tfsync.base import nft
from tfsync.base.netns import pid_alive
from tfsync.base.nft import NftError as FirewallError  # noqa: F401 (callers catch it by this name)
from tfsync.base.nft import run as _nft

logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.0/8", "::1")
_TABLE = re.compile(r"tfsync_hook_(\d+)_(\d+)")
_LABEL = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class Guard:
    """The ports of one job's tasks on this node and the sources allowed to reach them."""
    label: str                 # the job id (a comment in the rule)
    ports: tuple[int, ...]
    sources: tuple[str, ...]   # addresses or networks, IPv4 or IPv6


def table_name(hook_port: int, pid: int | None = None) -> str:
    return f"tfsync_hook_{int(hook_port)}_{os.getpid() if pid is None else int(pid)}"


def _elements(items) -> str:
    return "{ " + ", ".join(items) + " }"


def ruleset(table: str, guards: list[Guard]) -> str:
    """The nft transaction that makes table ``inet table`` hold exactly ``guards``
    (none: the table is deleted). Raises ValueError for a bad name, port or address,
    so nothing from a request reaches nft's text unchecked."""
    if not _TABLE.fullmatch(table):
        raise ValueError(f"nft table {table!r} is not tfsync_hook_<port>_<pid>")
    lines = [f"table inet {table} {{}}", f"delete table inet {table}"]   # add-then-delete: never fails
    if not guards:
        return "\n".join(lines) + "\n"
    lines += [f"table inet {table} {{", "\tchain input {",
              "\t\ttype filter hook input priority filter; policy accept;"]
    for g in guards:
        if not _LABEL.fullmatch(g.label):
            raise ValueError(f"guard label {g.label!r}: 1-64 letters, digits, '.', '_', '-'")
        ports = sorted(set(g.ports))
        if not ports or not all(isinstance(p, int) and 1 <= p <= 65535 for p in ports):
            raise ValueError(f"guard {g.label}: ports {g.ports!r} must be 1..65535, at least one")
        nets = {ipaddress.ip_network(s, strict=False) for s in (*LOOPBACK, *g.sources)}
        for version, match in ((4, "ip saddr"), (6, "ip6 saddr")):
            allowed = sorted(str(n) for n in nets if n.version == version)
            lines.append(f"\t\ttcp dport {_elements(map(str, ports))} {match} != {_elements(allowed)} drop "
                         f"comment \"{g.label}\"")
    lines += ["\t}", "}"]
    return "\n".join(lines) + "\n"


def unavailable_reason() -> str | None:
    """Why this process cannot install a firewall (None: it may try)."""
    if os.environ.get("TFSYNC_NO_FIREWALL"):
        return "TFSYNC_NO_FIREWALL is set"
    return nft.unavailable_reason()


def remove_stale(hook_port: int) -> list[str]:
    """Delete the tables of hooks that no longer run here (or held ``hook_port`` before
    this hook: a port is one live hook's); returns their names."""
    removed = []
    for name in nft.tables():
        m = _TABLE.fullmatch(name)
        if not m or int(m.group(2)) == os.getpid():
            continue
        if int(m.group(1)) == hook_port or not pid_alive(int(m.group(2))):
            _nft(text=ruleset(name, []))
            removed.append(name)
    return removed


class Firewall:
    """This hook's table; :meth:`sync` makes it hold the given guards."""

    def __init__(self, hook_port: int, allow=()):
        self.table = table_name(hook_port)
        self.allow = tuple(str(ipaddress.ip_network(a, strict=False)) for a in allow)
        self._applied: tuple[Guard, ...] = ()   # what the kernel holds: nothing yet

    def sync(self, guards: list[Guard]) -> None:
        """Replace the table's rules with ``guards`` (nft runs only when they changed)."""
        guards = tuple(Guard(g.label, g.ports, (*g.sources, *self.allow)) for g in guards)
        if guards != self._applied:
            _nft(text=ruleset(self.table, list(guards)))
            self._applied = guards

    def close(self) -> None:
        """Delete the table (one line logged if nft fails)."""
        try:
            self._applied = None   # delete it even if no rule was ever written
            self.sync([])
        except FirewallError as e:
            logger.warning("tfsync hook: could not remove firewall table %s: %s", self.table, e)


def open_firewall(hook_port: int, allow=(), keep: bool = False) -> tuple[Firewall | None, str | None]:
    """This hook's firewall, checked by making and deleting its table (so a kernel
    without nf_tables is found now), with stale tables removed; or None and why not.
    ``keep``: the hook restarted in place (same process id) with tasks to adopt: its table
    stays until the first ``sync`` replaces it in one transaction, so their ports are
    never open meanwhile."""
    reason = unavailable_reason()
    if reason is not None:
        return None, reason
    fw = Firewall(hook_port, allow)
    try:
        for name in remove_stale(hook_port):
            logger.info("removed firewall table %s of a hook that no longer runs", name)
        if keep:
            fw._applied = None   # whatever the table holds, the first sync rewrites it
        else:
            _nft(text=ruleset(fw.table, []))   # makes and deletes the table: nf_tables works
    except FirewallError as e:
        return None, str(e)
    return fw, None
