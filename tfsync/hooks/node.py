"""The node hook agent: a NodeHook gRPC server that runs this node's TF task processes.

    server, port = serve("127.0.0.1:0", token=token)   # the manager dials port
    ...
    server.stop()                                       # also kills the tasks it started

Requests are checked before anything runs; a bad one gets INVALID_ARGUMENT with the
reason and the hook goes on serving. Every call requires the job token
(``tfsync.api.auth``). Run one per node: ``python -m tfsync.hooks.node --help``.
SIGHUP restarts the hook in place (a new tfsync installed, say): it re-executes itself
and keeps its running tasks (tfsync.hooks.adopt).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

import grpc
import psutil

from tfsync.api import auth, transport
from tfsync.api.v1 import common_pb2, node_hook_pb2, node_hook_pb2_grpc
from tfsync.base import forkserver, isolation, safefile
from tfsync.base.exits import BadInput, fail, interrupt, report_error
from tfsync.hooks import adopt, firewall
from tfsync.hooks.resources import ResourceSampler, node_name
from tfsync.hooks.stage import Stage
from tfsync.hooks.tasks import (ENV_ALLOWLIST, TASK_COMMAND, TASK_JOBS, Task, TaskConflictError, TaskLaunchError,
                                TaskRequestError, TaskSupervisor, check_job_id, shown)

logger = logging.getLogger(__name__)

__all__ = ["serve", "HookServer", "NodeHookService", "ENV_ALLOWLIST"]

VERSION = "tfsync.api.v1"
DEFAULT_INTERVAL = 1.0
MIN_INTERVAL = 0.05
MAX_INTERVAL = 3600.0
MAX_WAIT = 600.0  # wait_ready_s
_STATES = {"starting": common_pb2.TASK_STATE_STARTING, "running": common_pb2.TASK_STATE_RUNNING,
           "exited": common_pb2.TASK_STATE_EXITED, "stopped": common_pb2.TASK_STATE_STOPPED}


def _status(task: Task) -> common_pb2.TaskStatus:
    state = task.state()
    code = task.proc.returncode
    return common_pb2.TaskStatus(
        job_id=task.job_id, task=common_pb2.TaskRef(job=task.job, index=task.index), pid=task.proc.pid,
        state=_STATES[state], exit_code=code if code is not None else 0, address=task.address,
        log_path=task.log_path, started=task.started, restarts=task.restarts)


def _refs(refs) -> list[tuple[str, int]]:
    out = []
    for r in refs:
        if r.job not in TASK_JOBS:
            raise TaskRequestError(f"task job {shown(r.job)} cannot run on a node hook; expected one of "
                                   f"{', '.join(TASK_JOBS)}")
        if r.index < 0:
            raise TaskRequestError(f"task index {r.index} of job {r.job!r} is negative; expected 0 or more")
        out.append((r.job, r.index))
    return out


def _wait(seconds: float) -> float:
    if not 0 <= seconds <= MAX_WAIT:  # also catches NaN
        raise TaskRequestError(f"wait_ready_s {seconds}: expected 0 (do not wait) to {MAX_WAIT:.0f} seconds")
    return seconds


def _guard(method):
    """Map the hook's typed errors to gRPC status codes (the server keeps serving)."""

    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except TaskRequestError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except (TaskConflictError, TaskLaunchError, safefile.UnsafePathError) as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except KeyError as e:
            context.abort(grpc.StatusCode.NOT_FOUND, e.args[0] if e.args else str(e))

    wrapper.__name__ = method.__name__
    return wrapper


