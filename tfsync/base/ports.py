"""Free TCP ports for TF tasks, never one this process handed out lately.

A restarted cluster generation takes fresh ports. Had the kernel given it a port that
the previous generation's task had just released, a connection the coordinator's TF
runtime still holds to the old address would reach the new task (a restart switch once
failed with TF's "Unable to parse request" from a new worker, on a loaded machine). So
the last :data:`REMEMBERED` ports handed out are not handed out again.
"""

from __future__ import annotations

import collections
import socket
import threading

REMEMBERED = 512
_recent: collections.deque = collections.deque(maxlen=REMEMBERED)
_lock = threading.Lock()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` now (all held open together while
    they are chosen, then released), none among the last ones this process handed out."""
    socks: list[socket.socket] = []
    try:
        with _lock:
            chosen: list[int] = []
            while len(chosen) < count:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind((host, 0))
                socks.append(s)   # held, so the kernel does not offer it again now
                port = s.getsockname()[1]
                if port not in _recent:
                    chosen.append(port)
                if len(socks) > count + REMEMBERED:  # pragma: no cover - the kernel keeps offering old ports
                    raise OSError(f"no fresh free port on {host}")
            _recent.extend(chosen)
            return chosen
    finally:
        for s in socks:
            s.close()
