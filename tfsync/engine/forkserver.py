"""Task processes forked from one that imported TensorFlow once: ``python -m
tfsync.engine.forkserver``.

Importing TensorFlow costs a task process about 5 CPU-seconds, most of a local cluster's
start, and a LocalCluster used to pay it once per task and per generation (every restart
switch and recovery). The fork server imports it once; each task is a fork of it that
sets its own session, log, working directory and arguments and runs the task's server
(``tfsync.engine.server``). Forking after the import, before any TensorFlow context,
channel or thread pool exists, is what makes it safe: the child builds all of those
itself. Where a fork server cannot be started, tasks start as their own processes.

Protocol (JSON lines): the launcher writes ``{"args": [...], "cwd": ..., "log": ...}``;
the server answers ``{"pid": N}`` and, when a task ends, ``{"exit": N, "code": C}`` (a
signal as ``-SIG``, as ``subprocess`` does). It exits when its stdin closes or its
parent is gone, and its tasks follow it (they watch for their parent).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time


# -- the server (its own process) --------------------------------------------------------------
def _serve() -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow  # noqa: F401  (once, for every task this server forks)

    from tfsync.base import safefile
    from tfsync.engine import server

    out = sys.stdout.buffer
    lock = threading.RLock()   # SIGCHLD's handler runs in this thread, maybe inside say()

    def say(message: dict) -> None:
        with lock:
            out.write(json.dumps(message).encode() + b"\n")
            out.flush()

    def reap(*_):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            say({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    signal.signal(signal.SIGCHLD, reap)
    for line in sys.stdin.buffer:
        task = json.loads(line)
        pid = os.fork()
        if pid == 0:   # the task
            code = 1
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.setsid()
                with open(os.devnull, "rb") as null:
                    os.dup2(null.fileno(), 0)
                if task.get("log"):
                    with safefile.open_append(task["log"], binary=True) as log:
                        os.dup2(log.fileno(), 1)
                        os.dup2(log.fileno(), 2)
                else:
                    with open(os.devnull, "wb") as null:
                        os.dup2(null.fileno(), 1)
                        os.dup2(null.fileno(), 2)
                if task.get("cwd"):
                    os.chdir(task["cwd"])
                code = server.main([*task["args"], "--parent-pid", str(os.getppid())])
            finally:
                os._exit(code)
        say({"pid": pid})
    return 0


# -- the launcher's side ------------------------------------------------------------------------
class ForkedTask:
    """A task forked by a :class:`ForkServer`, with what LocalCluster uses of a Popen."""

    def __init__(self, pid: int, server: "ForkServer"):
        self.pid, self._server, self.returncode = pid, server, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"task pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """One fork server of this process, started with ``command`` (the program, wrapped to run
    where the tasks run) and ``env``; ``fork`` asks it for a task."""

    def __init__(self, command: list[str], env: dict):
        self.command, self.env = command, env
        self.proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self._exits: dict[int, int] = {}
        self._pids: list[int] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, name="tfsync-forkserver", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            with self._cond:
                if "pid" in message:
                    self._pids.append(message["pid"])
                else:
                    self._exits[message["exit"]] = message["code"]
                self._cond.notify_all()
        with self._cond:   # the server is gone: so are its tasks (they watch their parent)
            self.proc.wait()
            self._cond.notify_all()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, args: list[str], cwd: str | None, log: str | None, timeout: float) -> ForkedTask:
        """A task running ``tfsync.engine.server`` with ``args``; OSError if the server is gone."""
        with self._cond:
            self.proc.stdin.write(json.dumps({"args": args, "cwd": cwd, "log": log}).encode() + b"\n")
            self.proc.stdin.flush()
            if not self._cond.wait_for(lambda: self._pids or not self.alive(), timeout):
                raise OSError(f"the fork server (pid {self.proc.pid}) did not fork a task in {timeout:.0f} s")
            if not self._pids:
                raise OSError(f"the fork server (pid {self.proc.pid}) has ended")
            return ForkedTask(self._pids.pop(0), self)

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            if pid in self._exits:
                return self._exits[pid]
            if not self.alive():
                return -signal.SIGKILL if _gone(pid) else None
        return None

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            self.proc.kill()
            self.proc.wait()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


if __name__ == "__main__":
    sys.exit(_serve())