class NodeHookService(node_hook_pb2_grpc.NodeHookServicer):
    def __init__(self, supervisor: TaskSupervisor, node: str, stopping: threading.Event):
        self.supervisor = supervisor
        self.stage = Stage(os.path.join(supervisor.log_dir, "stage"))
        self.node = node
        self._stopping = stopping
        self._born = time.monotonic()

    @_guard
    def StartTasks(self, request, context):
        wait, began = _wait(request.wait_ready_s), time.monotonic()
        tasks, notes = self.supervisor.start(request.job_id, request.cluster_spec_json, _refs(request.tasks),
                                             dict(request.env), request.netns, self._workdir(request))
        if wait > 0:   # the start counts (a fork server's first import of TensorFlow)
            self.supervisor.wait_ready(tasks, wait - (time.monotonic() - began))
        return node_hook_pb2.TasksResponse(tasks=[_status(t) for t in tasks], messages=notes,
                                           task_ports=self.supervisor.protection(tasks))

    def _workdir(self, request) -> str | None:
        if request.stage_id and request.workdir:
            raise TaskRequestError("StartTasks: give stage_id or workdir, not both")
        if request.workdir:
            if not os.path.isabs(request.workdir) or not os.path.isdir(request.workdir):
                raise TaskRequestError(f"StartTasks: workdir {request.workdir!r} is not an absolute path of a "
                                       "directory on this node")
            return request.workdir
        return self.stage.dir(request.stage_id) if request.stage_id else None

    @_guard
    def StageFile(self, request_iterator, context):
        existed, size = self.stage.receive(request_iterator)
        return node_hook_pb2.StageFileResponse(existed=existed, size=size)

    @_guard
    def FreePorts(self, request, context):
        return node_hook_pb2.FreePortsResponse(ports=self.supervisor.free_ports(request.first, request.last,
                                                                                request.count))

    @_guard
    def StopTasks(self, request, context):
        tasks, notes = self.supervisor.stop(request.job_id, _refs(request.tasks))
        return node_hook_pb2.TasksResponse(tasks=[_status(t) for t in tasks], messages=notes)

    @_guard
    def RestartTask(self, request, context):
        (job, index), = _refs([request.task])
        wait, began = _wait(request.wait_ready_s), time.monotonic()
        task = self.supervisor.restart(request.job_id, job, index, request.expected_pid)
        if wait > 0:
            self.supervisor.wait_ready([task], wait - (time.monotonic() - began))
        return _status(task)

    @_guard
    def StreamResources(self, request, context):
        interval = request.interval_s if request.HasField("interval_s") else DEFAULT_INTERVAL
        if not interval >= MIN_INTERVAL:  # also catches NaN
            raise TaskRequestError(f"interval_s {interval} is too small; expected >= {MIN_INTERVAL} s "
                                   f"(unset: {DEFAULT_INTERVAL} s)")
        if interval > MAX_INTERVAL:
            raise TaskRequestError(f"interval_s {interval} is too large; expected <= {MAX_INTERVAL:.0f} s")
        if request.job_id:
            check_job_id(request.job_id)
        if request.max_samples < 0:
            raise TaskRequestError(f"max_samples {request.max_samples} is negative; expected 0 (no limit) or more")
        return self._samples(interval, request.job_id, request.max_samples, context)

    def _samples(self, interval, job_id, limit, context):
        sampler, sent = ResourceSampler(), 0
        next_at = time.monotonic() + interval
        while context.is_active() and not self._stopping.is_set():
            if self._stopping.wait(max(0.0, next_at - time.monotonic())):
                break
            next_at += interval
            yield self._sample(sampler, job_id)
            sent += 1
            if limit and sent >= limit:
                break

    def _sample(self, sampler: ResourceSampler, job_id: str) -> common_pb2.ResourceSample:
        node = sampler.node()
        procs = []
        for task in self.supervisor.tasks(job_id):
            alive = task.proc.poll() is None
            use = sampler.process(task.proc.pid, alive)
            procs.append(common_pb2.ProcessSample(
                job_id=task.job_id, task=common_pb2.TaskRef(job=task.job, index=task.index), pid=use.pid,
                alive=use.alive, cpu_percent=use.cpu_percent, rss_bytes=use.rss_bytes, state=_STATES[task.state()]))
        sampler.forget({p.pid for p in procs if p.alive})
        return common_pb2.ResourceSample(
            node=self.node, time=node.time, cpu_percent=node.cpu_percent, memory_used_bytes=node.memory_used_bytes,
            memory_total_bytes=node.memory_total_bytes, memory_percent=node.memory_percent, processes=procs,
            job_id=job_id, cpu_count=psutil.cpu_count() or 1)

    def Health(self, request, context):
        self.supervisor.refresh_firewall()   # ports of tasks that ended leave it (coordinators poll Health)
        return node_hook_pb2.HealthResponse(
            node=self.node, pid=os.getpid(), uptime_s=time.monotonic() - self._born, time=time.time(),
            tasks=[_status(t) for t in self.supervisor.tasks()], version=VERSION)


