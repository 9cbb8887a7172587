"""Task processes forked from one that imported TensorFlow once: ``python -m
tfsync.base.forkserver tfsync.engine.server``.

Importing TensorFlow costs a task process about 5 CPU-seconds, most of a local cluster's
start, and a LocalCluster used to pay it once per task and per generation (every restart
switch and recovery). The fork server imports it once; each task is a fork of it that
takes its own session, environment, log, network namespace, working directory and user,
and runs the task's server (``tfsync.engine.server``, the module the server is started
with: imported, it imports TensorFlow; the launchers import neither). Forking after the
import, before any TensorFlow context, channel or thread pool exists, is what makes it
safe: the child builds all of those itself. Where no fork server can be started, tasks
start as processes of their own.

Both launchers use it: the engine's LocalCluster and the node hook (``tfsync.hooks.tasks``),
through :func:`fork`, which keeps one server per environment. A server is a process of its
own (``python -m tfsync.base.forkserver``), or, for a command that imports TensorFlow
itself (``tfsync run``, ``resume``, ``search``), a fork of that command made right after
its import, before any TensorFlow context (:func:`prestart` with ``here``): TensorFlow is
then imported once per command, not twice. ``TFSYNC_FORK_TASKS=0`` starts every task as a
process of its own instead.

Protocol, JSON lines: the launcher writes ``{"id": I, "args": [...], "env": {...}, "cwd":
..., "log": ..., "user": [uid, gid] | null, "netns": name | ""}``; the server answers
``{"ready": true}`` once it has imported, then ``{"id": I, "pid": N}`` (or ``{"id": I,
"error": ...}``) and, when that task ends, ``{"id": I, "code": C}`` (a
signal as ``-SIG``, as ``subprocess`` does). Its answers go out on a descriptor of their
own, so nothing TensorFlow prints can break them. It exits when its stdin closes or its
launcher is gone. A task exits when its parent is neither the server nor the launcher: the
server gone with the launcher, the task follows; the server gone while the launcher lives
(a hook re-executing itself closes the server's stdin) and the launcher a subreaper, the
task is the launcher's own child from then on and goes on.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

import psutil

from tfsync.base import netns as netns_
from tfsync.base import safefile, taskcmd
from tfsync.base.exits import BadInput

logger = logging.getLogger(__name__)

# A fork server of task processes: the tasks' program module is its argument
COMMAND = (sys.executable, "-m", "tfsync.base.forkserver", taskcmd.SERVER[-1])

# Environment variables that change while a launcher runs without changing what the fork
# server imports: one fork server serves across them, and each task gets the launcher's
# values. pytest names the running test in one; TF reads its gRPC options when a process
# makes its first channel and GRPC_FAIL_FAST as it makes an RPC (a task: after the fork);
# importing TensorFlow sets the others (in the fork server too).
VOLATILE_ENV = frozenset({
    "PYTEST_CURRENT_TEST", "TF_GRPC_DEFAULT_OPTIONS", "GRPC_FAIL_FAST",
    "GRPC_VERBOSITY", "TPU_ML_PLATFORM", "TPU_ML_PLATFORM_VERSION", "TF2_BEHAVIOR", "KMP_DUPLICATE_LIB_OK",
    "HDF5_PLUGIN_PATH", "ENABLE_RUNTIME_UPTIME_TELEMETRY"})


# -- the server (its own process) --------------------------------------------------------------
def _serve(program: str, launcher: int, requests=None) -> None:
    """Serve fork requests read from ``requests`` (stdin) until it closes; never returns."""
    answers = os.dup(1)        # the protocol's own descriptor; what else is printed goes to stderr
    os.dup2(2, 1)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    server = importlib.import_module(program)   # TensorFlow, once for every task this server forks

    taskcmd.exit_with_parent(launcher)
    ids: dict[int, int] = {}   # pid -> request id

    def say(message: dict) -> None:   # one write of a short line: whole, also from the handler
        try:
            os.write(answers, json.dumps(message).encode() + b"\n")
        except OSError:   # the launcher has closed its end (it re-executes itself): no one to tell
            pass

    def reap(*_) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in ids:
                say({"id": ids.pop(pid), "code": os.waitstatus_to_exitcode(status)})

    signal.signal(signal.SIGCHLD, reap)
    parent = os.getpid()
    say({"ready": True})
    for line in requests or sys.stdin.buffer:
        task = json.loads(line)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})   # its exit after its pid
        try:
            pid = os.fork()
            if pid == 0:
                _task(task, parent, answers, server)
            ids[pid] = task["id"]
            say({"id": task["id"], "pid": pid})
        except OSError as e:
            say({"id": task["id"], "error": str(e)})
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    os._exit(0)   # at once, without TensorFlow's slow teardown: a re-executing hook adopts the tasks


def _task(task: dict, parent: int, answers: int, server) -> None:
    """In the forked child: become the task, run its server, never return."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        os.close(answers)
        os.setsid()
        with open(os.devnull, "rb") as null:
            os.dup2(null.fileno(), 0)
        with (safefile.open_append(task["log"], binary=True) if task.get("log") else open(os.devnull, "wb")) as out:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
        os.environ.clear()
        os.environ.update(task["env"])
        if task.get("netns"):   # the tasks' private network (tfsync.base.netns), as root
            netns_.join(task["netns"])
        if task.get("cwd"):
            os.chdir(task["cwd"])
        if task.get("user"):   # as `setpriv --reuid --regid --clear-groups` would, and its exec:
            uid, gid = task["user"]
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            taskcmd.prctl(taskcmd.PR_SET_DUMPABLE, 1)   # its /proc files the user's (a uid change clears it)
        code = server.main([*task["args"], "--parent-pid", str(parent)])   # the launcher's or this server
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the task's log says why it could not start
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# -- the launcher's side ------------------------------------------------------------------------
class PolledProcess:
    """What a launcher uses of a ``subprocess.Popen``, for a process it learns the end of
    by ``poll`` (its own way, in a subclass): wait, signal, kill."""

    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        raise NotImplementedError

    def _waitpid(self) -> None:
        """Take its exit status where it has ended (ChildProcessError: not a child of this
        process, or reaped already)."""
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"task pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):   # it ended since
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedTask(PolledProcess):
    """A task forked by a :class:`ForkServer`; its end is what the server reports."""

    def __init__(self, pid: int, request: int, server: "ForkServer"):
        self.pid, self._request, self._server, self.returncode = pid, request, server, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self._request, self.pid)
        return self.returncode


