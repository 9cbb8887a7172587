"""Only the job's user connects to a private network's tasks: an nftables table on this
machine's end of the link.

A private network (``tfsync.base.netns``) keeps other machines away from a local cluster's TF
task ports, but every process of this machine is routed to it, and a TF task runs any
operation for whoever connects (read and write files, as the task's user: root when the
namespace needed root). So the namespace's link gets a table of its own on this machine,
``inet tfsync_ns_<pid>_<index>`` (the namespace's own numbers, ``tfsync-<pid>-<index>``),
whose ``output`` chain rejects a packet leaving through the link's host end from a socket
owned by any user but the allowed ones: root (this coordinator) and the user the tasks
run as (``netns.task_user``). Matching the interface, not an address, covers IPv4 and the
link's IPv6 link-local address alike; another user's ``connect`` fails at once with
"connection refused". Packets the kernel sends on its own (TCP resets, neighbour
discovery) belong to no socket and pass. Traffic between the tasks stays inside the
namespace and never meets the table.

The table is written before any task starts and deleted with the namespace; one left by
a process that died is deleted by the next one (:func:`remove_stale`).
"""

from __future__ import annotations

import re

from . import nft

_TABLE = re.compile(r"tfsync_ns_(\d+)_(\d+)")
_DEVICE = re.compile(r"tfs\d{1,6}h")


def table_name(pid: int, index: int) -> str:
    return f"tfsync_ns_{int(pid)}_{int(index)}"


def ruleset(table: str, device: str, uids) -> str:
    """The nft transaction that makes ``inet table`` hold the guard of link ``device``
    (``uids`` empty: the table is deleted). ValueError for a bad name or uid."""
    if not _TABLE.fullmatch(table):
        raise ValueError(f"nft table {table!r} is not tfsync_ns_<pid>_<index>")
    lines = [f"table inet {table} {{}}", f"delete table inet {table}"]   # add-then-delete: never fails
    uids = set(uids)
    if not uids:
        return "\n".join(lines) + "\n"
    if not _DEVICE.fullmatch(device):
        raise ValueError(f"link {device!r} is not a private network's host end (tfs<index>h)")
    if not all(isinstance(u, int) and 0 <= u < 2**32 for u in uids):
        raise ValueError(f"uids {uids!r} must be integers 0..2^32-1")
    uids = sorted(uids)
    lines += [f"table inet {table} {{", "\tchain output {",
              "\t\ttype filter hook output priority filter; policy accept;",
              *(f"\t\toifname \"{device}\" meta skuid != {{ {', '.join(map(str, uids))} }} {action}"
                for action in ("meta l4proto tcp reject with tcp reset", "reject")),
              "\t}", "}"]
    return "\n".join(lines) + "\n"


def install(table: str, device: str, uids) -> None:
    """Write the guard (raises nft.NftError)."""
    nft.run(text=ruleset(table, device, uids))


def remove(table: str) -> None:
    nft.run(text=ruleset(table, "", ()))


def remove_stale(alive) -> list[str]:
    """Delete the guards of processes for which ``alive(pid)`` is false; their names."""
    removed = []
    for name in nft.tables():
        m = _TABLE.fullmatch(name)
        if m and not alive(int(m.group(1))):
            remove(name)
            removed.append(name)
    return removed
