"""A stand-in for the kubelet, for tests/test_k8s_testbed.py: it starts the pods of the
manifests `tfsync k8s` writes on testbed nodes (tfsync.testbed), as a kubelet would
start them. There is no Kubernetes cluster here, so this is a test double; what it
keeps from the manifests, exactly:

- each container's ``command`` and ``args``, ``$(VAR)`` expanded from its ``env`` as the
  kubelet expands them (``$$`` is a ``$``), its ``env`` (values and the pod's
  ``metadata.name``/``namespace``) over the image's (the Dockerfile's ENV and PATH, the
  image's Python standing for this machine's), and the image's working directory;
- init containers first, one after another, each to exit 0, then the main container;
- each container sees its ``volumeMounts`` only, at their paths, read-only where marked:
  the ConfigMap's and the Secret's items as files (the Secret's with its ``defaultMode``),
  an ``emptyDir`` shared by the pod's containers, a PersistentVolumeClaim as a folder of
  this machine (``claims``) that outlives the pod;
- its own filesystem view: empty ``/tmp``, ``/home`` (but the image's ``/home/tfsync``)
  and ``/run``, and an ``/etc`` of its own (an overlay) whose ``hosts`` resolves the
  Services' DNS names to the testbed nodes that run their pods (``hosts``), as the
  cluster's DNS would;
- the pod's network: the testbed node's namespace, one pod per node.

What it does not do (a kubelet's, untested here): run as the image's user (every
container runs as root: the test's Python lies in root's home, 0700, in CI), probes,
resource limits, restarts (the test replaces a pod itself, as a StatefulSet would).

Run as ``python kubelet.py SPEC.json`` by the Kubelet class in a node's network namespace
and a mount namespace of its own: it sets up that container's view and ``exec``s it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

IMAGE_ENV = {"PATH": f"{sys.prefix}/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/home/tfsync",
             "PYTHONUNBUFFERED": "1", "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
IMAGE_DIRS = (("/home/tfsync", 0o755), ("/home/tfsync/runs", 0o700))   # the Dockerfile's useradd, install -d
WORKDIR = "/home/tfsync"
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict) -> str:
    """The kubelet's expansion of a command or argument: ``$(VAR)`` from the container's
    env (left as it is when not defined there), ``$$`` to ``$``."""
    return _REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def container_env(spec: dict, pod: str, namespace: str) -> dict:
    """A container's ``env`` as the kubelet gives it: values, and fields of the pod."""
    fields = {"metadata.name": pod, "metadata.namespace": namespace}
    out = {}
    for var in spec.get("env", []):
        if "value" in var:
            out[var["name"]] = expand(var["value"], out)
        else:
            out[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return out


class Pod:
    """One pod on one testbed node: its containers' processes and logs."""

    def __init__(self, kubelet: "Kubelet", node: str, name: str, spec: dict, folder: str):
        self.kubelet, self.node, self.name, self.spec, self.folder = kubelet, node, name, spec, folder
        self.main: subprocess.Popen | None = None

    def log(self, container: str | None = None) -> str:
        path = os.path.join(self.folder, f"{container or self.spec['containers'][0]['name']}.log")
        return open(path, errors="replace").read() if os.path.exists(path) else ""

    def start(self) -> "Pod":
        volumes = self.kubelet.volumes(self.spec, self.folder)
        for c in self.spec.get("initContainers", []):
            proc = self._run(c, volumes)
            if proc.wait(timeout=900) != 0:
                raise RuntimeError(f"pod {self.name}: init container {c['name']} exited with {proc.returncode}: "
                                   f"{self.log(c['name'])[-2000:]}")
        self.main = self._run(self.spec["containers"][0], volumes)
        return self

    def _run(self, c: dict, volumes: dict) -> subprocess.Popen:
        env = container_env(c, self.name, self.kubelet.namespace)
        argv = [expand(a, env) for a in [*c["command"], *c.get("args", [])]]
        setup = {"argv": argv, "env": {**IMAGE_ENV, **env}, "hosts": self.kubelet.hosts,
                 "overlay": os.path.join(self.folder, f"etc-{c['name']}"),
                 "mounts": [{"source": volumes[m["name"]], "path": m["mountPath"], "readOnly": m.get("readOnly", False)}
                            for m in c.get("volumeMounts", [])]}
        path = os.path.join(self.folder, f"{c['name']}.json")
        with open(path, "w") as f:
            json.dump(setup, f)
        with open(os.path.join(self.folder, f"{c['name']}.log"), "ab") as out:
            return subprocess.Popen(self.kubelet.bed.command(self.node, [
                "unshare", "--mount", "--propagation", "private", sys.executable, os.path.abspath(__file__), path]),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def kill(self) -> None:
        """Gone at once (its machine lost, or ``kubectl delete --grace-period=0 --force``):
        SIGKILL to every process of the pod (all of its node's namespace)."""
        for _ in range(50):
            pids = subprocess.run(["ip", "netns", "pids", self.kubelet.bed.node(self.node).netns],
                                  capture_output=True, text=True).stdout.split()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        if self.main is not None:
            self.main.wait(timeout=30)

    def exec(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        """``kubectl exec`` into the main container: its mount and network namespaces, its env."""
        env = {**IMAGE_ENV, **container_env(self.spec["containers"][0], self.name, self.kubelet.namespace)}
        return subprocess.run(["nsenter", "--target", str(self.main.pid), "--mount", "--net",
                               "env", "-i", f"--chdir={WORKDIR}", *(f"{k}={v}" for k, v in env.items()), *argv],
                              capture_output=True, text=True, timeout=timeout)


class Kubelet:
    """Pods of ``objects`` (the manifests) on ``bed``'s nodes; ``hosts``: DNS name to
    testbed node; ``folder``: the pods' files and the claims' folders (``claims``);
    ``relay``: whether connections between nodes cross the testbed's latency relay."""

    def __init__(self, bed, objects: list[dict], hosts: dict[str, str], folder: str, relay: bool = True):
        self.bed, self.objects, self.folder, self.relay = bed, objects, folder, relay
        self.namespace = objects[0]["metadata"]["namespace"]
        self.hosts = "".join(f"{self._address(node)} {name}\n" for name, node in hosts.items())
        self.pods: list[Pod] = []

    def _address(self, node: str) -> str:
        """A node as the others reach it: through the latency relay (its advertised address;
        the relay passes the hook port and the task ports), but the coordinator's node,
        whose manager port the relay does not pass, and every node without ``relay``."""
        n = self.bed.node(node)
        return n.address if node == "c" or not self.relay else n.advertised

    def object(self, kind: str, name: str) -> dict:
        (found,) = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        return found

    def claims(self, name: str) -> str:
        path = os.path.join(self.folder, "claims", name)
        os.makedirs(path, mode=0o755, exist_ok=True)
        return path

    def start(self, node: str, kind: str, name: str, ordinal: int | None = None) -> Pod:
        """Start the pod of workload ``kind``/``name`` (a Job's, or a StatefulSet's pod
        ``ordinal``) on testbed ``node``."""
        spec = self.object(kind, name)["spec"]["template"]["spec"]
        pod_name = name if ordinal is None else f"{name}-{ordinal}"
        folder = os.path.join(self.folder, "pods", f"{pod_name}-{sum(p.name == pod_name for p in self.pods)}")
        os.makedirs(folder)
        pod = Pod(self, node, pod_name, spec, folder).start()
        self.pods.append(pod)
        return pod

    def volumes(self, spec: dict, folder: str) -> dict[str, str]:
        """Each volume of the pod as a folder of this machine."""
        out = {}
        for v in spec.get("volumes", []):
            path = os.path.join(folder, "volumes", v["name"])
            if "persistentVolumeClaim" in v:
                out[v["name"]] = self.claims(v["persistentVolumeClaim"]["claimName"])
                continue
            os.makedirs(path)
            if "emptyDir" in v:
                os.chmod(path, 0o777)
            for source, kind in (("configMap", "ConfigMap"), ("secret", "Secret")):
                if source in v:
                    ref = v[source]
                    obj = self.object(kind, ref.get("name") or ref["secretName"])
                    data = {**obj.get("data", {}), **obj.get("stringData", {})}
                    for item in ref["items"]:
                        with open(os.path.join(path, item["path"]), "w") as f:
                            f.write(data[item["key"]])
                        os.chmod(os.path.join(path, item["path"]), ref.get("defaultMode", 0o644))
            out[v["name"]] = path
        return out

    def delete(self, pods: list[Pod], grace_s: float) -> list[int | None]:
        """The pods deleted together, as the kubelet deletes a pod: SIGTERM to each one's
        main container, SIGKILL to whatever of it is left after ``grace_s``; their main
        containers' exit codes (None: killed)."""
        for pod in pods:
            pod.main.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for pod in pods:
            try:
                pod.main.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            code = pod.main.returncode
            pod.kill()
            pod.main.returncode = code
        return [pod.main.returncode for pod in pods]

    def stop_all(self) -> None:
        for pod in self.pods:
            if pod.main is not None and pod.main.poll() is None:
                pod.kill()


# -- inside the container's namespaces --------------------------------------------------------
def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def container(setup: dict) -> None:
    """Set up this (new) mount namespace as the container sees it, then become it."""
    from tfsync.testbed.node import hide, needed

    os.makedirs(setup["overlay"])
    _mount("-t", "tmpfs", "tfsync-pod-etc", setup["overlay"])   # (an overlay's upper layer cannot be an overlay)
    upper, work = (os.path.join(setup["overlay"], d) for d in ("upper", "work"))
    os.makedirs(upper)
    os.makedirs(work)
    _mount("-t", "overlay", "overlay", "-o", f"lowerdir=/etc,upperdir={upper},workdir={work}", "/etc")
    with open("/etc/hosts", "a") as f:
        f.write(setup["hosts"])
    for d in ("/run", "/home"):
        hide(d, needed())
    for d, mode in IMAGE_DIRS:
        os.makedirs(d, mode=mode, exist_ok=True)
    for m in setup["mounts"]:
        os.makedirs(m["path"], exist_ok=True)
        _mount("--bind", m["source"], m["path"])
        if m["readOnly"]:
            _mount("-o", "remount,bind,ro", m["path"])
    hide("/tmp", needed())   # the volumes' sources too: what stays is bound where the pod mounts it
    os.chdir(WORKDIR)
    argv = setup["argv"]
    os.execvpe(argv[0], argv, setup["env"])


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        container(json.load(f))
