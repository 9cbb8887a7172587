"""The engine's cluster, with its PS and worker tasks run by node hooks (``tfsync hook``).

``HookCluster`` has the interface of ``tfsync.engine.cluster.LocalCluster`` (``spec``,
``launch``, ``wait_ready``, ``dead_tasks``, ``task_pid``, ``stop``), so the engine starts,
watches, replaces (a lost PS or worker: a new generation) and stops its tasks through
hooks without knowing it. ``HookNodes`` makes one per generation:

    nodes = HookNodes([("10.0.0.1:7070", token), ("10.0.0.2:7070", token)], ports=(20000, 20999))
    engine = Engine(setup, workers=4, cluster_factory=nodes)

Tasks go round-robin over the hooks that answer Health (PS first; ``pinned`` tasks on
their own hook while it answers: a node that died or lost its link gets none of a new
generation's tasks; ``returned`` says when such a node answers again, and the engine
then restarts on every node) and listen on their hook's host. When
every hook is on this machine the tasks (and the coordinator's TF server) run in this
process's private network namespace instead, reachable from this machine only, by root
and the tasks' user (``tfsync.base.netns``), on ports free there. A remote hook's tasks take ports from ``ports``
in turn, a fresh block for every generation, so a new task never has to wait for the
port of the one it replaces.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

from tfsync.api import client, transport
from tfsync.api.v1 import common_pb2, node_hook_pb2, node_hook_pb2_grpc
from tfsync.base import isolation, netns
from tfsync.base.netns import is_loopback
from tfsync.base.procstats import worker_reading
from tfsync.base.ports import free_ports
from tfsync.engine.cluster import ClusterError, NoNodes
from tfsync.engine.launcher import HookLauncher, LaunchError, place

logger = logging.getLogger(__name__)

ENDED = (common_pb2.TASK_STATE_EXITED, common_pb2.TASK_STATE_STOPPED)
HEALTH_TIMEOUT_S = 5.0
RECHECK_TIMEOUT_S = 2.0       # Health of a hook the generation just found silent for HEALTH_TIMEOUT_S
REJOIN_PROBE_S = 2.0          # how often a node left out of a generation is asked whether it is back
RESOURCE_INTERVAL_S = 1.0     # remote workers' readings, as often as the engine's own monitor


def workers_of(sample: common_pb2.ResourceSample) -> dict[int, dict]:
    """``{worker: reading}`` of a hook's sample, for its live workers, in the form of the
    engine's own readings (``tfsync.base.procstats.worker_reading``): the CPUs a remote worker
    shares with other processes are its node's."""
    cores = max(sample.cpu_count, 1)
    return {p.task.index: worker_reading(sample.cpu_percent * cores, cores, p.cpu_percent,
                                         100.0 * p.rss_bytes / max(sample.memory_total_bytes, 1), p.pid,
                                         sample.time, node=sample.node)
            for p in sample.processes if p.task.job == "worker" and p.alive}


