"""A cluster of separate hosts on one machine: network namespaces on a bridge.

    bed = Testbed.up("t", nodes=3, latency_ms=10, rate="100mbit")
    bed.hooks                          # ["198.18.1.11:7070", ...]: the job file's cluster.hooks
    subprocess.run(bed.command("c", ["tfsync", "run", "job.toml"]))   # the coordinator's node
    bed.set("n2", latency_ms=30)       # while the job runs: n2's link turns slow
    bed.set("n3", jitter_ms=5, loss_pct=1)
    bed.set("n3", cpu=0.33)            # n3's hook and tasks share a third of one CPU
    bed.down()                         # every namespace, link, process and file removed

Layout (slot ``s``: several testbeds can be up at once):
- a *wire* namespace ``tfsb<s>-wire`` holds the bridge (``198.18.<2s>.1/24``) and the
  latency relay (``relay.py``); it does not forward packets, and nothing routes out of it;
- each node (``c``, the coordinator's, and ``n1``..``nN``) is a namespace ``tfsb<s>-<node>``
  whose ``eth0`` is a veth port of the bridge, at its own address ``198.18.<2s>.<10+k>``
  (the hook binds it), and whose only other route is to the *advertised* addresses
  ``198.18.<2s+1>.<10+k>``: those live in the wire namespace, where the relay listens on
  the hook port and every task port and passes each connection on to the node's own
  address after the sending node's latency, from the sender's advertised address. The
  cluster spec names advertised addresses, so every connection between tasks crosses
  the relay;
- each node's hook firewalls its task ports (``tfsync.hooks.firewall``): the spec's
  hosts, loopback and the coordinator's node as the relay presents it (its advertised
  address: the spec names the coordinator by its own address, ``HookNodes.chief_host``)
  reach them, no other host on the bridge does;
- bandwidth: a ``tbf`` qdisc on both ends of a node's veth (its upload and download);
- jitter: the relay's (``relay.py``); packet loss: an nftables ingress rule on the node's
  veth in the wire namespace that drops that share of what it sends, at random (netem's
  ``loss``, which this kernel lacks; needs ``nft``);
- CPU: a node given a share runs its hook and tasks in a cgroup ``tfsb<s>-<node>`` capped
  at that many CPUs (``cpushare.py``);
- a node's hook runs in its own mount namespace with an empty tmpfs over each
  ``private`` directory (``/tmp`` by default): a node sees nothing the coordinator
  keeps there, as a separate machine would not (no shared run directory);
- 198.18.0.0/15 is RFC 2544's benchmarking range, never routed on the Internet.

Needs root and iproute2's ``ip``/``tc``; :func:`unavailable_reason` says why not.
State (addresses, pids, the hooks' token) is kept in ``$TFSYNC_HOME/testbed/<name>/``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from tfsync.base import safefile
from tfsync.base.netns import pid_alive
from tfsync.base.taskcmd import task_env
from tfsync.testbed import cpushare
from ..base.exits import BadInput, TfsyncError

HOOK_PORT = 7070
TASK_PORTS = (20000, 20099)   # the job file's cluster.task_ports; the relay listens on all of them
SLOTS = 64                    # 198.18.0.0/16 in pairs of /24
COORDINATOR = "c"
_NAME = re.compile(r"[a-z][a-z0-9-]{0,15}")
_RATE = re.compile(r"\d+(\.\d+)?(bit|kbit|mbit|gbit)")
START_TIMEOUT_S = 60.0


class TestbedError(TfsyncError, RuntimeError):
    """A testbed could not be made, found or changed (the message says why, in one line)."""


class TestbedInputError(BadInput, TestbedError, ValueError):
    """What was asked cannot be (exit 2): a bad name, size, latency or rate, a node or testbed not there."""


@dataclass
class Node:
    name: str
    netns: str
    address: str              # the node's own address: its hook binds it, its tasks serve there
    advertised: str           # where the cluster spec points: the relay, on the way to ``address``
    latency_ms: float = 0.0
    rate: str | None = None   # tbf rate ("100mbit"), None: unshaped
    jitter_ms: float = 0.0    # each chunk it sends waits latency +- up to this (the relay)
    loss_pct: float = 0.0     # share of the packets it sends that are dropped (nftables)
    cpu: float | None = None  # CPUs its processes may use together (a cgroup quota: cpushare.py), None: no cap
    up: bool = True
    pid: int | None = None    # its hook (None for the coordinator's node)


def unavailable_reason() -> str | None:
    """Why a testbed cannot be made here (None: it can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not running as root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    for tool in ("ip", "tc", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install iproute2 util-linux)"
    return None


def state_root() -> str:
    from tfsync.manager.home import home
    return str(home() / "testbed")


def _run(*cmd: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise TestbedError(f"`{' '.join(cmd)}` failed: {r.stderr.strip() or r.returncode}")
    return r.stdout


def _stop(pid: int, wait_s: float = 30.0) -> None:
    """SIGTERM ``pid``, SIGKILL if it is still there after ``wait_s`` (a zombie is gone)."""
    import psutil
    try:
        proc = psutil.Process(pid)
        proc.terminate()
        proc.wait(wait_s)
    except psutil.TimeoutExpired:
        proc.kill()
    except psutil.NoSuchProcess:
        pass


def _netns_list() -> set[str]:
    return set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()


def check_link(latency_ms: float | None = None, jitter_ms: float | None = None,
               loss_pct: float | None = None) -> None:
    """One line for a latency, jitter or loss out of range."""
    for what, value, hi, unit in (("latency", latency_ms, 10_000, "ms"), ("jitter", jitter_ms, 10_000, "ms"),
                                  ("loss", loss_pct, 100, "%")):
        if value is not None and not 0 <= value <= hi:
            raise TestbedInputError(f"{what} {value:g} {unit}: give 0 to {hi} {unit}")
    if loss_pct and shutil.which("nft") is None:
        raise TestbedInputError("loss needs nftables' `nft` (apt-get install nftables)")


def check_rate(rate: str | None) -> str | None:
    if rate is not None and not _RATE.fullmatch(rate):
        raise TestbedInputError(f"rate {rate!r} is not a tc rate such as 10mbit, 1gbit or 500kbit")
    return rate


def _check_cpu(cpu: float | None) -> float | None:
    try:
        cpushare.check(cpu)
    except ValueError as e:
        raise TestbedInputError(str(e)) from None
    return cpu


def _rate_bits(rate: str) -> float:
    number, unit = re.match(r"([\d.]+)(\w+)", rate).groups()
    return float(number) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[unit]


class Testbed:
    def __init__(self, name: str, slot: int, nodes: dict[str, Node], relay_pid: int | None = None,
                 private: tuple[str, ...] = ("/tmp",)):
        self.name, self.slot, self.nodes, self.relay_pid = name, slot, nodes, relay_pid
        self.private = tuple(private)

    # -- where things are ------------------------------------------------------------------
    @property
    def dir(self) -> str:
        return os.path.join(state_root(), self.name)

    @property
    def wire(self) -> str:
        return f"tfsb{self.slot}-wire"

    @property
    def token_file(self) -> str:
        return os.path.join(self.dir, "token")

    @property
    def hooks(self) -> list[str]:
        """The hooks' addresses for ``cluster.hooks``, in node order (n1, n2, ...)."""
        return [f"{n.advertised}:{HOOK_PORT}" for n in self.nodes.values() if n.name != COORDINATOR]

    def cluster_toml(self, hooks: list[str] | None = None) -> str:
        """The job file's ``[cluster]`` table for this testbed (``hooks``: some of its hooks only)."""
        hooks = ", ".join(f'"{h}"' for h in (hooks or self.hooks))
        return (f"[cluster]\nhooks = [{hooks}]\ntoken_file = \"{self.token_file}\"\n"
                f"task_ports = [{TASK_PORTS[0]}, {TASK_PORTS[1]}]\n")

    def node(self, name: str) -> Node:
        if name not in self.nodes:
            raise TestbedInputError(f"testbed {self.name!r} has no node {name!r}; it has {', '.join(self.nodes)}")
        return self.nodes[name]

    def command(self, node: str, argv: list[str]) -> list[str]:
        """``argv`` run on ``node`` (in its network namespace, and within its CPU share)."""
        n = self.node(node)
        command = ["ip", "netns", "exec", n.netns, *argv]
        if n.cpu is not None:   # joins the node's cgroup first, as the hook's own tasks are in it (outside the
            # namespace: `ip netns exec` mounts a /sys of its own, without the cgroups)
            command = ["sh", "-c", f'echo $$ > {cpushare.procs_file(n.netns)} && exec "$@"', "sh", *command]
        return command

    # -- making and removing -----------------------------------------------------------------
    @classmethod
    def up(cls, name: str = "tfsync", nodes: int = 3, latency_ms: float = 0.0, rate: str | None = None,
           private: tuple[str, ...] = ("/tmp",), log=None, jitter_ms: float = 0.0,
           loss_pct: float = 0.0, cpu: float | None = None, hooks: bool = True) -> "Testbed":
        """Make a testbed of ``nodes`` nodes (each running a hook, unless not ``hooks``:
        then the nodes run what the caller starts there) plus the coordinator's node."""
        if not _NAME.fullmatch(name):
            raise TestbedInputError(f"testbed name {name!r}: use 1-16 lower-case letters, digits and '-'")
        if not 1 <= nodes <= 200:
            raise TestbedInputError(f"nodes = {nodes}: a testbed has 1 to 200 nodes")
        check_link(latency_ms, jitter_ms, loss_pct)
        check_rate(rate)
        _check_cpu(cpu)
        for d in private:
            if not os.path.isabs(d) or os.path.realpath(d) in ("/", "/proc", "/sys", "/dev", "/run"):
                raise TestbedInputError(f"private directory {d!r}: give an absolute path other than / /proc /sys /dev /run")
        reason = unavailable_reason()
        if reason:
            raise TestbedError(f"no testbed here: {reason}")
        if os.path.exists(os.path.join(state_root(), name)):
            raise TestbedInputError(f"testbed {name!r} is up already (tfsync testbed down {name} removes it)")
        slot = cls._free_slot()
        base, adv = (ipaddress.ip_network(f"198.18.{2 * slot + i}.0/24") for i in (0, 1))
        made = {}
        for k, node in enumerate([COORDINATOR] + [f"n{i}" for i in range(1, nodes + 1)]):
            made[node] = Node(node, f"tfsb{slot}-{node}", str(base[10 + k]), str(adv[10 + k]), latency_ms, rate,
                              jitter_ms, loss_pct, cpu=None if node == COORDINATOR else cpu)
        bed = cls(name, slot, made, private=tuple(private))
        safefile.make_dir(state_root(), 0o700)
        safefile.make_dir(bed.dir, 0o700)
        try:
            bed._make(base, adv, log, hooks)
        except BaseException:
            bed.down()
            raise
        return bed

    @staticmethod
    def _free_slot() -> int:
        used = {int(m.group(1)) for n in _netns_list() if (m := re.fullmatch(r"tfsb(\d+)-.*", n))}
        free = [s for s in range(SLOTS) if s not in used]
        if not free:
            raise TestbedError(f"all {SLOTS} testbed slots are taken (tfsync testbed status)")
        return free[0]

    def _make(self, base, adv, log, hooks: bool = True) -> None:
        say = log or (lambda msg: None)
        from tfsync.api import auth
        auth.write_token(self.token_file)
        self.save()
        w = self.wire
        _run("ip", "netns", "add", w)
        _run("ip", "-n", w, "link", "set", "lo", "up")
        # a MAC of its own: a bridge otherwise takes its lowest port's, so a veth added later
        # (a node remade, another host) could change it, and the nodes' ARP entries for the
        # bridge's address would point nowhere for seconds (every hook "does not answer")
        _run("ip", "-n", w, "link", "add", "br0", "address", f"02:74:66:73:{self.slot:02x}:01", "type", "bridge")
        _run("ip", "-n", w, "addr", "add", f"{base[1]}/{base.prefixlen}", "dev", "br0")
        _run("ip", "-n", w, "link", "set", "br0", "up")
        for node in self.nodes.values():
            ns = node.netns
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", w, "link", "add", f"v-{node.name}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "-n", w, "link", "set", f"v-{node.name}", "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{node.address}/{base.prefixlen}", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "route", "add", str(adv), "via", str(base[1]))
            _run("ip", "-n", w, "addr", "add", f"{node.advertised}/32", "dev", "lo")
            self._shape(node)
        self._lose()
        say(f"{len(self.nodes)} namespaces on bridge {base} (advertised {adv})")
        self._write_relay_config()
        self.relay_pid = self._spawn(w, [sys.executable, "-m", "tfsync.testbed.relay", self.relay_config],
                                     "relay.log", "tfsync relay:")
        say(f"latency relay running (pid {self.relay_pid})")
        for node in self.nodes.values():
            if hooks and node.name != COORDINATOR:
                self.start_hook(node.name)
                say(f"node {node.name}: hook at {node.advertised}:{HOOK_PORT} (pid {node.pid})")
        self.save()

    def start_hook(self, name: str, more: tuple[str, ...] = ()) -> int:
        """Start node ``name``'s hook, with ``more`` of the hook's arguments (``--join ...``),
        stopping the one running there first (its tasks go with it); returns its pid."""
        node = self.node(name)
        if node.pid is not None:
            _stop(node.pid)
        argv = ["unshare", "--mount", "--propagation", "private", sys.executable, "-m", "tfsync.testbed.node",
                "--listen", f"{node.address}:{HOOK_PORT}", "--token-file", self.token_file, "--node", node.name,
                "--task-allow", self.nodes[COORDINATOR].advertised,
                *[a for d in self.private for a in ("--private", d)], *more]
        node.pid = self._spawn(node.netns, argv, f"hook-{node.name}.log", "tfsync hook listening")
        if node.cpu is not None:
            self._share(node)
        self.save()
        return node.pid

    def _spawn(self, netns: str, argv: list[str], log_name: str, ready: str) -> int:
        """Start ``argv`` in ``netns`` (its own session: it outlives this process) and wait
        until its log shows ``ready``."""
        log_path = os.path.join(self.dir, log_name)
        start = os.path.getsize(log_path) if os.path.exists(log_path) else 0   # a restart's: after the last one
        with safefile.open_append(log_path, binary=True) as out:
            proc = subprocess.Popen(["ip", "netns", "exec", netns, *argv], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env=task_env())
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(log_path, errors="replace") as f:
                f.seek(start)
                text = f.read()
            if ready in text:
                return proc.pid
            if proc.poll() is not None:
                tail = text.strip().splitlines()[-1:] or ["(no output)"]
                raise TestbedError(f"{argv[0]} in {netns} exited with {proc.returncode}: {tail[0]} ({log_path})")
            time.sleep(0.05)
        proc.kill()
        raise TestbedError(f"{' '.join(argv[:4])} in {netns} not ready within {START_TIMEOUT_S:.0f} s ({log_path})")

    def down(self) -> None:
        """Stop every process in the testbed's namespaces, remove them (their links go
        with them) and the state directory. Safe to call on a half-made testbed."""
        names = [n.netns for n in self.nodes.values()] + [self.wire]
        present = _netns_list()
        for ns in names:
            if ns in present:
                _kill_all(ns)
        for ns in names:
            if ns in present:
                with contextlib.suppress(TestbedError):
                    _run("ip", "netns", "del", ns)
            cpushare.remove(ns)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- changing links while a job runs ------------------------------------------------------
    def set(self, node: str, latency_ms: float | None = None, rate: str | None = None,
            up: bool | None = None, jitter_ms: float | None = None, loss_pct: float | None = None,
            cpu: float | str | None = None) -> Node:
        """Change ``node``'s link: latency and jitter (the relay picks them up within 0.2 s),
        packet loss, bandwidth (``rate``; "none" removes the limit) or whether it is up at
        all (down: a partition); or its CPU share (``cpu`` CPUs for all its processes, the
        running tasks included; "none" removes the cap)."""
        n = self.node(node)
        check_link(latency_ms, jitter_ms, loss_pct)
        if cpu is not None:
            if n.name == COORDINATOR:
                raise TestbedInputError("cpu: the coordinator's node has no CPU share; give a task node")
            n.cpu = None if cpu == "none" else _check_cpu(float(cpu))
            self._share(n)
        if latency_ms is not None or jitter_ms is not None:
            n.latency_ms = n.latency_ms if latency_ms is None else float(latency_ms)
            n.jitter_ms = n.jitter_ms if jitter_ms is None else float(jitter_ms)
            self._write_relay_config()
        if loss_pct is not None:
            n.loss_pct = float(loss_pct)
            self._lose()
        if rate is not None:
            n.rate = None if rate == "none" else check_rate(rate)
            self._shape(n)
        if up is not None:
            n.up = up
            _run("ip", "-n", self.wire, "link", "set", f"v-{n.name}", "up" if up else "down")
        self.save()
        return n

    def _lose(self) -> None:
        """Drop ``loss_pct`` % of the packets each node sends, at random, where they enter the
        wire (an nftables ingress chain on the node's veth in the wire namespace: this kernel
        has no netem). Dropped on the way, as netem's loss: in the node's own output chain the
        sender would be told (EPERM) instead. One table for every node, written whole."""
        text = "table netdev tfsync_loss {}\ndelete table netdev tfsync_loss\n"  # add-then-delete: never fails
        lossy = [n for n in self.nodes.values() if n.loss_pct > 0]
        if lossy:
            text += "table netdev tfsync_loss {\n" + "".join(
                f"\tchain {n.name} {{\n\t\ttype filter hook ingress device \"v-{n.name}\" priority filter;\n"
                f"\t\tnumgen random mod 10000 < {round(n.loss_pct * 100)} drop\n\t}}\n" for n in lossy) + "}\n"
        elif shutil.which("nft") is None:
            return  # never set: nothing to remove
        r = subprocess.run(["ip", "netns", "exec", self.wire, "nft", "-f", "-"], input=text, capture_output=True,
                           text=True, timeout=30)
        if r.returncode != 0:
            raise TestbedError(f"packet loss: nft failed: {r.stderr.strip() or r.returncode}")

    def _share(self, node: Node) -> None:
        """Put every process of ``node`` in its cgroup, capped at ``node.cpu`` CPUs."""
        r = subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True)
        try:
            cpushare.limit(node.netns, node.cpu, [int(p) for p in r.stdout.split()])
        except cpushare.CpuShareError as e:
            raise TestbedError(f"cpu share of {node.name}: {e}") from None

    def _shape(self, node: Node) -> None:
        for ns, dev in ((node.netns, "eth0"), (self.wire, f"v-{node.name}")):
            if node.rate is None:
                subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True)
                continue
            burst = max(32 * 1024, int(_rate_bits(node.rate) / 8 / 250))   # >= one 4 ms tick of data
            _run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", node.rate,
                 "burst", str(burst), "latency", "100ms")

    # -- state -------------------------------------------------------------------------------
    @property
    def relay_config(self) -> str:
        return os.path.join(self.dir, "relay.json")

    def _write_relay_config(self) -> None:
        config = {"nodes": {n.name: {"address": n.address, "advertised": n.advertised, "latency_ms": n.latency_ms,
                                     "jitter_ms": n.jitter_ms} for n in self.nodes.values()},
                  "ports": [[HOOK_PORT, HOOK_PORT], list(TASK_PORTS)]}
        safefile.write(self.relay_config, json.dumps(config, indent=1))

    def save(self) -> None:
        state = {"name": self.name, "slot": self.slot, "relay_pid": self.relay_pid, "private": list(self.private),
                 "nodes": [asdict(n) for n in self.nodes.values()]}
        safefile.write(os.path.join(self.dir, "testbed.json"), json.dumps(state, indent=1), mode=0o600)

    @classmethod
    def load(cls, name: str = "tfsync") -> "Testbed":
        path = os.path.join(state_root(), name, "testbed.json")
        try:
            with open(path) as f:
                state = json.load(f)
            nodes = {n["name"]: Node(**n) for n in state["nodes"]}
            return cls(state["name"], state["slot"], nodes, state.get("relay_pid"), tuple(state.get("private", ())))
        except FileNotFoundError:
            raise TestbedInputError(f"no testbed {name!r} is up (tfsync testbed up --name {name})") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TestbedError(f"testbed state {path} cannot be read ({e}); remove it with tfsync testbed down "
                               f"--name {name}") from None

    @staticmethod
    def names() -> list[str]:
        root = state_root()
        return sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "testbed.json"))) \
            if os.path.isdir(root) else []

    def status(self) -> dict:
        present = _netns_list()
        nodes = []
        for n in self.nodes.values():
            alive = n.pid is None or pid_alive(n.pid)
            nodes.append({**asdict(n), "present": n.netns in present, "hook_alive": alive})
        return {"name": self.name, "slot": self.slot, "relay_alive": bool(self.relay_pid and pid_alive(self.relay_pid)),
                "hooks": self.hooks, "token_file": self.token_file, "task_ports": list(TASK_PORTS), "nodes": nodes}


def _kill_all(netns: str, grace_s: float = 5.0) -> None:
    """SIGTERM every process in ``netns`` (a hook stops its tasks then), SIGKILL what is left."""
    def pids():
        r = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        left = pids()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = pids()
        if not left:
            return