class ForkedServer(PolledProcess):
    """What :class:`ForkServer` uses of a ``Popen``, for a server forked from this process
    (:func:`fork_here`): its pid, the ends of its pipes, its exit status."""

    def __init__(self, pid: int, stdin, stdout):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self._waitpid()
            except ChildProcessError:   # reaped elsewhere
                self.returncode = -signal.SIGKILL
        return self.returncode


# TensorFlow's native logging reads it once, at its first line (its import); unset: "0"
LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"


def fork_here(env: dict) -> ForkedServer | None:
    """A fork server forked from this process after it imported the tasks' program
    (:data:`COMMAND`'s last argument: TensorFlow), before it made any TensorFlow context,
    channel or thread: the state a server reaches by importing it itself. It takes
    ``env`` as its environment, as a started one would. TensorFlow is imported here with
    ``env``'s native log level (the tasks' logs keep its errors; a command's own native
    output goes to /dev/null unless verbose, at that level then). None where this process
    cannot be forked so: it runs other threads, or imported TensorFlow at another level."""
    level = env.get(LOG_LEVEL, "0")
    if "tensorflow" in sys.modules and os.environ.get(LOG_LEVEL, "0") != level:
        return None
    with taskcmd.scoped_env(LOG_LEVEL, level, "0"):
        program = importlib.import_module(COMMAND[-1])
    if threading.active_count() > 1:   # a fork copies only the thread that forks
        return None
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):   # nothing printed twice
        if stream is not None:
            stream.flush()
    requests, to_server = os.pipe()
    from_server, answers = os.pipe()
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:   # the server: its own session, the pipes as stdin and stdout, no file of the command's
        try:
            os.setsid()
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            os.dup2(requests, 0)
            os.dup2(answers, 1)
            _only_stdio(keep=(0, 1))
            os.environ.clear()
            os.environ.update(env)
            taskcmd.prctl(taskcmd.PR_SET_NAME, b"tfsync-forks")
            _serve(program.__name__, launcher, os.fdopen(0, "rb", closefd=False))
        finally:
            os._exit(1)
    os.close(requests)
    os.close(answers)
    return ForkedServer(pid, os.fdopen(to_server, "wb"), os.fdopen(from_server, "rb"))


