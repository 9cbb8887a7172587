"""A testbed node's CPU share: a cgroup per node whose CPU quota caps every process in it
(its hook and the tasks the hook starts, which inherit the cgroup), so a node can be a
slow machine as well as one behind a slow link (LB-BSP's CPU heterogeneity, LB-BSP
Sec. 5.2, where it runs in VMs with fewer cores).

``cpus`` is in CPUs: 0.33 is a third of one CPU (CFS bandwidth control: ``cpus`` x 10 ms
of run time in every 10 ms, over all of the node's threads). cgroup v2
(``cpu.max``) and v1 (``cpu.cfs_quota_us``) are both handled. Nothing here knows of
network namespaces: the testbed says which processes are the node's.
"""

from __future__ import annotations

import contextlib
import os
from ..base.exits import TfsyncError

ROOT = "/sys/fs/cgroup"
PERIOD_US = 10_000   # short: a node capped at a third of a CPU is slow throughout, not stopped
# for 67 ms of every 100 ms (the default period), which made short steps take 26 or 90 ms by chance


class CpuShareError(TfsyncError, RuntimeError):
    """The CPU share cannot be set here (one line: why)."""


def _base() -> tuple[str, bool]:
    """(the directory cgroups are made in, whether it is cgroup v2)."""
    controllers = os.path.join(ROOT, "cgroup.controllers")
    if os.path.exists(controllers):
        with open(controllers) as f:
            if "cpu" not in f.read().split():
                raise CpuShareError("cgroup v2 has no cpu controller here")
        return ROOT, True
    v1 = os.path.join(ROOT, "cpu")
    if os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
        return v1, False
    raise CpuShareError(f"no cgroup cpu controller under {ROOT}")


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise CpuShareError(f"cannot write {path} ({e.strerror})") from None


def check(cpus: float | None) -> None:
    if cpus is not None and not 0.1 <= cpus <= os.cpu_count():   # the kernel's least quota is 1 ms a period
        raise ValueError(f"cpu {cpus:g}: give 0.1 to {os.cpu_count()} CPUs (this machine's), or none")


def limit(name: str, cpus: float | None, pids) -> None:
    """Cap cgroup ``name`` (made if missing) at ``cpus`` CPUs (None: no cap) and move
    ``pids`` into it; a pid that is gone by then is skipped."""
    check(cpus)
    base, v2 = _base()
    group = os.path.join(base, name)
    if not os.path.isdir(group):
        if v2:   # the root must hand the cpu controller down to its children
            _write(os.path.join(base, "cgroup.subtree_control"), "+cpu")
        try:
            os.mkdir(group)
        except OSError as e:
            raise CpuShareError(f"cannot make cgroup {group} ({e.strerror})") from None
    quota = -1 if cpus is None else round(cpus * PERIOD_US)
    if v2:
        _write(os.path.join(group, "cpu.max"), f"{'max' if quota < 0 else quota} {PERIOD_US}")
    else:
        _write(os.path.join(group, "cpu.cfs_period_us"), str(PERIOD_US))
        _write(os.path.join(group, "cpu.cfs_quota_us"), str(quota))
    for pid in pids:
        try:
            _write(os.path.join(group, "cgroup.procs"), str(pid))
        except CpuShareError:
            if os.path.exists(f"/proc/{pid}"):   # not one that ended meanwhile
                raise


def procs_file(name: str) -> str:
    """The file that a pid written to moves into cgroup ``name``."""
    return os.path.join(_base()[0], name, "cgroup.procs")


def members(name: str) -> list[int]:
    """The pids in cgroup ``name`` (none if it does not exist)."""
    with contextlib.suppress(CpuShareError, FileNotFoundError):
        with open(procs_file(name)) as f:
            return [int(p) for p in f.read().split()]
    return []


def remove(name: str) -> None:
    """Remove cgroup ``name`` if there is one (its processes must be gone)."""
    with contextlib.suppress(CpuShareError, OSError):
        os.rmdir(os.path.dirname(procs_file(name)))
