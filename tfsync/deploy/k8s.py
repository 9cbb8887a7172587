"""A tfsync job on Kubernetes (``tfsync k8s``): :class:`K8sJob`, the job as its pods see it,
and what each pod runs (names, addresses, commands, the exit-code policy). The objects
themselves, plain dicts for ``kubectl apply``, are ``tfsync.deploy.manifests``'s; no
Kubernetes client is needed (``tfsync.deploy.yamltext`` writes them).

Two modes, one command (``--mode``):

- ``hooks`` (the default): tfsync's own path, as on the testbed. The chief is a **Job**
  whose pod runs ``tfsync run`` with its manager on ``--manager-port``
  (``--manager-listen 0.0.0.0:PORT``: other pods reach it; plaintext, so a NetworkPolicy
  lets only the job's own pods in). The nodes are **StatefulSets**, not Jobs: a node is a
  server that has to come back under the same name, and a StatefulSet pod has a stable DNS
  name under a headless Service (``<job>-node-0.<job>-nodes.<ns>.svc``) that the job file's
  ``cluster.hooks`` can list. ``<job>-node`` holds the nodes the job starts on (listed in
  ``cluster.hooks``, so they need no ``--join``: a join sent before the job runs would be
  refused and end the hook); ``<job>-join`` starts at 0 replicas and holds the nodes that
  join a running job, ``tfsync hook --join`` against the chief's Service name, each
  advertising its own DNS name: ``kubectl scale statefulset/<job>-join --replicas=N`` grows
  the job (up to ``cluster.max_workers``) as a node joining on the testbed does. A node pod
  killed comes back under its name, which the job's probes find again (recovery, the
  restart switch and ``tfsync scale`` run as they do with hooks on machines). The chief's
  init container waits (at most ``START_WAIT_S``) for the listed nodes to listen, since a
  job whose hooks all fail to answer at its start fails at once.
- ``tfconfig``: tfsync's TF_CONFIG mode, for platforms that start every task. One **Job**
  per task (chief, each PS, each worker), each pod with its own ``TF_CONFIG`` literally as
  ``tfsync tfconfig`` writes it and a stable DNS name (``hostname`` + ``subdomain`` under
  one headless Service), as Kubeflow's TFJob gave its pods. A StatefulSet cannot give its
  pods different environments; Jobs can, and give the exit-code policy below.

Plain objects rather than JobSet or Kubeflow's TFJob: both need a controller installed in
the cluster, and what they add (a group of Jobs started and failed together) is what the
hooks mode does itself, elastically.

Exit codes (``tfsync.base.exits``): every Job has ``restartPolicy: Never`` and a
``podFailurePolicy``: ``EXIT_BAD_INPUT`` (2) fails the Job at once (a job file, a token or
an option that will not be better next time), a pod disrupted by the cluster (eviction,
preemption, a drained node: condition ``DisruptionTarget``) is retried without counting,
and ``EXIT_FAILED`` (1) or ``EXIT_INTERRUPTED`` (130, SIGTERM: a checkpoint was kept) count
against ``backoffLimit``. A retried chief resumes from its last checkpoint where one is in
its run directory (``--storage``: a volume that outlives the pod), else it starts again.
Node pods of a StatefulSet always restart (Kubernetes allows nothing else there); the
chief's Job decides the job's fate.

Tokens: one Secret (``<job>-tokens``: ``hooks.token``, ``manager.token``), mounted as
files, never in an environment variable or an argument. Kubernetes gives a Secret's files
group read access where the pod has an ``fsGroup`` (0400 becomes 0440, kubernetes#57923),
and tfsync refuses a token file group or others may read; so an init container copies the
pod's tokens, mode 0400 and owned by the pod's user, into a memory-backed emptyDir that
the main container mounts read-only.

Probes: the hook's and the manager's gRPC ports take a token on every call, and TF's task
ports speak only TF's protocol, so the kubelet checks that the port accepts connections
(``tcpSocket``): a startup probe long enough for TensorFlow's import, then readiness and
liveness. ``GRPC_FAIL_FAST=use_caller`` is set in every pod, as TensorFlow's parameter
server training guide sets it so that a lost worker or PS is reported to the coordinator
instead of waited for (tfsync's coordinator sets ``true`` around its own connect).

The job file and the user's code files it names (``model.fn = "model.py:build"``) travel
in a ConfigMap mounted where the chief reads the job file; code named as a module
(``"mypkg.models:build"``) must be installed in the image. Only the chief runs the user's
code: PS and workers run the graph functions it sends them.

Standard library only, as ``tfsync.base.tfconfig`` (which it uses); the deploy layer imports base alone.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import sys
import time

from ..base import tfconfig
from ..base.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, BadInput

MODES = ("hooks", "tfconfig")
UID = 10001                               # the image's user (Dockerfile), its group and the pods' fsGroup
HOME = "/home/tfsync"
RUNS = f"{HOME}/runs"                     # run directories (a volume with --storage)
JOB_DIR = "/etc/tfsync/job"               # the job file and its code (the ConfigMap)
SECRET_DIR = "/var/run/tfsync/secret"     # the Secret, in the init container only
TOKEN_DIR = "/var/run/tfsync/tokens"      # the tokens the main containers read (0400, the pod's user)
HOOKS_TOKEN, MANAGER_TOKEN = "hooks.token", "manager.token"
MANAGER_PORT, HOOK_PORT, TF_PORT = 7000, 7070, 2222
TASK_PORTS = (20000, 20099)               # where a node's tasks listen (cluster.task_ports)
RETRIES = 3                               # backoffLimit: failed pods a Job replaces before it fails
RUN_DIR_WAIT_S = 600                      # how long a TF_CONFIG worker waits for the chief's run directory
START_WAIT_S = 600                        # how long the chief waits for its nodes (or PS) to listen
MAX_NAME = 40                             # so that <name>-worker-<i> and the like stay DNS labels
MAX_CONFIGMAP = 1_000_000                 # bytes: Kubernetes keeps a ConfigMap under 1 MiB
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_UNITS = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}

# The chief: `tfsync resume` where its run directory has a checkpoint (a retried pod on a
# volume that outlived the last one), else `tfsync run`. $1: the run directory; the rest:
# the arguments. (No `$(`, `$$`: the kubelet expands those in a container's command.)
CHIEF_SCRIPT = """\
run_dir=$1
shift
for found in "$run_dir"/checkpoints/*; do
  if [ -e "$found" ]; then exec tfsync resume "$@"; fi
done
exec tfsync run "$@"
"""
# A TF_CONFIG worker reads the training records the chief writes in its run directory
# (data/, relative to the task's working directory): it starts there once the chief made it.
WORKER_SCRIPT = """\
run_dir=$1
wait_s=$2
shift 2
waited=0
while [ ! -d "$run_dir" ]; do
  if [ "$waited" -ge "$wait_s" ]; then
    echo "tfsync k8s: $run_dir did not appear in $wait_s s; the chief makes it when it starts:" \\
      "is its pod running, on the same volume (--storage)?" >&2
    exit 1
  fi
  sleep 1
  waited=`expr "$waited" + 1`
done
cd "$run_dir" && exec "$@"
"""


def quantity(option: str, text: str | None) -> float | None:
    """A Kubernetes quantity (``500m``, ``2``, ``4Gi``) as a number; BadInput naming ``option``."""
    if text is None:
        return None
    m = _QUANTITY.fullmatch(str(text))
    if not m:
        raise BadInput(f"{option} {text!r}: not a Kubernetes quantity (e.g. 500m or 2 for CPUs, 512Mi or 4Gi "
                       "for bytes)")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


@dataclasses.dataclass(frozen=True)
class Resources:
    """Each tfsync container's requests and limits (a limit None: none)."""

    cpu: str = "1"
    memory: str = "2Gi"
    cpu_limit: str | None = None      # CPU limits throttle a step; unset by default
    memory_limit: str | None = "4Gi"  # a node's hook holds TF (about 600 MB) and its tasks

    def __post_init__(self):
        for request, limit in (("cpu", "cpu_limit"), ("memory", "memory_limit")):
            asked = quantity(f"--{request}", getattr(self, request))
            most = quantity(f"--{limit.replace('_', '-')}", getattr(self, limit))
            if most is not None and asked > most:
                raise BadInput(f"--{request} {getattr(self, request)}: more than --{limit.replace('_', '-')} "
                               f"{getattr(self, limit)}; a request must fit its limit")

    def spec(self) -> dict:
        limits = {k: v for k, v in (("cpu", self.cpu_limit), ("memory", self.memory_limit)) if v is not None}
        return {"requests": {"cpu": self.cpu, "memory": self.memory}, **({"limits": limits} if limits else {})}


@dataclasses.dataclass(frozen=True)
class K8sJob:
    """The job as its pods see it. ``files``: (path relative to the job file's folder,
    content), the job file first, then the user's code files; ``overrides``: the user's
    ``--set`` texts, passed on to the chief's ``tfsync run``; ``tokens``: the Secret's
    tokens by file name (None: the user makes the Secret ``<name>-tokens``)."""

    name: str
    files: tuple[tuple[str, bytes], ...]
    workers: int
    ps: int
    image: str                            # what the Dockerfile builds: tfsync:VERSION (tfsync.cli.k8s)
    namespace: str = "default"
    mode: str = "hooks"
    nodes: int | None = None              # hooks: node pods the job starts on (None: ps + workers)
    min_workers: int | None = None
    max_workers: int | None = None
    manager_port: int = MANAGER_PORT
    task_ports: tuple[int, int] = TASK_PORTS
    resources: Resources = Resources()
    storage: str | None = None            # a volume of this size for the run directory
    storage_class: str | None = None
    overrides: tuple[str, ...] = ()
    tokens: dict | None = dataclasses.field(default=None, hash=False)

    def __post_init__(self):
        for option, value, limit in (("--name", self.name, MAX_NAME), ("--namespace", self.namespace, 63)):
            if not _LABEL.fullmatch(value) or len(value) > limit:
                raise BadInput(f"{option} {value!r}: expected a DNS label of at most {limit} characters "
                               "(lower-case letters, digits and '-', a letter or digit at each end)")
        if self.mode not in MODES:
            raise BadInput(f"--mode {self.mode!r}: expected one of {', '.join(MODES)}")
        if not self.image or any(c.isspace() for c in self.image):
            raise BadInput(f"--image {self.image!r}: expected an image reference such as tfsync:0.1.0")
        if self.mode == "tfconfig":
            given = [o for o, v in (("--nodes", self.nodes), ("--min-workers", self.min_workers),
                                    ("--max-workers", self.max_workers)) if v is not None]
            if given:
                raise BadInput(f"{given[0]}: for --mode hooks; a TF_CONFIG job's tasks are the platform's, one pod "
                               "each (tfsync scale refuses it)")
        for option, value in (("--workers", self.workers), ("--ps", self.ps), ("--nodes", self.nodes),
                              ("--min-workers", self.min_workers), ("--max-workers", self.max_workers)):
            if value is not None and value < 1:
                raise BadInput(f"{option} {value}: expected at least 1")
        low, high = self.min_workers, self.max_workers
        if low is not None and high is not None and low > high:
            raise BadInput(f"--min-workers {low}: more than --max-workers {high}")
        if (low is not None and self.workers < low) or (high is not None and self.workers > high):
            raise BadInput(f"--workers {self.workers}: outside {low or 1} .. {high or 'unbounded'} (--min-workers .. "
                           "--max-workers, by default the job file's cluster.min_workers and max_workers)")
        if not 1 <= self.manager_port <= 65535 or self.manager_port in (HOOK_PORT, TF_PORT) \
                or self.task_ports[0] <= self.manager_port <= self.task_ports[1]:
            raise BadInput(f"--manager-port {self.manager_port}: expected a port of 1..65535 other than the hooks' "
                           f"{HOOK_PORT}, TF's {TF_PORT} and the tasks' {self.task_ports[0]}-{self.task_ports[1]}")
        quantity("--storage", self.storage)
        if self.storage_class and not self.storage:
            raise BadInput("--storage-class: for the volume --storage SIZE asks for; give --storage too")
        size = sum(len(data) for _, data in self.files)
        if size > MAX_CONFIGMAP:
            raise BadInput(f"the job file and its code come to {size:,} bytes, more than a ConfigMap holds "
                           f"({MAX_CONFIGMAP:,}); install the code in the image and name it as a module "
                           "(\"package.module:function\")")
        for path, _ in self.files:
            if path.startswith("/") or ".." in path.split("/") or not path:
                raise BadInput(f"{path!r}: files carried to the pod are paths inside the job file's folder")

    @property
    def job_file(self) -> str:
        """The job file's path in the chief's pod."""
        return f"{JOB_DIR}/{self.files[0][0]}"

    @property
    def run_dir(self) -> str:
        return f"{RUNS}/{self.name}"

    @property
    def initial_nodes(self) -> int:
        return self.nodes if self.nodes is not None else self.ps + self.workers


# -- names and addresses ----------------------------------------------------------------------
def hook_address(job: K8sJob, index: int, joining: bool = False) -> str:
    """The DNS name and port of node pod ``index`` (of ``<name>-join`` with ``joining``)."""
    return f"{job.name}-{'join' if joining else 'node'}-{index}.{job.name}-nodes.{job.namespace}.svc:{HOOK_PORT}"


def manager_address(job: K8sJob) -> str:
    """Where joining hooks reach the chief's manager: its headless Service's DNS name."""
    return f"{job.name}-chief.{job.namespace}.svc:{job.manager_port}"


def task_spec(job: K8sJob) -> dict:
    """TF_CONFIG mode: the cluster spec, each task at its pod's DNS name."""
    def at(task: str) -> str:
        return f"{job.name}-{task}.{job.name}-tasks.{job.namespace}.svc:{TF_PORT}"
    return {"chief": [at("chief")], "ps": [at(f"ps-{i}") for i in range(job.ps)],
            "worker": [at(f"worker-{i}") for i in range(job.workers)]}


# What the manifests set in the chief's job (chief_overrides), and the option that says
# it: a user's --set of one of them is refused, naming the option.
OWNED = {"cluster.workers": "--workers", "cluster.ps": "--ps", "cluster.min_workers": "--min-workers",
         "cluster.max_workers": "--max-workers", "cluster.hooks": "--nodes (the node pods are the job's hooks)",
         "cluster.token_file": "the Secret (--no-secret: your own)"}


def chief_overrides(job: K8sJob) -> list[str]:
    """The ``--set`` texts the chief's ``tfsync run`` gets from the manifests (the user's
    own follow): the counts, the nodes and their token (hooks mode; TF_CONFIG mode: no
    hooks, TF_CONFIG names the tasks) and where the nodes' tasks listen."""
    sets = {"cluster.workers": job.workers, "cluster.ps": job.ps,
            "cluster.min_workers": job.min_workers, "cluster.max_workers": job.max_workers,
            "cluster.hooks": [hook_address(job, i) for i in range(job.initial_nodes)] if job.mode == "hooks" else []}
    if job.mode == "hooks":
        sets.update({"cluster.token_file": f"{TOKEN_DIR}/{HOOKS_TOKEN}", "cluster.task_ports": list(job.task_ports)})
    return [f"{key}={_toml(value)}" for key, value in sets.items() if value is not None]


def run_args(job: K8sJob) -> list[str]:
    """The arguments of the chief's ``tfsync run`` (or ``resume``)."""
    args = [job.job_file, "--run-dir", job.run_dir, "--quiet", "--manager-listen", f"0.0.0.0:{job.manager_port}",
            "--allow-remote"]
    if job.mode == "hooks":
        args += ["--manager-token-file", f"{TOKEN_DIR}/{MANAGER_TOKEN}"]
    for text in [*chief_overrides(job), *(t.replace("$", "$$") for t in job.overrides)]:
        args += ["--set", text]   # ($$: the kubelet would expand a user's $(VAR), and makes $$ a $)
    return args


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def failure_policy(container: str) -> dict:
    """A Job's podFailurePolicy: bad input fails the Job, a disruption is retried without
    counting, a failed or interrupted run counts against backoffLimit."""
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "In",
                                              "values": [EXIT_BAD_INPUT]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "Count", "onExitCodes": {"containerName": container, "operator": "In",
                                            "values": [EXIT_FAILED, EXIT_INTERRUPTED]}},
    ]}


def tf_configs(job: K8sJob) -> dict[tuple[str, int], str]:
    """TF_CONFIG mode: each task's TF_CONFIG, as ``tfsync tfconfig`` writes it."""
    return tfconfig.generate(task_spec(job))


# -- the chief's first wait -------------------------------------------------------------------
def wait_for(addresses: list[str], timeout_s: float, is_open=None, clock=time.monotonic,
             sleep=time.sleep) -> list[str]:
    """Wait until every ``host:port`` accepts a TCP connection (pods start in any order and
    a node's image may still be pulled), at most ``timeout_s``; the addresses that never did."""
    is_open = is_open or _accepts
    deadline, waiting = clock() + timeout_s, list(addresses)
    while True:
        waiting = [a for a in waiting if not is_open(a)]
        if not waiting or clock() >= deadline:
            return waiting
        sleep(1.0)


def _accepts(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):   # not listening yet, or a name that does not resolve yet
        return False


def main(argv: list[str]) -> int:
    """``python -m tfsync.deploy.k8s wait SECONDS HOST:PORT ...``: the chief pod's init
    container. It never fails the pod: the chief starts once all answer or the time is up,
    and places its tasks on the nodes that answer (none: it fails, naming them)."""
    if len(argv) < 2 or argv[0] != "wait":
        print("usage: python -m tfsync.deploy.k8s wait SECONDS HOST:PORT ...", file=sys.stderr)
        return EXIT_BAD_INPUT
    silent = wait_for(argv[2:], float(argv[1]))
    if silent:
        print(f"tfsync k8s: after {argv[1]} s, {', '.join(silent)} do not answer; the chief starts anyway "
              "(kubectl get pods: are they pending, or pulling the image?)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
