"""One testbed node's hook: ``tfsync hook`` with the node's own view of the filesystem.

Run by ``tfsync testbed up`` inside the node's network namespace and a mount namespace
of its own (``unshare --mount --propagation private``): it reads the hooks' token, puts
an empty tmpfs over each ``--private`` directory (what another machine would not see:
by default /tmp, where a coordinator's run directory or a test's files live), except for
the Python installation and tfsync's own directory where they lie inside one (every
machine of a cluster has tfsync installed), keeps the
hook's work directory (task logs, staged data) and a copy of the token in the first of
them (and of ``--manager-token-file``, for a hook that joins a job), and then runs the
hook with the arguments it does not know itself.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from tfsync.api import auth
from tfsync.base.taskcmd import PACKAGE_ROOT
from tfsync.hooks import node as hook


def needed() -> list[str]:
    """What this program runs from: the Python installation and the directory tfsync is
    imported from (an editable install's checkout). A node must still see them when they
    lie in a private directory (a checkout or virtual environment in /tmp)."""
    return [sys.prefix, sys.base_prefix, PACKAGE_ROOT]


def hide(d: str, keep: list[str]) -> None:
    """An empty tmpfs over ``d``, with the paths of ``keep`` that lie inside it bound back
    in from the original (reached through a bind of ``d`` made before the tmpfs covers it)."""
    d = os.path.realpath(d)
    inside = sorted({os.path.realpath(p) for p in keep if os.path.realpath(p).startswith(d.rstrip("/") + "/")})
    inside = [p for p in inside if not any(p.startswith(q + "/") for q in inside)]   # the outermost only
    os.makedirs(d, exist_ok=True)
    original = tempfile.mkdtemp(prefix="tfsync-node-", dir="/run") if inside else None
    try:
        if original:
            subprocess.run(["mount", "--bind", d, original], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tfsync-node", d], check=True)
        for p in inside:
            os.makedirs(p, exist_ok=True)
            subprocess.run(["mount", "--bind", os.path.join(original, os.path.relpath(p, d)), p], check=True)
    finally:
        if original:
            subprocess.run(["umount", "-l", original], check=False)
            os.rmdir(original)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tfsync.testbed.node",
                                description="A testbed node's hook (started by tfsync testbed up).")
    p.add_argument("--listen", required=True, help="host:port: the node's own address")
    p.add_argument("--token-file", required=True)
    p.add_argument("--private", action="append", default=[], help="a directory this node sees empty")
    p.add_argument("--node", required=True, help="the node's name (n1, n2, ...)")
    p.add_argument("--task-allow", action="append", default=[], help="passed on to the hook (its firewall)")
    args, more = p.parse_known_args(argv)   # more: the hook's own (--join ...), passed on
    tokens = {"token": auth.read_token(args.token_file)}   # read before the private directories hide them
    if "--manager-token-file" in more[:-1]:
        at = more.index("--manager-token-file") + 1
        tokens["manager.token"] = auth.read_token(more[at])
    for d in args.private:
        hide(d, needed())
    work = os.path.join(args.private[0] if args.private else os.getcwd(), "tfsync-hook")
    os.makedirs(work, mode=0o700, exist_ok=True)
    for name, token in tokens.items():
        auth.write_token(os.path.join(work, name), token)
    if "manager.token" in tokens:
        more[at] = os.path.join(work, "manager.token")
    return hook.main(["--listen", args.listen, "--token-file", os.path.join(work, "token"), "--log-dir", work,
                      "--allow-remote", "--node", args.node,
                      *[a for addr in args.task_allow for a in ("--task-allow", addr)], *more])


if __name__ == "__main__":
    sys.exit(main())