OWN_LOG_DIR_ENV = "TFSYNC_HOOK_OWN_LOG_DIR"   # a restarted hook's folder, made by the hook it replaces


class HookServer:
    """A running hook: its gRPC server and the task processes it started."""

    def __init__(self, grpc_server: grpc.Server, supervisor: TaskSupervisor, stopping: threading.Event,
                 own_log_dir: bool = False):
        self.grpc_server = grpc_server
        self.supervisor = supervisor
        self._stopping = stopping
        self.own_log_dir = own_log_dir   # made by the hook (no --log-dir): removed when it stops

    def stop(self, grace: float | None = 1.0) -> None:
        """End streams, stop serving, kill every task process this hook started; the log
        folder goes too where the hook made it (a --log-dir is kept)."""
        self._stopping.set()
        try:
            self.grpc_server.stop(grace).wait(timeout=(grace or 0) + 5)
        finally:
            self.supervisor.shutdown()
            if self.own_log_dir:
                shutil.rmtree(self.supervisor.log_dir, ignore_errors=True)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self.grpc_server.wait_for_termination(timeout)

    def hand_over(self, grace: float = 1.0) -> str:
        """Stop serving but keep the tasks (and their firewall table), and write their
        table for the program that replaces this one; returns its path."""
        self._stopping.set()
        self.grpc_server.stop(grace).wait(timeout=grace + 5)
        adopt.become_subreaper()
        return adopt.save(os.path.join(self.supervisor.log_dir, "hook-tasks.json"), self.supervisor.tasks())


def serve(listen: str = "127.0.0.1:0", *, token: str, tls: transport.TlsConfig | None = None,
          log_dir: str | None = None, node: str | None = None, allow_remote: bool = False,
          max_workers: int = 16, task_command=TASK_COMMAND, task_allow=(),
          adopt_rows: list[dict] | None = None, warn_now: bool = True) -> tuple[HookServer, int]:
    """Start a NodeHook server; returns it (``.stop()`` kills its tasks too) and its port.

    ``max_workers`` bounds concurrent calls; each open StreamResources holds one.
    ``task_command``: the program of a task (``tfsync.hooks.tasks.TASK_COMMAND``).
    ``task_allow``: addresses (or networks) the firewall lets reach the task ports besides
    the cluster's hosts and loopback. Without a firewall (no root, no ``nft``) a warning
    says so, once: at the start with ``warn_now``, else when the first task starts outside
    a private namespace. ``adopt_rows``: the tasks of this hook before it re-executed itself.
    """
    check_task_allow(task_allow)
    # task logs 0600 in a 0700 folder of the hook's: a new one of its own (removed when it
    # stops; a hook restarted in place keeps its folder) unless --log-dir names one (kept)
    own_log_dir = log_dir is None or log_dir == os.environ.pop(OWN_LOG_DIR_ENV, None)
    log_dir = safefile.private_dir(log_dir) if log_dir else tempfile.mkdtemp(prefix="tfsync-hook-")
    try:
        server, port = transport.make_server(listen, token=token, tls=tls, allow_remote=allow_remote,
                                             max_workers=max_workers)
    except BaseException:
        if own_log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)
        raise
    isolated = isolation.active()
    if isolated:   # this process's network is its own: no one else reaches its tasks' ports
        fw, why, warn_now = None, "none needed: the hook's network namespace is its process's own", False
    else:
        fw, why = firewall.open_firewall(port, task_allow, keep=bool(adopt_rows))
    if fw is None and warn_now:
        logger.warning("tfsync hook: TF task ports of this node will listen on every interface, unprotected "
                       "(no firewall): %s", why)
    supervisor = TaskSupervisor(log_dir, task_command=task_command, firewall=fw, open_reason=why,
                                warn_open=not warn_now and not isolated)
    supervisor.adopt(adopt_rows or [])
    stopping = threading.Event()
    node_hook_pb2_grpc.add_NodeHookServicer_to_server(NodeHookService(supervisor, node or node_name(), stopping),
                                                      server)
    server.start()
    logger.info("node hook serving on port %d (task logs in %s)", port, log_dir)
    return HookServer(server, supervisor, stopping, own_log_dir), port


