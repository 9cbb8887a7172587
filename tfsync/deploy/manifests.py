"""The Kubernetes objects of a tfsync job (``tfsync k8s``), as plain dicts: what each mode
is made of and why is ``tfsync.deploy.k8s``'s docstring; this module only assembles them.

    objects = manifests(K8sJob(name="mnist", files=(("mnist.toml", text),), workers=2, ps=1, image="tfsync:0.1.0"))

Every pod runs as the image's user (``runAsNonRoot``, no privilege escalation, no
capabilities, the runtime's seccomp profile: Kubernetes' "restricted" Pod Security
level), has no service-account token (tfsync never calls the Kubernetes API) and no
Service environment variables. Standard library only (base layer).
"""

from __future__ import annotations

import base64

from .k8s import (CHIEF_SCRIPT, HOOK_PORT, HOOKS_TOKEN, JOB_DIR, MANAGER_TOKEN, RETRIES, RUN_DIR_WAIT_S, RUNS,
                  SECRET_DIR, START_WAIT_S, TF_PORT, TOKEN_DIR, UID, WORKER_SCRIPT, K8sJob, failure_policy,
                  hook_address, manager_address, run_args, task_spec, tf_configs)

TASK_SERVER = ["python", "-m", "tfsync.engine.server"]   # a TF_CONFIG task (tfsync.engine.server)
HOOK_LABEL = "tfsync/hook"                                # on every node pod: the nodes' Service selects it
RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
SMALL = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}   # an init container
CHIEF_START_S, TASK_START_S = 300, 120   # startup probes' patience: TF's import, the job's data, the manager
CHIEF_GRACE_S = 120                      # SIGTERM: the chief checkpoints and stops its tasks first


def manifests(job: K8sJob) -> list[dict]:
    """Every object of the job, in the order ``kubectl apply`` should create them."""
    shared = [*([secret(job)] if job.mode == "hooks" and job.tokens is not None else []), config_map(job),
              *([claim(job)] if job.storage else []), network_policy(job)]
    return shared + (hooks_mode(job) if job.mode == "hooks" else tfconfig_mode(job))


# -- what every mode has ----------------------------------------------------------------------
def labels(job: K8sJob, component: str | None = None) -> dict:
    out = {"app.kubernetes.io/name": "tfsync", "app.kubernetes.io/instance": job.name}
    return {**out, "app.kubernetes.io/component": component} if component else out


def metadata(job: K8sJob, name: str, component: str | None = None) -> dict:
    return {"name": name, "namespace": job.namespace, "labels": labels(job, component)}


def secret(job: K8sJob) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata(job, f"{job.name}-tokens"), "type": "Opaque",
            "stringData": {name: token + "\n" for name, token in sorted(job.tokens.items())}}


def config_map(job: K8sJob) -> dict:
    """The job file (key ``file-0``) and the code files (``file-1``, ...); the volume puts
    each at its path relative to the job file's folder."""
    data, binary = {}, {}
    for i, (_, content) in enumerate(job.files):
        try:
            data[f"file-{i}"] = content.decode("utf-8")
        except UnicodeDecodeError:
            binary[f"file-{i}"] = base64.b64encode(content).decode("ascii")
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(job, f"{job.name}-job"),
            "data": data, **({"binaryData": binary} if binary else {})}


def claim(job: K8sJob) -> dict:
    """The run directory's volume: one pod's (ReadWriteOnce), or in TF_CONFIG mode shared
    by the chief and the workers, who read its records (ReadWriteMany)."""
    spec = {"accessModes": ["ReadWriteOnce" if job.mode == "hooks" else "ReadWriteMany"],
            "resources": {"requests": {"storage": job.storage}}}
    if job.storage_class:
        spec["storageClassName"] = job.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata(job, f"{job.name}-runs"),
            "spec": spec}


