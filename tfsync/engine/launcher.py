"""Start a cluster spec's TF tasks through node hooks (``tfsync.hooks.node``), in parallel.

    launcher = HookLauncher([("10.0.0.1:7070", token), ("10.0.0.2:7070", token)])
    launcher.start(spec)          # StartTasks on every hook at once; returns when every port is open
    launcher.restart_all()        # RestartTask of every task at once (a restart switch)
    launcher.stop()               # StopTasks on every hook, close the channels

Sync-Switch's cluster manager actuates its nodes in parallel: that halves cluster
initialisation and cuts switching time about 3x against one node after another (paper
003, Table III). ``parallel=False`` is that sequential actuator, kept for comparison:
one hook (one task, for restarts) at a time, each waited for before the next.

A task counts as ready when its hook reports it RUNNING, i.e. the hook saw the task's
port open on its own node (the hook waits for it, ``wait_ready_s``, and the launcher
polls ``Health`` if that wait ends early). Timings: ``init_s`` (start), ``restart_s``
(last restart_all), ``stop_s``, and per call in ``calls``.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tfsync.api import client, transport
from tfsync.api.v1 import common_pb2, node_hook_pb2, node_hook_pb2_grpc
from tfsync.base import safefile
from tfsync.base.exits import TfsyncError

logger = logging.getLogger(__name__)

__all__ = ["HookLauncher", "LaunchError", "TASK_JOBS", "place", "round_robin"]

TASK_JOBS = ("ps", "worker")   # the jobs hooks run; "chief" is the coordinator, not launched
RUNNING = common_pb2.TASK_STATE_RUNNING
STARTING = common_pb2.TASK_STATE_STARTING
_STATE_NAMES = {v: k for k, v in common_pb2.TaskState.items()}
RPC_MARGIN_S = 10.0            # an RPC's deadline is its wait_ready_s plus this
STAGE_CHUNK = 2**20            # StageFile's chunks (gRPC's default message limit is 4 MiB)
STAGE_MIN_RATE = 2**20         # bytes/s: a StageFile slower than this on top of a minute fails
_digests: dict[tuple, tuple[str, int]] = {}   # (path, size, mtime) -> (sha256, size)


def file_digest(path: str) -> tuple[str, int]:
    """SHA-256 (hex) and size of the file at ``path``, computed once per version of it."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        _digests[key] = (safefile.sha256(path), st.st_size)
    return _digests[key]


UNKNOWN_PORTS = "every interface, unprotected as far as is known: the hook did not say (older than this tfsync)"
_warned: set[str] = set()


def _warn_open(address: str, task_ports: str) -> None:
    """Say once per hook (in this process) that its task ports are open."""
    if task_ports.startswith(("firewalled", "private network namespace")) or address in _warned:
        return
    _warned.add(address)
    logger.warning("TF task ports on the node of hook %s listen on %s", address, task_ports)


class LaunchError(TfsyncError, RuntimeError):
    """A hook refused or failed a call, or a task did not come up; the message names both."""


@dataclass
class CallTiming:
    what: str        # "start" | "restart" | "stop"
    hook: str        # its address
    tasks: str       # "ps:0,worker:1"
    seconds: float


def _name(task) -> str:
    job, index = task
    return f"{job}:{index}"


def spec_tasks(spec: dict) -> list[tuple[str, int]]:
    """The tasks of ``spec`` that hooks run: every PS, then every worker."""
    return [(job, i) for job in TASK_JOBS for i in range(len(spec.get(job, ())))]


def round_robin(tasks: list[tuple[str, int]], hooks: int) -> dict[tuple[str, int], int]:
    """task -> hook index, task ``k`` on hook ``k % hooks``."""
    return {task: k % hooks for k, task in enumerate(tasks)}


def place(tasks: list[tuple[str, int]], live: list[int], pinned: dict | None = None) -> dict[tuple[str, int], int]:
    """task -> hook index: a pinned task on its hook if that one is live, the others
    round-robin over the live hooks (in ``live``'s order)."""
    pinned = pinned or {}
    out = {t: pinned[t] for t in tasks if pinned.get(t) in live}
    rest = [t for t in tasks if t not in out]
    out.update({t: live[h] for t, h in round_robin(rest, len(live)).items()})
    return {t: out[t] for t in tasks}


