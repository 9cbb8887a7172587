"""The coordinator's ordered, asynchronous line to the PS control state.

Releasing tokens and applying barriers are remote calls of a round trip each (sent by
the coordinator's outgoing link, tfsync.engine.links). Made from the engine's loop they
would stall it while steps finish; here one thread carries them out in the order they
were asked for, merging every release asked while the last call ran into one call.
``sync()`` waits until everything asked so far is done (before a checkpoint, a switch or
the end), and re-raises a failure in the caller's thread.
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from ..base.exits import TfsyncError


_STOP = object()


class ChannelError(TfsyncError, RuntimeError):
    """A release or barrier on the PS failed."""


class PSChannel:
    def __init__(self, links, name: str = "tfsync-ps-channel"):
        """``links``: the generation's ``tfsync.engine.links.Links``."""
        self.links = links
        self._q: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- asked from the engine's loop ---------------------------------------------------
    def release(self, rows: np.ndarray) -> None:
        self._q.put(("release", rows))

    def barrier(self, num_required: int, rows: np.ndarray) -> None:
        self._q.put(("barrier", (num_required, rows)))

    def call(self, fn) -> None:
        """Run ``fn()`` in order with the releases (e.g. a learning-rate change)."""
        self._q.put(("call", fn))

    def check(self) -> None:
        if self._error is not None:
            raise ChannelError(f"PS control call failed: {type(self._error).__name__}: "
                               f"{str(self._error).splitlines()[0] if str(self._error) else ''}") from self._error

    def sync(self, timeout: float = 120.0) -> None:
        done = threading.Event()
        self._q.put(("sync", done))
        if not done.wait(timeout):
            raise ChannelError(f"PS control calls did not finish within {timeout:.0f} s; is the PS alive?")
        self.check()

    def close(self) -> None:
        self._q.put(_STOP)

    # -- the channel's thread ---------------------------------------------------------------
    def _run(self) -> None:
        pending = None
        while True:
            item, pending = (pending if pending is not None else self._q.get()), None
            if item is _STOP:
                return
            kind, arg = item
            if kind == "release":  # merge every release already waiting behind this one
                rows = [arg]
                while True:
                    try:
                        nxt = self._q.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is not _STOP and nxt[0] == "release":
                        rows.append(nxt[1])
                    else:
                        pending = nxt
                        break
                self._do(lambda: self.links.send(0, np.concatenate(rows)))
            elif kind == "barrier":
                self._do(lambda: self.links.send(*arg))
            elif kind == "call":
                self._do(arg)
            elif kind == "sync":
                arg.set()

    def _do(self, fn) -> None:
        if self._error is not None:
            return  # after a failure nothing more is sent; sync()/check() report it
        try:
            fn()
        except Exception as e:  # reported to the engine's thread by check()/sync()
            self._error = e.with_traceback(None)   # (its frames would hold what the calls hold: the generation)
