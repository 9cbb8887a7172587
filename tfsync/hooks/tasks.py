"""The TF task processes of one node: started, watched, stopped and restarted by its hook.

Commands are built here, never received: a request names a cluster spec, a job name and
an index, and the hook runs ``python -m tfsync.engine.server`` for it with the command
line and environment ``tfsync.base.taskcmd`` builds for ``tfsync.engine.cluster.LocalCluster``
too (own session, log file, ``--parent-pid`` so a task exits when its hook dies), forked
like LocalCluster's from one TensorFlow import (``tfsync.base.forkserver``) where the
program is the TF server. Only processes started here are ever signalled. Tasks in the
hook's own network namespace are behind its firewall where it has one
(``tfsync.hooks.firewall``): only the hosts of their cluster spec reach their ports.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import logging
import os
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field

from tfsync.base import isolation
from tfsync.base import netns as netns_
from tfsync.base import forkserver, safefile, taskcmd
from tfsync.base.exits import BadInput, TfsyncError, shown
from tfsync.hooks import firewall as fw

logger = logging.getLogger(__name__)

TASK_JOBS = ("ps", "worker")  # what tfsync.engine.server runs; "chief" is the coordinator
ENV_ALLOWLIST = frozenset({"TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
                           "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_USE_LEGACY_KERAS"})
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ADDRESS = re.compile(r"[A-Za-z0-9.\-\[\]:]+:(\d{1,5})")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")  # a DNS name
# The program of a task; the hook appends --cluster, --job, --index and --parent-pid.
TASK_COMMAND = taskcmd.SERVER
# The spec travels as one command-line argument: Linux takes at most 128 KiB in one.
MAX_SPEC_BYTES = 120 * 1024
FORK_TIMEOUT = 60.0   # for a fork server's answer (its first includes importing TensorFlow)
MAX_SPEC_NAMES = 256   # host names of one spec the firewall resolves (addresses: no limit)


class TaskRequestError(BadInput, ValueError):
    """A request the hook cannot act on (bad spec, task, env or job id)."""


class TaskConflictError(TfsyncError, RuntimeError):
    """A task runs already with another cluster spec."""


class TaskLaunchError(TfsyncError, RuntimeError):
    """A task process could not be started (its program, the system's limits)."""


def parse_spec(text: str) -> dict[str, list[str]]:
    """The cluster spec JSON -> {job: [host:port, ...]}, checked."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise TaskRequestError(f"cluster spec is {len(text.encode('utf-8', 'surrogatepass'))} bytes; expected at "
                               f"most {MAX_SPEC_BYTES} (it is passed to each task on its command line)")
    try:
        spec = json.loads(text)
    except (TypeError, ValueError, RecursionError) as e:
        raise TaskRequestError(f"cluster spec is not valid JSON ({e}): {str(text)[:80]!r}; expected "
                               '{"ps": ["host:port"], "worker": ["host:port", ...]}') from None
    if not isinstance(spec, dict) or not spec:
        raise TaskRequestError("cluster spec must be a non-empty JSON object of job -> addresses, "
                               f"got {str(text)[:80]!r}")
    for job, addresses in spec.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise TaskRequestError(f"cluster spec job {shown(job)} must list 'host:port' strings, got "
                                   f"{shown(addresses)}")
        for a in addresses:
            m = _ADDRESS.fullmatch(a)
            if not m or not 1 <= int(m.group(1)) <= 65535 or not _host_ok(a[:m.start(1) - 1]):
                raise TaskRequestError(f"cluster spec address {shown(a)} of job {shown(job)} is not host:port with "
                                       "a host name or IP address and a port in 1..65535")
    return spec


def _host_ok(host: str) -> bool:
    """A host name, an IPv4 address, or an IPv6 one (bracketed or not)."""
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
        return True
    except ValueError:
        return len(host) <= 253 and bool(_HOST.fullmatch(host))


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.fullmatch(job_id or ""):
        raise TaskRequestError(f"job_id {shown(job_id)} must be 1-64 characters of letters, digits, '.', '_', '-' "
                               "(it names the task log directory)")
    return job_id


def check_task(spec: dict, job: str, index: int) -> str:
    """The address of task ``job:index`` of ``spec``."""
    if job not in TASK_JOBS:
        raise TaskRequestError(f"task job {shown(job)} cannot run on a node hook; expected one of "
                               f"{', '.join(TASK_JOBS)}")
    if job not in spec:
        raise TaskRequestError(f"task job {job!r} is not in the cluster spec (jobs: {shown(', '.join(sorted(spec)))})")
    if not 0 <= index < len(spec[job]):
        raise TaskRequestError(f"task index {index} of job {job!r} is outside the cluster spec; expected "
                               f"0..{len(spec[job]) - 1}")
    return spec[job][index]


def resolve(host: str) -> set[str]:
    """The addresses a host name has on this node (OSError: none)."""
    return {info[4][0].split("%")[0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}


def spec_sources(spec: dict) -> tuple[tuple[str, ...], list[str]]:
    """The addresses of the spec's hosts (names resolved here) and notes on names that
    do not resolve (their connections will be dropped by the firewall)."""
    hosts = {a.rsplit(":", 1)[0].strip("[]") for addresses in spec.values() for a in addresses}
    out, names, notes = set(), [], []
    for host in hosts:
        try:
            out.add(str(ipaddress.ip_address(host)))
        except ValueError:
            names.append(host)
    if len(names) > MAX_SPEC_NAMES:
        raise TaskRequestError(f"cluster spec names {len(names)} hosts by name; the hook's firewall resolves at "
                               f"most {MAX_SPEC_NAMES} (give addresses)")
    for host in sorted(names):
        try:
            out.update(resolve(host))
        except (OSError, UnicodeError):
            notes.append(f"cluster host {shown(host)} does not resolve on this node: the firewall drops its "
                         "connections to the task ports")
    return tuple(sorted(out)), notes


def check_env(env: dict) -> dict:
    for name, value in env.items():
        if name not in ENV_ALLOWLIST:
            raise TaskRequestError(f"environment variable {shown(name)} may not be set through the hook; allowed: "
                                   f"{', '.join(sorted(ENV_ALLOWLIST))}")
        if len(value) > 256 or "\0" in value:
            raise TaskRequestError(f"environment value of {name} must be under 256 characters without NUL")
    return dict(env)


def _bindable(port: int) -> bool:
    """Whether a server could listen on ``port`` of every interface here (as a TF task does)."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((host, port))
            return True
        except OSError as e:
            if family == socket.AF_INET6 and e.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                continue   # no IPv6 here: IPv4 decides
            return False
    return False


def port_open(address: str, timeout: float = 0.2) -> bool:
    """Whether something accepts connections at ``address`` (False also for a host that
    does not resolve)."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            return s.connect_ex((host.strip("[]"), int(port))) == 0
    except (OSError, UnicodeError, ValueError):  # unresolvable (gaierror), a bad IDNA name
        return False


@dataclass
class Task:
    job_id: str
    job: str
    index: int
    spec_json: str            # canonical (sorted keys) text, as passed to the task
    env: dict
    address: str
    log_path: str
    proc: subprocess.Popen | forkserver.PolledProcess   # forked, or adopted (tfsync.hooks.adopt.Adopted)
    netns: str = ""           # the network namespace it runs in ("": the hook's)
    cwd: str | None = None    # its working directory (a job's stage, or the coordinator's run dir)
    started: float = field(default_factory=time.time)
    restarts: int = 0
    stopped: bool = False     # killed by the hook (not exited by itself)
    ready: bool = False       # its port has been seen open
    sources: tuple[str, ...] = ()   # the spec's host addresses: what the firewall lets reach its port

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def key(self) -> tuple[str, str, int]:
        return self.job_id, self.job, self.index

    @property
    def local_address(self) -> str:
        """Where the hook sees the task serve: TF listens on every interface of its
        namespace, so on loopback in the hook's own; the spec's address may be a relay's
        (tfsync.testbed), which accepts before the task is up."""
        return self.address if self.netns else f"127.0.0.1:{self.address.rsplit(':', 1)[1]}"

    def state(self) -> str:
        """"starting" | "running" | "exited" | "stopped"."""
        if self.proc.poll() is not None:
            return "stopped" if self.stopped else "exited"
        if not self.ready:
            self.ready = port_open(self.local_address)
        return "running" if self.ready else "starting"


class TaskSupervisor:
    """The task processes this hook started, keyed by (job_id, job, index).

    ``task_command`` is the program each task runs (the TF server by default; tests pass a
    stand-in). It is fixed when the hook starts and never comes from a request.
    ``firewall``: the hook's (``tfsync.hooks.firewall``), kept holding the ports of the
    live tasks that run in the hook's own namespace; None: those ports are open, and
    ``open_reason`` says why (with ``warn_open``, in a warning when the first such task
    starts: tasks in a private namespace need no firewall, and get no alarm).
    """

    def __init__(self, log_dir: str, kill_timeout: float = 10.0, task_command=TASK_COMMAND,
                 firewall: fw.Firewall | None = None, open_reason: str = "no firewall was asked for",
                 warn_open: bool = False):
        self.firewall, self.open_reason = firewall, open_reason
        self._warn_open = warn_open and firewall is None
        self.log_dir = log_dir
        self.task_command = tuple(task_command)
        self.kill_timeout = kill_timeout
        self._tasks: dict[tuple[str, str, int], Task] = {}
        self._next_port: dict[tuple[int, int], int] = {}   # FreePorts' range -> where the next search starts
        self._lock = threading.Lock()

    def tasks(self, job_id: str = "") -> list[Task]:
        with self._lock:
            return [t for t in self._tasks.values() if not job_id or t.job_id == job_id]

    def start(self, job_id: str, spec_text: str, refs: list[tuple[str, int]],
              env: dict, netns: str = "", cwd: str | None = None) -> tuple[list[Task], list[str]]:
        """Start the tasks ``refs`` of the spec (in network namespace ``netns``, a tfsync
        private network, when given; in directory ``cwd``); running ones with the same
        spec are returned."""
        check_job_id(job_id)
        if netns:
            try:
                if len(netns) > 64:
                    raise ValueError(f"network namespace {shown(netns)} is not a tfsync private network "
                                     "(tfsync-<pid>-<n>)")
                netns_.check_name(netns)
            except ValueError as e:
                raise TaskRequestError(str(e)) from None
        spec = parse_spec(spec_text)
        if not refs:
            raise TaskRequestError("StartTasks names no tasks; expected at least one (job, index) of the spec")
        addresses = [check_task(spec, job, index) for job, index in refs]
        env, canonical = check_env(env), json.dumps(spec, sort_keys=True)
        self._warm(env)
        sources, notes = spec_sources(spec) if self.firewall is not None and not netns else ((), [])
        out = []
        with self._lock:
            todo = []
            for (job, index), address in zip(refs, addresses):
                old = self._tasks.get((job_id, job, index))
                if old is not None and old.proc.poll() is None:
                    if old.spec_json != canonical:
                        raise TaskConflictError(f"task {job}:{index} of job {job_id!r} runs with another cluster "
                                                "spec; StopTasks it first")
                    notes.append(f"{job}:{index} already running (pid {old.proc.pid})")
                    todo.append((old, None))
                else:
                    todo.append((old, address))
            if not netns:   # their ports guarded before they open
                self._guard([(job_id, int(a.rsplit(":", 1)[1]), sources) for _, a in todo if a is not None])
                if self._warn_open and any(a is not None for _, a in todo):
                    self._warn_open = False
                    logger.warning("tfsync hook: TF task ports of this node listen on every interface, "
                                   "unprotected (no firewall): %s", self.open_reason)
            for (job, index), (old, address) in zip(refs, todo):
                if address is None:
                    out.append(old)
                    continue
                task = self._launch(job_id, job, index, canonical, env, address, netns, cwd)
                task.restarts, task.sources = (old.restarts if old else 0), sources
                self._tasks[task.key] = task
                out.append(task)
        return out, notes

    def _guard(self, pending=()) -> None:
        """Make the firewall hold the ports of the live tasks in this namespace and of
        ``pending`` ``(job_id, port, sources)``; on failure it is dropped (and said once):
        the ports are open from then on, and replies say so. Called with the lock held."""
        if self.firewall is None:
            return
        jobs: dict[str, tuple[set, set]] = {}
        live = [(t.job_id, t.port, t.sources) for t in self._tasks.values() if not t.netns and t.proc.poll() is None]
        for job_id, port, sources in [*live, *pending]:
            ports, allowed = jobs.setdefault(job_id, (set(), set()))
            ports.add(port)
            allowed.update(sources)
        try:
            self.firewall.sync([fw.Guard(j, tuple(sorted(p)), tuple(sorted(a))) for j, (p, a) in sorted(jobs.items())])
        except (fw.FirewallError, ValueError) as e:
            logger.warning("tfsync hook: the firewall failed, task ports of this node are open from now on: %s", e)
            self.firewall.close()
            self.firewall, self.open_reason = None, f"the firewall failed: {e}"

    def refresh_firewall(self) -> None:
        """Drop the ports of tasks that ended by themselves from the firewall."""
        with self._lock:
            self._guard()

    def protection(self, tasks: list[Task]) -> str:
        """What keeps others off ``tasks``' ports, in one line (for StartTasks replies)."""
        if tasks and all(t.netns for t in tasks):
            return f"private network namespace {tasks[0].netns} of the node: not reachable from other machines"
        if isolation.active():
            return netns_.describe(None)
        if self.firewall is None:
            return f"every interface, unprotected: {self.open_reason}"
        ports = sorted({t.port for t in tasks if not t.netns})
        sources = sorted({*fw.LOOPBACK, *self.firewall.allow, *(s for t in tasks for s in t.sources)})
        return (f"firewalled: port{'s' if len(ports) > 1 else ''} {', '.join(map(str, ports))} of this node accept "
                f"only {', '.join(sources)} (nftables table inet {self.firewall.table})")

    def _forking(self) -> bool:
        try:
            return self.task_command == TASK_COMMAND and forkserver.enabled()
        except forkserver.ForkSettingError as e:
            raise TaskLaunchError(str(e)) from None

    def _warm(self, env: dict) -> None:
        """Have the fork server of ``env`` import TensorFlow now, without the
        lock (calls such as Health take it meanwhile), so that a task forks at once."""
        server = forkserver.server_for(taskcmd.task_env(env)) if self._forking() else None
        if server is not None:
            server.wait_ready(FORK_TIMEOUT)

    def _launch(self, job_id, job, index, spec_json, env, address, netns="", cwd=None) -> Task:
        forking = self._forking()
        cmd = taskcmd.task_command(spec_json, job, index, program=self.task_command)
        full_env = taskcmd.task_env(env)
        log_dir = os.path.join(self.log_dir, job_id)
        made_dir = not os.path.isdir(log_dir)
        safefile.make_dir(log_dir, 0o700)
        log_path = os.path.join(log_dir, f"{job}-{index}.log")
        made_log = not os.path.lexists(log_path)
        try:
            with safefile.open_append(log_path, mode=0o600, binary=True) as out:
                proc = (forking and forkserver.fork(cmd[len(TASK_COMMAND):], full_env, cwd, log_path, FORK_TIMEOUT,
                                                    netns, netns_.task_user() if netns else None)) or subprocess.Popen(
                    netns_.command_in(netns, cmd) if netns else cmd, env=full_env, stdout=out,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd)
        except OSError as e:  # nothing of a task that never ran stays behind
            with contextlib.suppress(OSError):
                if made_log:
                    os.unlink(log_path)
                if made_dir:
                    os.rmdir(log_dir)
            if isinstance(e, safefile.UnsafePathError):
                raise
            raise TaskLaunchError(f"task {job}:{index} of job {job_id!r} could not start: "
                                  f"{e.strerror or e}") from None
        logger.info("started %s %s:%d at %s, pid %d", job_id, job, index, address, proc.pid)
        return Task(job_id, job, index, spec_json, env, address, log_path, proc, netns, cwd)

    def _kill(self, task: Task) -> None:
        if task.proc.poll() is None:
            task.stopped = True
            task.proc.kill()
        try:
            task.proc.wait(timeout=self.kill_timeout)
        except subprocess.TimeoutExpired:  # pragma: no cover - the kernel is slow to reap
            logger.warning("task %s %s:%d pid %d still alive %.0f s after SIGKILL", task.job_id, task.job,
                           task.index, task.proc.pid, self.kill_timeout)

    def stop(self, job_id: str, refs: list[tuple[str, int]]) -> tuple[list[Task], list[str]]:
        """Kill tasks (all of the job's when ``refs`` is empty). Unknown ones are a no-op."""
        check_job_id(job_id)
        with self._lock:
            keys = [(job_id, j, i) for j, i in refs] or [k for k in self._tasks if k[0] == job_id]
            found, notes = [self._tasks[k] for k in keys if k in self._tasks], []
            for k in keys:
                if k not in self._tasks:
                    notes.append(f"{k[1]}:{k[2]} of job {job_id!r} was not started by this hook; nothing to stop")
            for task in found:
                if task.proc.poll() is not None:
                    notes.append(f"{task.job}:{task.index} already ended (code {task.proc.returncode})")
                self._kill(task)
                logger.info("stopped %s %s:%d (pid %d)", job_id, task.job, task.index, task.proc.pid)
            self._guard()
        return found, notes

    def restart(self, job_id: str, job: str, index: int, expected_pid: int = 0) -> Task:
        """Kill one task this hook started and start it again with the same spec and env."""
        check_job_id(job_id)
        with self._lock:
            old = self._tasks.get((job_id, job, index))
        if old is not None:
            self._warm(old.env)
        with self._lock:
            old = self._tasks.get((job_id, job, index))
            if old is None:
                raise KeyError(f"task {job}:{index} of job {job_id!r} was not started by this hook; "
                               "StartTasks it first")
            if expected_pid and old.proc.pid != expected_pid and old.proc.poll() is None:
                return old  # a retried restart: it happened already
            self._kill(old)
            task = self._launch(job_id, job, index, old.spec_json, old.env, old.address, old.netns, old.cwd)
            task.restarts, task.sources = old.restarts + 1, old.sources
            self._tasks[task.key] = task
            self._guard()
            return task

    def free_ports(self, first: int, last: int, count: int) -> list[int]:
        """``count`` ports of ``first..last`` that nothing on this node listens on and no
        task of this hook is starting on, in turn after the last ones handed out."""
        if not 1 <= first <= last <= 65535:
            raise TaskRequestError(f"FreePorts: first..last {first}..{last} is not within 1..65535")
        if not 1 <= count <= min(last - first + 1, 1024):
            raise TaskRequestError(f"FreePorts: count {count}: expected 1 to the {last - first + 1} ports of the "
                                   "range (at most 1024)")
        with self._lock:
            taken = {int(t.address.rsplit(":", 1)[1]) for t in self._tasks.values() if t.proc.poll() is None}
            size, start = last - first + 1, self._next_port.get((first, last), first)
            out = []
            for k in range(size):
                port = first + (start - first + k) % size
                if port not in taken and _bindable(port):
                    out.append(port)
                    if len(out) == count:
                        self._next_port[(first, last)] = first + (port - first + 1) % size
                        return out
        raise TaskLaunchError(f"FreePorts: only {len(out)} of ports {first}..{last} are free on this node, "
                              f"{count} asked")

    def wait_ready(self, tasks: list[Task], timeout: float) -> None:
        """Wait until every task serves or ends, at most ``timeout`` seconds (no error)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(t.state() == "starting" for t in tasks):
            time.sleep(0.05)

    def adopt(self, rows: list[dict]) -> list[Task]:
        """Take over the tasks a previous program of this hook (before its exec) started
        and that still run (tfsync.hooks.adopt); their ports are guarded again at once."""
        from tfsync.hooks.adopt import FIELDS, Adopted
        adopted = []
        with self._lock:
            for row in rows:
                proc = Adopted(int(row["pid"]), float(row["created"]))
                if proc.poll() is not None:
                    continue
                task = Task(**{k: row[k] for k in FIELDS if k != "sources"}, proc=proc,
                            sources=tuple(row["sources"]))
                self._tasks[task.key] = task
                adopted.append(task)
            self._guard()
        for t in adopted:
            logger.info("adopted %s %s:%d at %s, pid %d", t.job_id, t.job, t.index, t.address, t.proc.pid)
        return adopted

    def shutdown(self) -> None:
        """Kill every task process this hook started, then remove its firewall table."""
        with self._lock:
            tasks = list(self._tasks.values())
        for task in tasks:
            self._kill(task)
        with self._lock:
            if self.firewall is not None:
                self.firewall.close()