def check_task_allow(task_allow) -> None:
    """Each --task-allow must be an address or network: the firewall is built from them."""
    for a in task_allow:
        try:
            ipaddress.ip_network(a, strict=False)
        except ValueError:
            raise BadInput(f"--task-allow {a!r} is not an IP address or network") from None


JOINED_ENV = "TFSYNC_HOOK_JOINED"   # set once this hook's --join was answered
MAX_JOIN_WORKERS = 1024             # the most workers a job has (the manager's and engine's bound)


def check_arguments(args, tls: transport.TlsConfig | None) -> None:
    """What `serve` would refuse in the arguments, refused first: --init-token must not
    leave a token behind for a hook that never starts."""
    try:
        transport.check_listen(args.listen, args.allow_remote, tls, warn=False)
    except transport.TransportInputError as e:
        raise BadInput(f"--listen: {e}") from None
    check_task_allow(args.task_allow)
    if tls is not None:
        transport.server_credentials(tls)
    if not args.join:
        given = [f for f in ("job", "manager_token_file", "manager_ca", "advertise") if getattr(args, f)]
        if given:
            raise BadInput(f"--{given[0].replace('_', '-')} is for --join MANAGER")
        return
    transport.split_address(args.join)
    if args.advertise:
        transport.split_address(args.advertise)
    elif transport.split_address(args.listen)[0] in ("0.0.0.0", "::"):
        raise BadInput("--join: the hook tells the job its --listen address; listen on the address the job's "
                         f"coordinator reaches, not {args.listen}, or give --advertise HOST:PORT")
    if not args.manager_token_file:
        raise BadInput("--join needs --manager-token-file: the token of the manager it joins through")
    if not 1 <= args.join_workers <= MAX_JOIN_WORKERS:
        raise BadInput(f"--join-workers {args.join_workers}: expected 1..{MAX_JOIN_WORKERS}")