def network_policy(job: K8sJob) -> dict:
    """Only the job's own pods reach its pods: TF's task ports have no authentication and
    the manager serves plaintext (where the network plugin enforces NetworkPolicies)."""
    own = {"matchLabels": labels(job)}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata(job, job.name),
            "spec": {"podSelector": own, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": own}]}]}}


def headless(job: K8sJob, name: str, selector: dict, ports: list[tuple[str, int]]) -> dict:
    """A Service that gives its pods DNS names (no virtual IP), from their start on."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(job, name),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector,
                     "ports": [{"name": n, "port": p, "targetPort": p} for n, p in ports]}}


def probes(port: str, start_s: int) -> dict:
    """The port accepts connections: within ``start_s`` of the start, then every 10 s
    (ready) and 20 s (alive; three misses restart the container)."""
    check = {"tcpSocket": {"port": port}}
    return {"startupProbe": {**check, "periodSeconds": 5, "failureThreshold": start_s // 5},
            "readinessProbe": {**check, "periodSeconds": 10},
            "livenessProbe": {**check, "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3}}


def container(job: K8sJob, name: str, command: list[str], args: list[str], ports: list[tuple[str, int]],
              env: list[dict] = (), mounts: list[dict] = (), start_s: int = TASK_START_S) -> dict:
    """A tfsync container: GRPC_FAIL_FAST as TF's PS guide sets it, probes on its first port."""
    return {"name": name, "image": job.image, "command": command, **({"args": args} if args else {}),
            "env": [{"name": "GRPC_FAIL_FAST", "value": "use_caller"}, *env],
            "ports": [{"name": n, "containerPort": p} for n, p in ports],
            "resources": job.resources.spec(), "securityContext": RESTRICTED, "volumeMounts": list(mounts),
            **probes(ports[0][0], start_s)}


def pod(containers: list[dict], volumes: list[dict], restart: str, init: list[dict] = (),
        grace: int | None = None, **placement) -> dict:
    spec = {"restartPolicy": restart, "automountServiceAccountToken": False, "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            **placement, **({"initContainers": list(init)} if init else {}), "containers": containers,
            "volumes": volumes}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return spec


def batch_job(job: K8sJob, name: str, component: str, spec: dict) -> dict:
    """A Job of one pod, never restarted in place: the exit code decides (failure_policy)."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata(job, name, component),
            "spec": {"backoffLimit": RETRIES, "podFailurePolicy": failure_policy(spec["containers"][0]["name"]),
                     "template": {"metadata": {"labels": labels(job, component)}, "spec": spec}}}


def token_volumes(job: K8sJob, files: list[str]) -> tuple[dict, list[dict], dict]:
    """The init container that copies ``files`` of the Secret, 0400 and the pod user's,
    to the tokens folder; the volumes; the main container's read-only mount of the copies."""
    init = {"name": "tokens", "image": job.image,
            "command": ["install", "-m", "0400", *(f"{SECRET_DIR}/{f}" for f in files), f"{TOKEN_DIR}/"],
            "resources": SMALL, "securityContext": RESTRICTED,
            "volumeMounts": [{"name": "secret", "mountPath": SECRET_DIR, "readOnly": True},
                             {"name": "tokens", "mountPath": TOKEN_DIR}]}
    volumes = [{"name": "secret", "secret": {"secretName": f"{job.name}-tokens", "defaultMode": 0o400,
                                             "items": [{"key": f, "path": f} for f in files]}},
               {"name": "tokens", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]
    return init, volumes, {"name": "tokens", "mountPath": TOKEN_DIR, "readOnly": True}


def waiting(job: K8sJob, addresses: list[str]) -> dict:
    """An init container: the chief starts once ``addresses`` listen (at most START_WAIT_S)."""
    return {"name": "wait", "image": job.image,
            "command": ["python", "-m", "tfsync.deploy.k8s", "wait", str(START_WAIT_S), *addresses],
            "resources": SMALL, "securityContext": RESTRICTED}


def chief(job: K8sJob, env: list[dict] = (), ports: list[tuple[str, int]] = (), placement=None,
          init: list[dict] = (), volumes: list[dict] = (), mounts: list[dict] = ()) -> dict:
    """The chief's Job: ``tfsync run`` (``resume`` after a retry, where a checkpoint is kept)."""
    job_files = {"name": "job", "configMap": {"name": f"{job.name}-job", "items": [
        {"key": f"file-{i}", "path": path} for i, (path, _) in enumerate(job.files)]}}
    runs = [{"name": "runs", "persistentVolumeClaim": {"claimName": f"{job.name}-runs"}}] if job.storage else []
    main = container(job, "chief", ["/bin/sh", "-c", CHIEF_SCRIPT, "tfsync-chief", job.run_dir], run_args(job),
                     [("manager", job.manager_port), *ports], env,
                     [{"name": "job", "mountPath": JOB_DIR, "readOnly": True}, *mounts,
                      *([{"name": "runs", "mountPath": RUNS}] if job.storage else [])], CHIEF_START_S)
    spec = pod([main], [job_files, *volumes, *runs], "Never", init, CHIEF_GRACE_S, **(placement or {}))
    return batch_job(job, f"{job.name}-chief", "chief", spec)


# -- hooks mode -------------------------------------------------------------------------------
def hooks_mode(job: K8sJob) -> list[dict]:
    init, volumes, mount = token_volumes(job, [HOOKS_TOKEN, MANAGER_TOKEN])
    return [headless(job, f"{job.name}-chief", labels(job, "chief"), [("manager", job.manager_port)]),
            headless(job, f"{job.name}-nodes", {**labels(job), HOOK_LABEL: "yes"}, [("hook", HOOK_PORT)]),
            chief(job, init=[init, waiting(job, [hook_address(job, i) for i in range(job.initial_nodes)])],
                  volumes=volumes, mounts=[mount]),
            nodes(job, joining=False), nodes(job, joining=True)]


def nodes(job: K8sJob, joining: bool) -> dict:
    """The node pods the job starts on (listed in cluster.hooks), or those that join it."""
    component = "join" if joining else "node"
    args = ["hook", "--listen", f"0.0.0.0:{HOOK_PORT}", "--allow-remote", "--token-file", f"{TOKEN_DIR}/{HOOKS_TOKEN}"]
    # a pod's hook is no root with nft: the NetworkPolicy keeps others off its tasks' ports
    env = [{"name": "TFSYNC_NO_FIREWALL", "value": "1"}]
    if joining:
        args += ["--join", manager_address(job), "--manager-token-file", f"{TOKEN_DIR}/{MANAGER_TOKEN}",
                 "--advertise", f"$(POD_NAME).{job.name}-nodes.{job.namespace}.svc:{HOOK_PORT}"]
        env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    init, volumes, mount = token_volumes(job, [HOOKS_TOKEN, MANAGER_TOKEN] if joining else [HOOKS_TOKEN])
    hook = container(job, "hook", ["tfsync"], args, [("hook", HOOK_PORT)], env, [mount])
    selector = labels(job, component)
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata(job, f"{job.name}-{component}",
                                                                                  component),
            "spec": {"serviceName": f"{job.name}-nodes", "replicas": 0 if joining else job.initial_nodes,
                     "podManagementPolicy": "Parallel", "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": {**selector, HOOK_LABEL: "yes"}},
                                  "spec": pod([hook], volumes, "Always", [init])}}}