class HookLauncher:
    """Launch, restart and stop a cluster's TF tasks through NodeHook gRPC calls.

    ``hooks``: ``[(address, token), ...]``, one per node. ``timeout``: how long a task may
    take to open its port (each call's deadline adds ``RPC_MARGIN_S``). ``tls``: the
    client TLS config for every hook (None: plaintext, loopback only by convention).
    ``env``: extra task environment (only the hook's allowlist is accepted). ``netns``:
    the network namespace, on every node, the tasks run in (tfsync.base.netns; "": the hooks').
    ``files``: ``[(name, local path), ...]`` copied to every hook (StageFile) before its
    tasks start, into the stage ``stage_id``, where the tasks then run (their working
    directory: ``name`` is the path they open). ``workdir``: instead, a directory the
    tasks run in, for hooks on this machine.
    """

    def __init__(self, hooks, parallel: bool = True, timeout: float = 120.0, *, job_id: str | None = None,
                 tls: transport.TlsConfig | None = None, env: dict | None = None, poll_s: float = 0.05,
                 netns: str = "", files=(), stage_id: str = "", workdir: str = ""):
        hooks = [tuple(h) for h in hooks]
        if not hooks:
            raise ValueError("HookLauncher needs at least one hook, as (address, token)")
        for h in hooks:
            if len(h) != 2 or not h[0] or not h[1]:
                raise ValueError(f"a hook is (address, token) with both non-empty, got {h[:1]!r} (token hidden)")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.addresses = [a for a, _ in hooks]
        if len(set(self.addresses)) != len(self.addresses):
            raise ValueError(f"hook addresses repeat: {self.addresses}; give each node's hook once")
        self.parallel = parallel
        self.timeout = float(timeout)
        self.job_id = job_id or f"tfsync-{uuid.uuid4().hex[:12]}"
        self.env = dict(env or {})
        self.poll_s = poll_s
        self.netns = netns   # the nodes' network namespace the tasks run in ("": the hooks')
        self.files, self.stage_id, self.workdir = list(files), stage_id, workdir
        if self.files and not stage_id:
            raise ValueError("files to stage need a stage_id (the job's stage directory on each node)")
        self.tls = tls
        self._channels = [transport.make_channel(a, token=t, tls=tls) for a, t in hooks]
        self._stubs = [client.Client(node_hook_pb2_grpc.NodeHookStub(c)) for c in self._channels]
        self.spec: dict | None = None
        self.assignment: dict[tuple[str, int], int] = {}       # task -> hook index
        self.status: dict[tuple[str, int], common_pb2.TaskStatus] = {}
        self.init_s: float | None = None
        self.restart_s: float | None = None
        self.stop_s: float | None = None
        self.calls: list[CallTiming] = []
        self.task_ports: dict[int, str] = {}   # hook index -> what its StartTasks said protects its task ports
        self._touched: set[int] = set()   # hooks sent a StartTasks: the ones stop() must clean
        self._closed = False

    # -- helpers ------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return "parallel" if self.parallel else "sequential"

    @property
    def pids(self) -> dict[tuple[str, int], int]:
        return {task: s.pid for task, s in self.status.items()}

    def tasks_of(self, hook: int) -> list[tuple[str, int]]:
        return [t for t, h in self.assignment.items() if h == hook]

    def _run(self, fn, items, keep_going: bool = False):
        """``fn(item)`` for every item: all at once (a thread each) or one after another.
        In parallel every item runs even if some fail; sequentially the first failure ends
        the run unless ``keep_going``. The first failure (in item order) is raised."""
        if self.parallel and len(items) > 1:
            with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="hook-launch") as pool:
                futures = [pool.submit(fn, item) for item in items]
                outcomes = []
                for f in futures:
                    try:
                        outcomes.append((f.result(), None))
                    except Exception as e:  # noqa: BLE001 - re-raised below
                        outcomes.append((None, e))
        else:
            outcomes = []
            for item in items:
                try:
                    outcomes.append((fn(item), None))
                except Exception as e:  # noqa: BLE001
                    outcomes.append((None, e))
                    if not keep_going:
                        break  # sequential: stop at the first failure, like an operator would
        errors = [e for _, e in outcomes if e is not None]
        if errors:
            if len(errors) > 1:
                logger.error("%d hook calls failed; first raised, others: %s", len(errors),
                             "; ".join(str(e) for e in errors[1:]))
            raise errors[0]
        return [r for r, _ in outcomes]

    def _rpc_error(self, hook: int, what: str, tasks, e: client.CallFailed) -> LaunchError:
        names = ", ".join(_name(t) for t in tasks) or "all tasks"
        hint = ""
        if isinstance(e, client.TokenRefused):
            hint = "; the launcher's token for this hook is not the job token the hook was started with"
        elif e.code == "UNAVAILABLE":
            cause = transport.diagnose(self.addresses[hook], self.tls, ("cluster.tls_ca", "cluster.tls_server_name"))
            hint = f"; {cause}" if cause else "; is the hook running at that address (python -m tfsync.hooks.node)?"
        elif e.code == "DEADLINE_EXCEEDED":
            hint = f"; raise timeout (now {self.timeout:.0f} s) on a loaded machine"
        return LaunchError(f"hook {self.addresses[hook]}: {what} of {names} (job {self.job_id}) failed: {e}{hint}")

    def _check(self, hook: int, statuses, deadline: float, what: str) -> list[common_pb2.TaskStatus]:
        """Statuses of ``hook``'s tasks once all are RUNNING (polling Health while some are
        STARTING); LaunchError if one ended or the deadline passes."""
        statuses = list(statuses)
        while True:
            for s in statuses:
                if s.state not in (RUNNING, STARTING):
                    state = str(_STATE_NAMES.get(s.state, s.state)).removeprefix("TASK_STATE_")
                    raise LaunchError(
                        f"hook {self.addresses[hook]}: task {s.task.job}:{s.task.index} (pid {s.pid}) of job "
                        f"{self.job_id} is {state} with code {s.exit_code} after "
                        f"{what}; see {s.log_path} on that node")
            starting = [s for s in statuses if s.state == STARTING]
            if not starting:
                return statuses
            if time.monotonic() > deadline:
                s = starting[0]
                raise LaunchError(
                    f"hook {self.addresses[hook]}: task {s.task.job}:{s.task.index} (pid {s.pid}) of job "
                    f"{self.job_id} did not open {s.address} within {self.timeout:.0f} s after {what}; see "
                    f"{s.log_path} on that node, or raise timeout on a loaded machine")
            time.sleep(self.poll_s)
            wanted = {(s.task.job, s.task.index) for s in statuses}
            try:
                health = self._stubs[hook].Health(node_hook_pb2.HealthRequest(), timeout=RPC_MARGIN_S)
            except client.CallFailed as e:
                raise self._rpc_error(hook, "Health", sorted(wanted), e) from None
            now = {(t.task.job, t.task.index): t for t in health.tasks if t.job_id == self.job_id}
            statuses = [now.get((s.task.job, s.task.index), s) for s in statuses]

    # -- lifecycle ----------------------------------------------------------------------
    def check_hooks(self) -> list[node_hook_pb2.HealthResponse]:
        """Health of every hook that runs a task (token and reachability checked before
        anything starts); every hook before anything is assigned."""
        def one(hook):
            try:
                return self._stubs[hook].Health(node_hook_pb2.HealthRequest(), timeout=RPC_MARGIN_S)
            except client.CallFailed as e:
                raise self._rpc_error(hook, "Health", self.tasks_of(hook), e) from None
        used = sorted(set(self.assignment.values())) or list(range(len(self._stubs)))
        return self._run(one, used)

    def _stage(self, hook: int) -> None:
        """Copy ``files`` to ``hook``'s node (a file already there is not sent again)."""
        for name, path in self.files:
            digest, size = file_digest(path)

            def chunks():
                yield node_hook_pb2.FileChunk(stage_id=self.stage_id, name=name, sha256=digest, size=size)
                with open(path, "rb") as f:
                    while data := f.read(STAGE_CHUNK):
                        yield node_hook_pb2.FileChunk(data=data)
            t0 = time.monotonic()
            try:
                reply = self._stubs[hook].StageFile(chunks(), timeout=RPC_MARGIN_S + 60 + size / STAGE_MIN_RATE)
            except client.CallFailed as e:
                raise self._rpc_error(hook, f"StageFile of {name} for", self.tasks_of(hook), e) from None
            if not reply.existed:
                logger.info("staged %s (%d bytes) on %s in %.2f s", name, size, self.addresses[hook],
                            time.monotonic() - t0)

    def start(self, spec: dict, mapping: dict | None = None) -> "HookLauncher":
        """Start every PS and worker task of ``spec`` on its hook; return when all serve.

        ``mapping``: ``{(job, index): hook}`` with hook an index into ``hooks`` or an
        address; None assigns the tasks round-robin (PS first). On failure every task
        already started is stopped and LaunchError raised.
        """
        if self._closed:
            raise LaunchError("this launcher was stopped; make a new HookLauncher")
        if self.spec is not None:
            raise LaunchError(f"job {self.job_id} was started already; restart_all() or stop() it")
        tasks = spec_tasks(spec)
        if not tasks:
            raise ValueError(f"cluster spec has no ps or worker tasks: jobs {sorted(spec)}")
        self.assignment = self._assign(tasks, mapping)
        spec_json = json.dumps(spec)
        hooks = sorted({h for h in self.assignment.values()})

        def one(hook):
            mine = self.tasks_of(hook)
            t0 = time.monotonic()
            self._touched.add(hook)
            self._stage(hook)
            request = node_hook_pb2.StartTasksRequest(
                job_id=self.job_id, cluster_spec_json=spec_json, env=self.env, wait_ready_s=self.timeout,
                netns=self.netns, tasks=[common_pb2.TaskRef(job=j, index=i) for j, i in mine],
                stage_id=self.stage_id, workdir=self.workdir)
            try:
                reply = self._stubs[hook].StartTasks(request, timeout=self.timeout + RPC_MARGIN_S)
            except client.CallFailed as e:
                raise self._rpc_error(hook, "StartTasks", mine, e) from None
            for s in reply.tasks:   # recorded before the readiness check so stop() can see them
                self.status[(s.task.job, s.task.index)] = s
            self.task_ports[hook] = reply.task_ports or UNKNOWN_PORTS
            _warn_open(self.addresses[hook], self.task_ports[hook])
            statuses = self._check(hook, reply.tasks, t0 + self.timeout, "StartTasks")
            for s in statuses:
                self.status[(s.task.job, s.task.index)] = s
            self.calls.append(CallTiming("start", self.addresses[hook], ",".join(map(_name, mine)),
                                         time.monotonic() - t0))

        self.spec = spec
        t0 = time.monotonic()
        try:
            self.check_hooks()
            self._run(one, hooks)
        except BaseException:
            self._cleanup_after_failure()
            raise
        self.init_s = time.monotonic() - t0
        logger.info("job %s: %d tasks on %d hooks up in %.2f s (%s)", self.job_id, len(tasks), len(hooks),
                    self.init_s, self.mode)
        return self

    def _assign(self, tasks, mapping) -> dict[tuple[str, int], int]:
        if mapping is None:
            return round_robin(tasks, len(self._stubs))
        out = {}
        for task in tasks:
            if task not in mapping:
                raise ValueError(f"mapping has no hook for task {_name(task)}; expected every task of the spec: "
                                 f"{', '.join(map(_name, tasks))}")
            hook = mapping[task]
            if isinstance(hook, str):
                if hook not in self.addresses:
                    raise ValueError(f"mapping puts task {_name(task)} on hook {hook!r}, which is not one of "
                                     f"{self.addresses}")
                hook = self.addresses.index(hook)
            if not isinstance(hook, int) or not 0 <= hook < len(self._stubs):
                raise ValueError(f"mapping puts task {_name(task)} on hook {hook!r}; expected an address or an "
                                 f"index 0..{len(self._stubs) - 1}")
            out[task] = hook
        extra = set(mapping) - set(tasks)
        if extra:
            raise ValueError(f"mapping names tasks not in the spec: {', '.join(map(_name, sorted(extra)))}")
        return out

    def restart_all(self) -> float:
        """Kill and start again every task (RestartTask each, in parallel or one by one);
        return the seconds until every port was open again (also ``restart_s``)."""
        if self._closed:
            raise LaunchError("restart_all(): this launcher was stopped; make a new HookLauncher and start(spec)")
        if self.spec is None:
            raise LaunchError("restart_all() needs a started launcher; call start(spec) first")
        tasks = list(self.assignment)

        def one(task):
            hook, old = self.assignment[task], self.status.get(task)
            t0 = time.monotonic()
            request = node_hook_pb2.RestartTaskRequest(
                job_id=self.job_id, task=common_pb2.TaskRef(job=task[0], index=task[1]),
                expected_pid=old.pid if old is not None else 0, wait_ready_s=self.timeout)
            try:
                s = self._stubs[hook].RestartTask(request, timeout=self.timeout + RPC_MARGIN_S)
            except client.CallFailed as e:
                raise self._rpc_error(hook, "RestartTask", [task], e) from None
            self.status[task] = s
            s, = self._check(hook, [s], t0 + self.timeout, "RestartTask")
            self.status[task] = s
            self.calls.append(CallTiming("restart", self.addresses[hook], _name(task), time.monotonic() - t0))

        t0 = time.monotonic()
        self._run(one, tasks)
        self.restart_s = time.monotonic() - t0
        logger.info("job %s: %d tasks restarted in %.2f s (%s)", self.job_id, len(tasks), self.restart_s, self.mode)
        return self.restart_s

    def _stop_tasks(self) -> list[common_pb2.TaskStatus]:
        hooks = sorted(self._touched)

        def one(hook):
            t0 = time.monotonic()
            try:
                reply = self._stubs[hook].StopTasks(node_hook_pb2.StopTasksRequest(job_id=self.job_id),
                                                    timeout=30.0 + RPC_MARGIN_S)
            except client.CallFailed as e:
                raise self._rpc_error(hook, "StopTasks", self.tasks_of(hook), e) from None
            self.calls.append(CallTiming("stop", self.addresses[hook], ",".join(map(_name, self.tasks_of(hook))),
                                         time.monotonic() - t0))
            return list(reply.tasks)

        out = [s for statuses in self._run(one, hooks, keep_going=True) for s in statuses]
        self._touched.clear()
        return out

    def _cleanup_after_failure(self) -> None:
        try:
            self._stop_tasks()
        except Exception as e:  # noqa: BLE001 - the original error is the one to raise
            logger.warning("job %s: could not stop every task after a failed start: %s", self.job_id, e)
        self.spec = None

    def stop(self, skip=()) -> list[common_pb2.TaskStatus]:
        """Stop every task of this job on every hook it used (but the hooks in ``skip``),
        then close the channels. Safe to call twice; the hooks themselves keep running."""
        if self._closed:
            return []
        self._touched -= set(skip)
        stopped: list[common_pb2.TaskStatus] = []
        t0 = time.monotonic()
        try:
            if self._touched:
                stopped = self._stop_tasks()
        finally:
            self.stop_s = time.monotonic() - t0
            self.close()
        for s in stopped:
            self.status[(s.task.job, s.task.index)] = s
        return stopped

    def close(self) -> None:
        """Close the channels (tasks keep running: use stop() to end them)."""
        self._closed = True
        for c in self._channels:
            c.close()

    def __enter__(self) -> "HookLauncher":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