def _only_stdio(keep) -> None:
    """In a process forked from a command: descriptors 0-2 only (2 on /dev/null), and
    Python's stdio and log handlers on them. Every other descriptor goes to /dev/null, not
    closed: an object of the command's that still writes to one (its stderr after
    ``tfsync.base.quiet.native_logs_off``, a log handler on it) would write into whatever
    reused the number, and the command's own files (a pipe a caller reads to its end)
    would stay open."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
        if fd not in keep and fd != null:
            with contextlib.suppress(OSError):   # (the listing's own descriptor, closed by now)
                os.dup2(null, fd)
    os.close(null)
    moved = {id(sys.stdout): sys.__stdout__, id(sys.stderr): sys.__stderr__}   # objects on fds 1 and 2
    for logger in [logging.getLogger(), *logging.root.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", ()):
            if type(handler) is logging.StreamHandler and id(handler.stream) in moved:
                handler.setStream(moved[id(handler.stream)])
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__


class ForkServer:
    """One fork server: ``proc``, a ``Popen`` of :data:`COMMAND` (:meth:`start`) or a
    :class:`ForkedServer`; ``fork`` asks it for a task."""

    @classmethod
    def start(cls, env: dict) -> "ForkServer":
        return cls(subprocess.Popen([*COMMAND, "--launcher", str(os.getpid())], env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True))

    def __init__(self, proc: "subprocess.Popen | ForkedServer"):
        self.proc = proc
        self._answers: dict[int, dict] = {}
        self._codes: dict[int, int] = {}
        self._live: set[int] = set()   # requests whose task runs
        self._dropped: set[int] = set()   # requests given up on: a task forked for one late is killed
        self._ids = itertools.count(1)
        self._eof = self._ready = False
        self._cond = threading.Condition()
        threading.Thread(target=self._read, name="tfsync-forkserver", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                if "ready" in message:
                    self._ready = True
                elif "code" in message:
                    self._codes[message["id"]] = message["code"]
                    self._live.discard(message["id"])
                elif message["id"] in self._dropped:
                    self._dropped.discard(message["id"])
                    if "pid" in message:
                        with contextlib.suppress(OSError):
                            os.kill(message["pid"], signal.SIGKILL)
                else:
                    self._answers[message["id"]] = message
                self._cond.notify_all()
        with self._cond:   # the server is gone (its tasks follow it, unless the launcher adopts them)
            self._eof = True
            self._cond.notify_all()

    def alive(self) -> bool:
        return not self._eof and self.proc.poll() is None

    def wait_ready(self, timeout: float) -> bool:
        """Whether it has imported the tasks' program (and TensorFlow), waiting at most
        ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self._ready or self._eof, timeout) and self._ready

    def idle(self) -> bool:
        """Whether every task it forked has ended (or it has)."""
        with self._cond:
            return not self.alive() or not self._live

    def fork(self, args: list[str], env: dict, cwd: str | None, log: str | None, user, timeout: float,
             netns: str = "") -> ForkedTask:
        """A task running ``tfsync.engine.server`` with ``args``; OSError where the server
        cannot fork one (a task it forks after ``timeout`` is killed: no task of ours)."""
        with self._cond:
            request = next(self._ids)
            try:
                self.proc.stdin.write(json.dumps({"id": request, "args": args, "env": env, "cwd": cwd, "log": log,
                                                  "user": user, "netns": netns}).encode() + b"\n")
                self.proc.stdin.flush()
            except OSError as e:
                raise OSError(f"the fork server (pid {self.proc.pid}) has ended: {e}") from None
            self._cond.wait_for(lambda: request in self._answers or self._eof, timeout)
            answer = self._answers.pop(request, None)
            if answer is None:
                self._dropped.add(request)
            elif "pid" in answer and request not in self._codes:
                self._live.add(request)
        if answer is None or "pid" not in answer:
            why = answer["error"] if answer else ("has ended" if self._eof else f"did not answer in {timeout:.0f} s")
            raise OSError(f"the fork server (pid {self.proc.pid}) could not fork a task: {why}")
        return ForkedTask(answer["pid"], request, self)

    def exit_code(self, request: int, pid: int) -> int | None:
        with self._cond:
            if request in self._codes:
                return self._codes.pop(request)
            if not self._eof:
                return None
        if running(pid):   # its server is gone: so is it soon, unless this process adopted it
            return None
        with contextlib.suppress(ChildProcessError):   # adopted (a subreaper): reaped here
            os.waitpid(pid, os.WNOHANG)
        return -signal.SIGKILL

    def close(self) -> None:
        """Stop the server; its tasks end with it (unless this process is a subreaper)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()


# -- the fork servers of this process, one per environment ----------------------------------------------
ENV_FORK = "TFSYNC_FORK_TASKS"   # "0": every task its own process, importing TensorFlow itself
KEEP_SERVERS = 2   # fork servers kept for other environments; more are closed once their tasks end
_servers: dict[tuple, ForkServer] = {}
_lock = threading.Lock()


class ForkSettingError(BadInput, ValueError):
    """TFSYNC_FORK_TASKS is neither 0 nor 1."""


def enabled() -> bool:
    """Whether tasks are forked (``TFSYNC_FORK_TASKS``, 1 by default); ForkSettingError
    naming it otherwise."""
    fork = os.environ.get(ENV_FORK, "1")
    if fork not in ("0", "1"):
        raise ForkSettingError(f"{ENV_FORK}={fork!r}: expected 1 (fork tasks from one TensorFlow import, the "
                               "default) or 0 (each task a process of its own)")
    return fork == "1"


def env_key(env: dict) -> tuple:
    """What of ``env`` makes a fork server: all but :data:`VOLATILE_ENV`."""
    return tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE_ENV))


def server_for(env: dict, here: bool = False) -> ForkServer | None:
    """This process's fork server for ``env`` (started where there is none yet: forked
    from this process with ``here``, see :func:`fork_here`); None where forking is off or
    none can start."""
    if not enabled():
        return None
    key = env_key(env)
    with _lock:
        server = _servers.get(key)
        if server is None or not server.alive():
            try:
                forked = fork_here(env) if here else None
                server = _servers[key] = ForkServer(forked) if forked else ForkServer.start(env)
            except OSError as e:
                logger.warning("no fork server for task processes (%s): each imports TensorFlow itself", e)
                return None
            atexit.register(server.close)
            for other in [k for k, s in _servers.items() if k != key and s.idle()][:-KEEP_SERVERS or None]:
                _servers.pop(other).close()
        return server


def prestart(here: bool = False) -> None:
    """Start the fork server of a task with this process's environment now: a process
    that imports TensorFlow while this one goes on (a launcher that imports it later or
    never), or with ``here`` a fork of this process after it imported the tasks' program
    (:func:`fork_here`: call it before this process makes any TensorFlow context)."""
    try:
        server_for(taskcmd.task_env(), here)
    except ForkSettingError:
        pass   # said where a task is started


def fork(args: list[str], env: dict, cwd: str | None, log: str | None, timeout: float,
         netns: str = "", user=None) -> ForkedTask | None:
    """A task running ``tfsync.engine.server`` with ``args``, forked by this process's
    fork server for ``env`` (:func:`server_for`), in network namespace ``netns``, as
    ``user`` (``(uid, gid)``, None: this process's); None where forking is off or no
    server can fork: then the caller starts the task as a process of its own."""
    server = server_for(env)
    if server is None:
        return None
    try:
        return server.fork(args, env, cwd, log, user, timeout, netns)
    except OSError as e:
        logger.warning("%s: starting the task as a process of its own", e)
        return None


def running(pid: int) -> bool:
    """Whether process ``pid`` runs (exists and is no zombie)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[sys.argv.index("--launcher") + 1]))
