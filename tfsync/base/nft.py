"""Running ``nft`` (nftables): one transaction or command, its failure as one line.

Standard library only, so the lowest layer can use it: the hooks' firewall
(``tfsync.hooks.firewall``) and the private network's guard (``tfsync.base.netguard``) both
write their tables through :func:`run`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from .exits import TfsyncError

NFT_TIMEOUT_S = 30


class NftError(TfsyncError, RuntimeError):
    """An nft command failed (the message is one line: the command and nft's first line)."""


def run(*args: str, text: str | None = None) -> str:
    """``nft ARGS`` or, with ``text``, ``nft -f -`` reading it (one atomic transaction)."""
    cmd = ["nft", *args] if text is None else ["nft", "-f", "-"]
    try:
        r = subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=NFT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        raise NftError(f"`{' '.join(cmd)}` could not run: {e}") from None
    if r.returncode != 0:
        first = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[0]
        raise NftError(f"`{' '.join(cmd)}` failed: {first}")
    return r.stdout


def unavailable_reason() -> str | None:
    """Why this process cannot write nftables tables (None: it may try)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not running as root (an nftables table needs CAP_NET_ADMIN)"
    if shutil.which("nft") is None:
        return "`nft` is not installed (apt-get install nftables)"
    return None


def tables() -> list[str]:
    """The names of this machine's (this network namespace's) ``inet`` tables."""
    return [line.split()[2] for line in run("list", "tables").splitlines()
            if line.startswith("table inet ") and len(line.split()) == 3]