def join_job(args, port: int, manager_token: str) -> int:
    """``--join``: announce this hook to the job's manager; 0 when it serves on (joined, or
    the outcome not known: said), else an exit code (said in one line)."""
    from tfsync.hooks.join import JoinRefused, JoinUnknown, announce

    if args.advertise:
        address = args.advertise
    else:
        host = transport.split_address(args.listen)[0]
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    manager_tls = transport.TlsConfig(ca_file=args.manager_ca) if args.manager_ca else None
    try:
        message = announce(args.join, manager_token, address, args.job or "", args.join_workers, manager_tls)
    except JoinRefused as e:
        return fail(f"--join: the job did not take this hook: {e}", e.exit_code)
    except transport.TransportError as e:
        return fail(f"--join: {e}", e.exit_code)
    except JoinUnknown as e:   # the job may still take it: serve on
        print(f"tfsync hook: warning: --join: no answer from the job ({e}); serving on: see `tfsync status`",
              flush=True)
        return 0
    os.environ[JOINED_ENV] = "1"   # a restart in place (SIGHUP) does not announce it again
    print(f"tfsync hook: {message}", flush=True)   # "hook ... joined; scaled 2 -> 3 ...", or "join queued; ..."
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tfsync hook",  # also for python -m tfsync.hooks.node
                                description="Run this node's tfsync hook agent (a NodeHook gRPC server): it starts "
                                            "and stops the TF tasks of the jobs that managers send it.")
    p.add_argument("--listen", default="127.0.0.1:0", help="host:port (default: loopback, a free port)")
    p.add_argument("--token-file", required=True, help="the job token file (mode 0600)")
    p.add_argument("--init-token", action="store_true",
                   help="if the token file does not exist, write a new token there (mode 0600) and say so: copy "
                        "it to the machine that runs the job (its cluster.token_file)")
    p.add_argument("--log-dir", default=None,
                   help="a folder of this user's where task logs go (0600), kept when the hook exits (default: a "
                        "new 0700 folder in the temporary directory, removed when the hook exits)")
    p.add_argument("--node", default=None, help="this node's name in resource samples (default: the host name)")
    p.add_argument("--tls-cert", default=None)
    p.add_argument("--tls-key", default=None)
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --listen address")
    p.add_argument("--task-allow", action="append", default=[], metavar="ADDRESS",
                   help="also let this address or network reach the task ports through the hook's firewall (a NAT "
                        "or relay between the nodes); the cluster's hosts and loopback always can")
    j = p.add_argument_group("joining a running job (elastic workers; the job grows onto this node)")
    j.add_argument("--join", metavar="MANAGER", help="once serving, announce this hook to the manager at host:port "
                   "(`tfsync run --manager-listen`, or `tfsync manager`): the job checks that the hook answers with "
                   "its hook token (this --token-file must hold the job's cluster.token_file) and grows onto it, "
                   "up to cluster.max_workers")
    j.add_argument("--advertise", metavar="HOST:PORT", help="the address the job reaches this hook at, where it is "
                   "not --listen's (a NAT or relay between the machines)")
    j.add_argument("--job", metavar="JOB_ID", help="the job to join (default: the manager's only running job)")
    j.add_argument("--manager-token-file", metavar="PATH", help="the manager's token")
    j.add_argument("--manager-ca", metavar="PATH", help="the CA certificate of a manager that serves TLS")
    j.add_argument("--join-workers", type=int, default=1, metavar="N",
                   help="how many workers the job adds on this node (default 1)")
    hook_args = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(hook_args)
    try:
        tls = transport.TlsConfig(args.tls_cert, args.tls_key) if args.tls_cert or args.tls_key else None
        check_arguments(args, tls)
        if args.init_token and not os.path.lexists(args.token_file):
            auth.write_token(args.token_file)
            print(f"tfsync hook: wrote a new token to {args.token_file} (mode 0600); the job's "
                  "cluster.token_file must hold the same token", flush=True)
        token = auth.read_token(args.token_file)
        manager_token = auth.read_token(args.manager_token_file) if args.join else None
        rows = []
        if os.environ.get(adopt.ENV):   # re-executed: the tasks to adopt, and what else ran
            rows = adopt.load(os.environ.pop(adopt.ENV))
            adopt.reap_leftovers({row["pid"] for row in rows})
        server, port = serve(args.listen, token=token, tls=tls, log_dir=args.log_dir, allow_remote=args.allow_remote,
                             node=args.node, task_allow=args.task_allow, adopt_rows=rows)
    except Exception as e:  # a TfsyncError, a path: one line (tfsync.base.exits.report); a bug: its traceback
        return report_error(e)

    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a background shell starts us with it ignored
        signal.signal(sig, interrupt)  # its tasks are stopped on the way out, as on Ctrl-C
    signal.signal(signal.SIGHUP, _restart)
    forkserver.prestart()   # TensorFlow imported before the first job asks for tasks
    try:
        print(f"tfsync hook listening on port {port} (task logs in {server.supervisor.log_dir})", flush=True)
        if args.join and not os.environ.get(JOINED_ENV):   # (a hook restarted in place may have joined)
            code = join_job(args, port, manager_token)
            if code:
                return code
        server.wait_for_termination()
    except KeyboardInterrupt:
        pass
    except Restart:   # the same process id, arguments and port; the tasks go on
        os.environ[adopt.ENV] = server.hand_over()
        if server.own_log_dir:
            os.environ[OWN_LOG_DIR_ENV] = server.supervisor.log_dir
        print("tfsync hook: restarting in place, keeping its tasks", flush=True)
        os.execv(sys.executable, [sys.executable, "-m", "tfsync.hooks.node", *hook_args,
                                  "--listen", f"{args.listen.rsplit(':', 1)[0]}:{port}",
                                  "--log-dir", server.supervisor.log_dir])
    finally:
        server.stop()
    return 0


class Restart(Exception):
    """SIGHUP: re-execute the hook, keeping its tasks."""


def _restart(signum, frame):
    raise Restart()


if __name__ == "__main__":
    sys.exit(main())