class HookNodes:
    """A cluster factory for the engine: ``nodes(workers, ps, host, log_dir=, start_timeout=)``
    returns a new ``HookCluster`` on these hooks (``host`` and ``log_dir`` are the hooks':
    ignored). ``ports``: the (first, last) port tasks may use on remote nodes."""

    def __init__(self, hooks, ports: tuple[int, int] | None = None, *, tls=None, parallel: bool = True,
                 job_id: str | None = None, pinned: dict | None = None, joinable: bool = True):
        self.hooks = [tuple(h) for h in hooks]
        if not self.hooks:
            raise ValueError("HookNodes needs at least one hook, as (address, token)")
        remote = [a for a, _ in self.hooks if not is_loopback(a.rsplit(":", 1)[0])]
        if remote and ports is None:
            raise ValueError(f"hooks {remote} are not on this machine: give the ports their tasks may use "
                             "(cluster.task_ports = [first, last])")
        if ports is not None and not 1 <= ports[0] <= ports[1] <= 65535:
            raise ValueError(f"task ports must be (first, last) within 1..65535, got {ports!r}")
        self.ports, self.tls, self.parallel = ports, tls, parallel
        self.joinable = joinable   # whether other hooks may join (the job file's hooks; not `tfsync run`'s own)
        self.pinned = dict(pinned or {})   # (job, index) -> hook index: where the job file pins a task
        self.job_id = job_id or f"tfsync-{uuid.uuid4().hex[:12]}"
        self._next_port: dict[str, int] = {}  # remote host -> its next free port of the range
        self.generations = 0
        self.left_out: set[int] = set()      # hooks the newest generation left out: they did not answer
        self._answering: set[int] = set()    # ... of which the probe has heard since
        self._left_running: dict[int, list[str]] = {}   # hook -> job ids whose tasks it may still run
        self._cut_off: list[str] = []        # their addresses, until the next generation has connected
        self._silent: set[int] = set()       # hooks a generation found silent (dead_tasks), until the next asks
        self._probe_lock = threading.Lock()
        self._prober: threading.Thread | None = None
        self._closed = threading.Event()

    @contextlib.contextmanager
    def _stub(self, hook: int):
        """A NodeHook stub of ``hook`` on a channel of its own, closed after the block."""
        channel = transport.make_channel(self.hooks[hook][0], token=self.hooks[hook][1], tls=self.tls)
        try:
            yield client.Client(node_hook_pb2_grpc.NodeHookStub(channel))
        finally:
            channel.close()

    def _hook_ports(self, hook: int, host: str, count: int) -> list[int]:
        """``count`` ports of the range free on ``hook``'s node, as the hook sees them
        (FreePorts: a task left there by a coordinator that died keeps its port); a hook
        without FreePorts gets the next ports of the range in turn."""
        try:
            with self._stub(hook) as stub:
                reply = stub.FreePorts(node_hook_pb2.FreePortsRequest(first=self.ports[0], last=self.ports[1],
                                                                      count=count), timeout=HEALTH_TIMEOUT_S)
            return list(reply.ports)
        except client.Unsupported:
            return self._remote_ports(hook, host, count)
        except client.CallFailed as e:
            raise ClusterError(f"hook {self.hooks[hook][0]}: FreePorts failed: {e}") from None

    def _remote_ports(self, hook: int, host: str, count: int) -> list[int]:
        first, last = self.ports
        if count > last - first + 1:
            raise ValueError(f"task ports {first}..{last} are fewer than the {count} tasks of one node")
        start = self._next_port.get(host, first)
        if start + count - 1 > last:
            start = first
        self._next_port[host] = start + count
        return list(range(start, start + count))

    def spec(self, workers: int, ps: int, network: netns.PrivateNetwork | None = None,
             live: list[int] | None = None, ask_ports=None) -> tuple[dict, dict]:
        """A cluster spec for a new generation and its ``{task: hook index}`` over the
        ``live`` hooks (default: all); with ``network`` (hooks on this machine only) every
        task and the chief listen in it. ``ask_ports(hook, host, count)``: a remote node's
        free ports (default: the range in turn)."""
        tasks = [("ps", i) for i in range(ps)] + [("worker", i) for i in range(workers)]
        live = list(range(len(self.hooks))) if live is None else live
        assignment = place(tasks, live, self.pinned)
        moved = [f"{j}:{i}" for (j, i), h in self.pinned.items() if (j, i) in assignment and assignment[j, i] != h]
        if moved:
            logger.warning("%s pinned to a hook that does not answer: placed on another node", ", ".join(moved))
        # the coordinator (chief): ParameterServerStrategy starts its TF server in this process
        if network is not None:   # one call: ports are distinct across hooks and the chief
            chief, *ports = network.free_ports(len(tasks) + 1)
            addresses = {t: f"{network.address}:{p}" for t, p in zip(tasks, ports)}
            chief = f"{network.address}:{chief}"
        else:
            addresses = {}
            for h, (address, _) in enumerate(self.hooks):
                host = address.rsplit(":", 1)[0]
                mine = [t for t in tasks if assignment[t] == h]
                if not mine:
                    continue
                ports = free_ports(len(mine), host.strip("[]")) if is_loopback(host) \
                    else (ask_ports or self._remote_ports)(h, host, len(mine))
                addresses.update({t: f"{host}:{p}" for t, p in zip(mine, ports)})
            chief = f"{self.chief_host()}:{free_ports(1)[0]}"
        spec = {"chief": [chief],
                "ps": [addresses[("ps", i)] for i in range(ps)],
                "worker": [addresses[("worker", i)] for i in range(workers)]}
        return spec, assignment

    def _answers(self, hook: int, timeout: float = HEALTH_TIMEOUT_S, say: bool = True) -> bool:
        try:
            with self._stub(hook) as stub:
                stub.Health(node_hook_pb2.HealthRequest(), timeout=timeout)
            return True
        except (client.Unreachable, client.Cancelled) as e:   # (CANCELLED: a hook shutting down ended the call)
            if say:
                logger.warning("hook %s does not answer (%s): this generation's tasks go to the other nodes",
                               self.hooks[hook][0], e.code)
            return False
        except client.CallFailed:
            return True   # it answered (a wrong token, TLS...): the launch says what is wrong

    def has_hook(self, address: str) -> bool:
        return any(a == address for a, _ in self.hooks)

    def add_hook(self, address: str) -> None:
        """A node hook joins (``tfsync hook --join``): new generations place tasks on it
        too, with the job's token (its hooks share one, cluster.token_file). ValueError,
        with nothing added, where it is already a node, is on this machine while the
        others are not (or the reverse), does not answer, or refuses the token."""
        host, _ = transport.split_address(address)
        if self.has_hook(address):
            raise ValueError(f"hook {address} is already one of the job's nodes")
        if is_loopback(host) != self.local:
            raise ValueError(f"hook {address} is {'on this machine' if is_loopback(host) else 'on another machine'}, "
                             f"the job's hooks are {'on this one' if self.local else 'on other machines'}: "
                             "a job's hooks are all local or all remote")
        if not self.local and self.ports is None:
            raise ValueError(f"hook {address} is on another machine: the job needs cluster.task_ports")
        token = self.hooks[0][1]
        with self._probe_lock:
            self.hooks.append((address, token))
        try:   # (with cluster.tls_ca, the hook's certificate is checked before the token is sent)
            with self._stub(len(self.hooks) - 1) as stub:
                stub.Health(node_hook_pb2.HealthRequest(), timeout=HEALTH_TIMEOUT_S)
        except client.CallFailed as e:
            self.remove_hook(address)
            why = ("refused the job's hook token (cluster.token_file): start it with the same --token-file"
                   if isinstance(e, client.TokenRefused) else f"does not answer from here ({e})")
            raise ValueError(f"hook {address} {why}") from None
        logger.info("hook %s joined the job's nodes", address)

    def remove_hook(self, address: str) -> None:
        """Undo ``add_hook`` (a join whose scale was refused): the last hook, which runs no
        task yet, with whatever a generation noted of it (left out, silent)."""
        with self._probe_lock:
            if len(self.hooks) > 1 and self.hooks[-1][0] == address:
                index = len(self.hooks) - 1
                for noted in (self.left_out, self._answering, self._silent):
                    noted.discard(index)
                self.hooks.pop()

    def found_silent(self, hook: int) -> None:
        """A generation waited ``HEALTH_TIMEOUT_S`` for ``hook`` in vain: the next
        ``live_hooks`` asks it for ``RECHECK_TIMEOUT_S`` only."""
        self._silent.add(hook)

    def live_hooks(self) -> list[int]:
        """The hooks that answer Health now (a node that died or lost its link does not):
        a new generation's tasks go to these only, so a job outlives a node. ClusterError
        if none answers."""
        silent, self._silent = self._silent, set()   # already waited for: asked again briefly
        timeouts = [RECHECK_TIMEOUT_S if h in silent else HEALTH_TIMEOUT_S for h in range(len(self.hooks))]
        with ThreadPoolExecutor(len(self.hooks)) as pool:
            live = [h for h, ok in enumerate(pool.map(self._answers, range(len(self.hooks)), timeouts)) if ok]
        if not live:
            raise NoNodes(f"none of the hooks {', '.join(a for a, _ in self.hooks)} answers")
        return live

    # -- nodes that come back ------------------------------------------------------------------
    def returned(self) -> list[str]:
        """The hooks (addresses) the newest generation left out that answer again: their
        nodes are back (a partition healed, a node restarted), and a new generation would
        use them. Probed in the background every ``REJOIN_PROBE_S`` from the generation that
        left them out; their tasks that older generations left running there are stopped
        first."""
        with self._probe_lock:
            return [self.hooks[h][0] for h in sorted(self._answering & self.left_out)]

    def left_out_hooks(self) -> list[str]:
        with self._probe_lock:
            return [self.hooks[h][0] for h in sorted(self.left_out)]

    def _probe(self) -> None:
        while not self._closed.wait(REJOIN_PROBE_S):
            with self._probe_lock:   # ends under the lock, so a new generation's call starts another
                waiting = self.left_out - self._answering
                if not waiting:
                    self._prober = None
                    return
            for h in sorted(waiting):
                if self._answers(h, timeout=REJOIN_PROBE_S, say=False):
                    self._stop_left_running(h)
                    with self._probe_lock:
                        self._answering.add(h)

    def left_running(self, hook: int, job_id: str, addresses) -> None:
        """A stopped generation ``job_id`` left its tasks (at ``addresses``) on ``hook``, which
        did not answer: they are stopped when it answers again, and the next generation's
        connect does not wait on them (tfsync.engine.cut)."""
        self._left_running.setdefault(hook, []).append(job_id)
        self._cut_off.extend(addresses)

    def _stop_left_running(self, hook: int) -> None:
        """Stop the tasks older generations left on ``hook`` while it did not answer."""
        for job_id in self._left_running.pop(hook, []):
            try:
                with self._stub(hook) as stub:
                    stub.StopTasks(node_hook_pb2.StopTasksRequest(job_id=job_id), timeout=30.0)
                logger.info("stopped the tasks %s had left on %s", job_id, self.hooks[hook][0])
            except client.CallFailed as e:
                logger.warning("could not stop the tasks %s left on %s: %s", job_id, self.hooks[hook][0], e.code)

    def close(self) -> None:
        """End the background probe (the engine's end), waiting out a probe call in flight."""
        self._closed.set()
        with self._probe_lock:
            prober = self._prober
        if prober is not None:
            prober.join(timeout=REJOIN_PROBE_S + 1.0)   # its Health call is bounded by REJOIN_PROBE_S

    def chief_host(self) -> str:
        """This machine's address as the hooks' nodes reach it: the source address of the
        route to the first hook not on loopback (no packet is sent)."""
        if self.local:
            return "127.0.0.1"
        host = next(h for h in (a.rsplit(":", 1)[0].strip("[]") for a, _ in self.hooks) if not is_loopback(h))
        family, _, _, _, address = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(address)
            mine = s.getsockname()[0]
        return f"[{mine}]" if family == socket.AF_INET6 else mine

    @property
    def local(self) -> bool:
        """Whether every hook is on this machine."""
        return all(is_loopback(a.rsplit(":", 1)[0]) for a, _ in self.hooks)

    def __call__(self, workers: int, ps: int, host: str | None = None, log_dir: str | None = None,
                 start_timeout: float = 120.0, work_dir: str | None = None, files=()) -> "HookCluster":
        """``work_dir``: the coordinator's directory the tasks run in, holding ``files``
        (paths relative to it that the tasks read): hooks on this machine run the tasks
        there; remote ones are sent the files first (StageFile) and run the tasks in
        their copy, so no node needs a shared filesystem."""
        if workers < 1 or ps < 1:
            raise ValueError(f"a cluster needs >= 1 worker and >= 1 PS, got workers={workers}, ps={ps}")
        network = netns.shared() if self.local else None
        live = self.live_hooks() if len(self.hooks) > 1 or not self.local else None
        with self._probe_lock:
            self.left_out = set() if live is None else set(range(len(self.hooks))) - set(live)
            self._answering = set()
            if self.left_out and self._prober is None:
                self._prober = threading.Thread(target=self._probe, name="tfsync-rejoin-probe", daemon=True)
                self._prober.start()
        for h in live or ():
            self._stop_left_running(h)   # a node back before the probe saw it
        spec, assignment = self.spec(workers, ps, network, live, ask_ports=self._hook_ports)
        self.generations += 1
        if work_dir and self.local:
            where = {"workdir": os.path.abspath(work_dir)}
        else:
            where = {"stage_id": self.job_id, "files": [(f, os.path.join(work_dir, f)) for f in files]} \
                if work_dir else {}
        made = HookCluster(self, spec, assignment, f"{self.job_id}-g{self.generations}", start_timeout, network,
                           where)
        made.cut_off, self._cut_off = self._cut_off, []
        return made


