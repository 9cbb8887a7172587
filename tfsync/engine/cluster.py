"""A local cluster: one OS process per TF task (PS and workers), on free ports of this
machine only: in the process's private network namespace where one can be made
(``tfsync.base.netns``: TF's servers listen on every interface), else on loopback addresses
with the ports open on every interface, as the warning at start and ``summary.json`` say.

Processes are always torn down: on ``stop()``, on leaving the ``with`` block, at
interpreter exit, and (from the child's side) when the parent dies.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Protocol

from ..base import forkserver, netns, safefile
from ..base.exits import TfsyncError
from ..base.forkserver import ForkedTask
from ..base.ports import free_ports
from ..base.taskcmd import PACKAGE_ROOT, SERVER, scoped_env, task_command, task_env

logger = logging.getLogger(__name__)
FAIL_FAST_ENV = "GRPC_FAIL_FAST"   # TF's: "true", "false" or "use_caller" (the call's own choice)


class ClusterError(TfsyncError, RuntimeError):
    """A task process failed to start or died."""


class Cluster(Protocol):
    """What the engine needs of one generation's tasks (``Engine(cluster_factory=...)``
    makes one per generation): :class:`LocalCluster`, processes of this machine, or
    ``tfsync.engine.hook_cluster.HookCluster``, tasks that node hooks run. ``spec`` is
    the TF cluster spec with the coordinator as ``chief``. Optional: ``network`` (the
    private namespace the coordinator's server joins), ``resource_readings()`` (workers
    measured elsewhere), ``task_ports()`` (what protects them, for summary.json)."""

    spec: dict

    def launch(self) -> "Cluster":
        """Start every task; return at once."""

    def wait_ready(self) -> None:
        """Until every task listens; raise ClusterError for one that died or is late."""

    def dead_tasks(self) -> list[tuple[str, int, int]]:
        """``(job, index, exit code)`` of the tasks that ended."""

    def task_pid(self, job: str, index: int) -> int | None:
        """A running task's process id on its machine (None if it ended)."""

    def worker_pids(self) -> dict[int, int]:
        """``{worker index: pid}``, for the resource monitor."""

    def stop(self) -> None:
        """Kill every task (idempotent)."""


@dataclass
class PlatformCluster:
    """Tasks a platform started from TF_CONFIG (a Kubernetes TFJob, a Slurm script; each
    runs ``python -m tfsync.engine.server``): tfsync connects to them, neither starts nor
    stops them, and cannot see their processes (a task that dies shows as a failed step,
    and the platform restarts it). One generation only: a restart needs new tasks."""

    spec: dict
    start_timeout: float = 120.0
    network = None
    restartable = False   # a switch command "restart" is refused (tfsync.engine.commands)

    @classmethod
    def factory(cls, spec: dict):
        """An ``Engine(cluster_factory=...)`` that hands out this cluster once."""
        made = []

        def make(workers: int, ps: int, *args, start_timeout: float = 120.0, **kw):
            listed = (len(spec["worker"]), len(spec["ps"]))
            if (workers, ps) != listed:
                raise ClusterError(f"the engine runs {workers} workers and {ps} PS, TF_CONFIG lists "
                                   f"{listed[0]} and {listed[1]}")
            if made:
                raise ClusterError("a restart needs new tasks, but TF_CONFIG's tasks are the platform's: "
                                   "switch hot (switch.method = \"hot\"); a lost task is the platform's to restart")
            made.append(cls(spec, start_timeout))
            return made[0]
        return make

    def launch(self) -> "PlatformCluster":
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        for job in ("ps", "worker"):
            for i, address in enumerate(self.spec[job]):
                host, port = address.rsplit(":", 1)
                while not port_open(host, int(port)):
                    if time.monotonic() > deadline:
                        raise ClusterError(f"task {job}:{i} at {address} (from TF_CONFIG) did not answer within "
                                           f"{self.start_timeout:.0f} s")
                    time.sleep(0.2)

    def dead_tasks(self) -> list[tuple[str, int, int]]:
        return []

    def task_pid(self, job: str, index: int) -> int | None:
        return None

    def worker_pids(self) -> dict[int, int]:
        return {}

    def stop(self) -> None:
        pass

    def task_ports(self) -> str:
        return "started by the platform from TF_CONFIG: tfsync neither starts nor isolates them"


def connect_strategy(cluster):
    """A ParameterServerStrategy coordinated by this process on ``cluster`` (a LocalCluster,
    or anything with a ``spec`` and a ``network``). The strategy starts this process's TF
    server (the chief's): inside the cluster's private network, it listens there only.

        with LocalCluster(workers=2) as cluster:
            strategy = connect_strategy(cluster)
    """
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.spec), task_type="chief", task_id=0, rpc_layer="grpc")
    network = getattr(cluster, "network", None)
    # TF's RPCs made meanwhile fail at once on a task that does not answer (GRPC_FAIL_FAST,
    # read as each is made) instead of waiting for it: the connect's device lookup would wait
    # for ever on a task that died after it listened. Only here: tasks' registration waits.
    with network.entered() if network is not None else contextlib.nullcontext(), scoped_env(FAIL_FAST_ENV, "true", "use_caller"):
        try:
            return tf.distribute.experimental.ParameterServerStrategy(resolver)
        except tf.errors.OpError as e:
            raise ConnectError(f"connecting to the cluster failed, a task did not answer: "
                               f"{str(e).splitlines()[0][:300]}") from None


class NoNodes(ClusterError):
    """None of the job's node hooks answers: no node to place a generation's tasks on."""