# -- TF_CONFIG mode ---------------------------------------------------------------------------
def tfconfig_mode(job: K8sJob) -> list[dict]:
    configs = tf_configs(job)

    def place(task: str) -> dict:
        return {"hostname": f"{job.name}-{task}", "subdomain": f"{job.name}-tasks"}

    def tf_config(kind: str, index: int) -> list[dict]:
        return [{"name": "TF_CONFIG", "value": configs[(kind, index)]}]

    out = [headless(job, f"{job.name}-tasks", labels(job), [("tf", TF_PORT)]),
           # (not the workers: they wait for the chief's run directory)
           chief(job, tf_config("chief", 0), [("tf", TF_PORT)], place("chief"), [waiting(job, task_spec(job)["ps"])])]
    runs = [{"name": "runs", "persistentVolumeClaim": {"claimName": f"{job.name}-runs"}}] if job.storage else []
    for kind, count in (("ps", job.ps), ("worker", job.workers)):
        for i in range(count):
            command, mounts = TASK_SERVER, []
            if kind == "worker" and job.storage:   # its records are in the chief's run directory
                command = ["/bin/sh", "-c", WORKER_SCRIPT, "tfsync-worker", job.run_dir, str(RUN_DIR_WAIT_S),
                           *TASK_SERVER]
                mounts = [{"name": "runs", "mountPath": RUNS}]
            task = container(job, "task", command, [], [("tf", TF_PORT)], tf_config(kind, i), mounts,
                             TASK_START_S + (RUN_DIR_WAIT_S if mounts else 0))
            spec = pod([task], runs if mounts else [], "Never", **place(f"{kind}-{i}"))
            out.append(batch_job(job, f"{job.name}-{kind}-{i}", kind, spec))
    return out