class HookCluster:
    """One generation's tasks on node hooks (see the module docstring)."""

    def __init__(self, nodes: HookNodes, spec: dict, assignment: dict, job_id: str, start_timeout: float,
                 network: netns.PrivateNetwork | None = None, where: dict | None = None):
        self.spec, self.nodes, self.network = spec, nodes, network
        self.launcher = HookLauncher(nodes.hooks, parallel=nodes.parallel, timeout=start_timeout, job_id=job_id,
                                     tls=nodes.tls, netns=network.name if network is not None else "",
                                     **(where or {}))
        self._mapping = assignment
        # tasks of older generations on nodes that did not answer: TF's connect must not wait
        # on them (tfsync.engine.cut)
        self.cut_off: list[str] = []
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._dead: dict[tuple[str, int], int] = {}  # ended tasks -> exit code (-1: hook unreachable)
        self._unreachable: set[int] = set()           # hooks that did not answer Health
        self._stopped = threading.Event()
        self._streams: list | None = None             # StreamResources calls (resource_readings)
        self._readings: dict[int, dict] = {}
        self._readings_lock = threading.Lock()

    @property
    def job_id(self) -> str:
        return self.launcher.job_id

    def task_ports(self) -> str | dict[str, str]:
        """What protects this generation's task ports (summary.json's ``task_ports``): the
        private network's description, or per node (hook address) what its hook said,
        with the coordinator's own TF server (the chief), which listens on every
        interface of this machine."""
        if self.network is not None or (self.nodes.local and isolation.active()):
            return netns.describe(self.network)
        out = {"coordinator": f"every interface, unprotected: the coordinator's own TF server ({self.spec['chief'][0]})"
                              " is not firewalled"}
        for h, text in sorted(self.launcher.task_ports.items()):
            out[self.launcher.addresses[h]] = text
        return out

    def launch(self) -> "HookCluster":
        """Ask every hook to start its tasks (in the background: ``wait_ready`` waits)."""
        def start():
            try:
                self.launcher.start(self.spec, self._mapping)
            except BaseException as e:  # noqa: BLE001 - raised by wait_ready
                self._error = e
        self._thread = threading.Thread(target=start, name="tfsync-hook-launch", daemon=True)
        self._thread.start()
        return self

    def wait_ready(self) -> None:
        if self._thread is None:
            self.launch()
        self._thread.join()
        if self._error is not None:
            err = self._error
            raise ClusterError(str(err)) if isinstance(err, LaunchError) else err

    def dead_tasks(self) -> list[tuple[str, int, int]]:
        """Tasks of this generation that ended, asking every hook that runs one (Health),
        all at once: one round trip to the farthest node, not one per node in turn (the
        engine's loop asks twice a second; 9 nodes at 30 ms one way took it 0.6 s a time)."""
        if self._thread is not None and not self._thread.is_alive() and self._error is None:
            # wait_for_ready: a hook restarting in place (SIGHUP, a second or two) is waited
            # for, not taken for lost; one silent for HEALTH_TIMEOUT_S is
            asked = {h: stub.Health.future(node_hook_pb2.HealthRequest(), timeout=HEALTH_TIMEOUT_S,
                                           wait_for_ready=True)
                     for h, stub in enumerate(self.launcher._stubs)
                     if self.launcher.tasks_of(h) and h not in self._unreachable}
            for h, answer in asked.items():
                mine = self.launcher.tasks_of(h)
                try:
                    health = answer.result()
                except Exception as e:  # noqa: BLE001 - an unreachable hook: its tasks count as lost
                    logger.warning("hook %s did not answer Health: %s", self.launcher.addresses[h], e)
                    self._unreachable.add(h)
                    self.nodes.found_silent(h)
                    for task in mine:
                        self._dead.setdefault(task, -1)
                    continue
                listed = set()
                for t in health.tasks:
                    key = (t.task.job, t.task.index)
                    if t.job_id == self.job_id:
                        listed.add(key)
                        if t.state in ENDED and key not in self._dead:
                            self.launcher.status[key] = t
                            self._dead[key] = t.exit_code
                for job, index in mine:   # a new hook at the address (a pod replaced): ours went with the old one
                    if (job, index) not in listed and (job, index) not in self._dead:
                        logger.warning("hook %s no longer knows %s:%d (a new hook process there?): it is lost",
                                       self.launcher.addresses[h], job, index)
                        self._dead[(job, index)] = -1
        return [(job, i, code) for (job, i), code in self._dead.items()]

    def task_pid(self, job: str, index: int) -> int | None:
        """The pid of a task whose hook is on this machine (None for remote or ended ones)."""
        s = self.launcher.status.get((job, index))
        h = self._mapping.get((job, index))
        if s is None or h is None or s.state in ENDED or (job, index) in self._dead:
            return None
        return s.pid if is_loopback(self.launcher.addresses[h].rsplit(":", 1)[0]) else None

    def worker_pids(self) -> dict[int, int]:
        pids = {i: self.task_pid("worker", i) for i in range(len(self.spec["worker"]))}
        return {i: p for i, p in pids.items() if p is not None}

    def resource_readings(self) -> dict[int, dict]:
        """``{worker: reading}`` of the workers on other nodes, as their hooks measure them
        (StreamResources, one stream per node, started on the first call), in the form of
        ``tfsync.engine.resources.ResourceMonitor`` readings: ``cpu`` is the share of the
        node's CPUs busy with other processes (the contention NARX is fed)."""
        if self._streams is None and self._thread is not None and not self._thread.is_alive() \
                and self._error is None:
            self._streams = []
            for h, stub in enumerate(self.launcher._stubs):
                if any(job == "worker" for job, _ in self.launcher.tasks_of(h)) \
                        and not is_loopback(self.launcher.addresses[h].rsplit(":", 1)[0]):
                    call = stub.StreamResources(node_hook_pb2.StreamResourcesRequest(
                        job_id=self.job_id, interval_s=RESOURCE_INTERVAL_S))
                    self._streams.append(call)
                    threading.Thread(target=self._read_stream, args=(call, stub), daemon=True,
                                     name=f"tfsync-resources-{h}").start()
        with self._readings_lock:
            return {w: dict(r) for w, r in self._readings.items()}

    def _read_stream(self, call, stub=None) -> None:
        """Readings from one hook's stream; one that breaks (the hook restarts in place) is
        opened again every second until the cluster stops."""
        while True:
            try:
                for sample in call:
                    readings = workers_of(sample)
                    with self._readings_lock:
                        self._readings.update(readings)
            except client.Cancelled:
                return   # at stop
            except Exception as e:  # noqa: BLE001 - the node is gone: no more readings
                logger.debug("resource stream of %s ended: %s", self.job_id, e)
            if stub is None or self._stopped.wait(1.0):
                return
            call = stub.StreamResources(node_hook_pb2.StreamResourcesRequest(
                job_id=self.job_id, interval_s=RESOURCE_INTERVAL_S))
            self._streams.append(call)

    def stop(self) -> None:
        if self._stopped.is_set():   # once: the engine's end stops every generation again
            return
        self._stopped.set()
        for call in list(self._streams or ()):
            call.cancel()
        if self._thread is not None:
            self._thread.join()
        for h in self._unreachable:   # not waited for: a partitioned node would hold the stop for a minute
            logger.warning("the tasks of %s on %s are left running: its hook did not answer", self.job_id,
                           self.launcher.addresses[h])
            self.nodes.left_running(h, self.job_id, [self.spec[job][i] for job, i in self.launcher.tasks_of(h)])
        try:
            self.launcher.stop(skip=self._unreachable)
        except LaunchError as e:
            logger.warning("stopping the tasks of %s: %s", self.job_id, e)