class ConnectError(ClusterError):
    """A task of the cluster did not answer while the coordinator connected to it."""


def port_open(host: str, port: int) -> bool:
    """Whether ``host:port`` accepts a TCP connection now (a name that does not resolve
    yet, as a pod's before it runs, does not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        try:
            return s.connect_ex((host, port)) == 0
        except OSError:
            return False


@dataclass
class LocalCluster:
    """PS and worker task processes on this machine.

    ``spec`` is the TF cluster spec (with a ``chief`` entry for the coordinator: this
    process, whose TF server ParameterServerStrategy starts). ``network``: the private
    network namespace the tasks and the coordinator's server run in (None: ``host``, a
    loopback address, with the ports open on every interface). A ``host`` that is not
    loopback is used as given, without a namespace.
    """

    workers: int = 2
    ps: int = 1
    host: str = "127.0.0.1"
    log_dir: str | None = None
    start_timeout: float = 60.0
    work_dir: str | None = None   # the tasks' working directory (relative data paths start there)
    files: tuple = ()             # what they read in it: on this machine already, nothing to copy
    spec: dict = field(default_factory=dict, init=False)
    procs: dict = field(default_factory=dict, init=False)
    network: netns.PrivateNetwork | None = field(default=None, init=False)

    def __post_init__(self):
        if self.workers < 1 or self.ps < 1:
            raise ValueError(f"a cluster needs >= 1 worker and >= 1 PS, got workers={self.workers}, ps={self.ps}")
        count = self.workers + self.ps + 1
        self.network = netns.shared() if netns.is_loopback(self.host) else None
        if self.network is not None:
            host, ports = self.network.address, self.network.free_ports(count)
        else:
            host, ports = self.host, free_ports(count, self.host)
        addr = [f"{host}:{p}" for p in ports]
        self.spec = {
            "chief": [addr[0]],
            "ps": addr[1 : 1 + self.ps],
            "worker": addr[1 + self.ps :],
        }

    # -- lifecycle ----------------------------------------------------------------------
    def launch(self) -> "LocalCluster":
        """Start every task process; ``wait_ready`` waits for their ports."""
        if self.network is not None and self.work_dir:   # tasks run as the user who ran sudo
            try:
                netns.hand_over(self.work_dir, self.files, (SERVER[0], PACKAGE_ROOT))
            except (netns.NetnsError, OSError) as e:
                raise ClusterError(str(e)) from None
        atexit.register(self.stop)
        for job in ("ps", "worker"):
            for i in range(len(self.spec[job])):
                self.start_task(job, i, wait=False)
        return self

    def start(self) -> "LocalCluster":
        self.launch()
        self.wait_ready()
        return self

    def start_task(self, job: str, index: int, wait: bool = True) -> subprocess.Popen | ForkedTask:
        cmd = task_command(json.dumps(self.spec), job, index)
        wrap = self.network.command if self.network is not None else list
        env, log = task_env(), None
        if self.log_dir:
            safefile.make_dir(self.log_dir)
            log = os.path.join(self.log_dir, f"{job}-{index}.log")
            safefile.open_append(log, binary=True).close()   # created here, by the launcher's rules
        try:
            proc = forkserver.fork(cmd[len(SERVER):], env, self.work_dir, log, self.start_timeout,
                                   *((self.network.name, netns.task_user()) if self.network is not None else ()))
        except forkserver.ForkSettingError as e:
            raise ClusterError(str(e)) from None
        if proc is None:   # no fork server: a process of its own, which imports TensorFlow itself
            out = safefile.open_append(log, binary=True) if log else subprocess.DEVNULL
            proc = subprocess.Popen(wrap(cmd), env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=self.work_dir)
            if log:
                out.close()
        self.procs[(job, index)] = proc
        logger.debug("started %s:%d pid %d", job, index, proc.pid)
        if wait:
            self.wait_ready([(job, index)])
        return proc

    def wait_ready(self, tasks=None) -> None:
        tasks = tasks or list(self.procs)
        deadline = time.monotonic() + self.start_timeout
        pending = list(tasks)
        while pending:
            job, i = pending[0]
            proc = self.procs[(job, i)]
            if proc.poll() is not None:
                raise ClusterError(
                    f"task {job}:{i} exited with code {proc.returncode} while starting"
                    + (f"; see {self.log_dir}/{job}-{i}.log" if self.log_dir else "")
                )
            host, port = self.spec[job][i].rsplit(":", 1)
            if port_open(host, int(port)):
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"task {job}:{i} did not open {self.spec[job][i]} within {self.start_timeout:.0f} s; "
                    "raise start_timeout on a loaded machine"
                )
            time.sleep(0.05)

    def kill_task(self, job: str, index: int, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get((job, index))
        if proc and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=10)

    def dead_tasks(self) -> list[tuple[str, int, int]]:
        return [(job, i, p.returncode) for (job, i), p in self.procs.items() if p.poll() is not None]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - kernel is slow to reap
                logger.warning("task pid %d did not exit after SIGKILL", proc.pid)
        try:
            atexit.unregister(self.stop)
        except Exception:  # pragma: no cover
            pass

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def task_pid(self, job: str, index: int) -> int | None:
        """The pid of a running task (None if it ended or never started)."""
        proc = self.procs.get((job, index))
        return proc.pid if proc is not None and proc.poll() is None else None

    def worker_pids(self) -> dict[int, int]:
        """``{worker index: pid}`` of the worker task processes."""
        return {i: p.pid for (job, i), p in self.procs.items() if job == "worker"}
