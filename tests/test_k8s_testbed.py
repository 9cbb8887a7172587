"""The pods `tfsync k8s` writes, started on the namespace testbed by a stand-in for the
kubelet (tests/kubelet.py: each container's command, arguments, environment and mounted
files exactly as the manifests give them, the Services' DNS names resolved to the nodes
that run their pods): the user's own model trains on two node pods to the accuracy of a
local run, a node pod killed mid-run is replaced and every push is counted once, two
pods of <name>-join join (2 -> 4 workers) and are deleted again (4 -> 2), and `tfsync
stop` through "kubectl exec" ends the chief's Job with exit code 0; with --mode tfconfig,
a pod per task with its TF_CONFIG trains the same model. Needs root, iproute2,
unshare, nsenter and overlayfs: skipped, saying why, without them. No Kubernetes cluster:
what that leaves untested is in kubelet.py's docstring and docs/guide/kubernetes.md."""

import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import records, tasks_under
from kubelet import Kubelet
from tfsync.cli import build_parser
from tfsync.cli.k8s import k8s_job
from tfsync.deploy import k8s
from tfsync.deploy.manifests import manifests
from tfsync.testbed import bed as testbed

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _unavailable() -> str | None:
    reason = testbed.unavailable_reason()
    if reason:
        return reason
    missing = [t for t in ("unshare", "nsenter", "mount") if shutil.which(t) is None]
    if missing:
        return f"no {', '.join(missing)} (util-linux)"
    with open("/proc/filesystems") as f:
        if "overlay" not in f.read():
            return "no overlayfs in this kernel (a pod's own /etc)"
    return None


REASON = _unavailable()
if REASON:
    pytestmark.append(pytest.mark.skipif(True, reason=f"no pods on a testbed here: {REASON}"))

# The user's own model and data function, in a file of the job's folder (the ConfigMap
# carries it): the MNIST digits installed with tfsync, as the image has them.
CODE = '''
import os

import numpy as np
import tf_keras as keras

import tfsync.datasets


def digits():
    d = np.load(os.path.join(os.path.dirname(tfsync.datasets.__file__), "mnist_sample.npz"))

    def flat(x):
        return (x.reshape(len(x), -1) / 255.0).astype(np.float32)

    return (flat(d["x_train"]), d["y_train"].astype(np.int32)), (flat(d["x_test"]), d["y_test"].astype(np.int32))


def mlp(units=32):
    return keras.Sequential([keras.layers.Input((784,)), keras.layers.Dense(units, activation="relu"),
                             keras.layers.Dense(10)])
'''
JOB = """\
[job]
name = "digits"
[model]
fn = "digits.py:mlp"
[data]
fn = "digits.py:digits"
[train]
loss = "SparseCategoricalCrossentropy"
loss_args = {from_logits = true}
optimizer = "adam"
learning_rate = 0.002
batch_size = 16
epochs = 100
checkpoint_every = 200
[cluster]
workers = 2
ps = 1
min_workers = 2
max_workers = 4
[[protocol]]
name = "bsp"
"""
TRAIN_SIZE = 6000   # digits()'s training samples


def _wait(what, check, chief, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        assert chief.main.poll() is None, f"the chief ended before {what}: {chief.log()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}: {chief.log()[-6000:]}")


def _pushes(run_dir, after=0):
    """The counted pushes so far, those after push number ``after``."""
    return [r for r in records(run_dir) if "pushes" in r and "event" not in r and r["pushes"] > after]


def _event(run_dir, name):
    return [r for r in records(run_dir) if r.get("event") == name]


def _job(tmp_path, monkeypatch, *options):
    """The user's job in a folder of its own and its K8sJob (``tfsync k8s`` with ``options``)."""
    monkeypatch.setenv("TFSYNC_HOME", str(tmp_path / "home"))
    project = tmp_path / "project"
    project.mkdir()
    (project / "digits.py").write_text(CODE)
    (project / "job.toml").write_text(JOB)
    job = k8s_job(build_parser().parse_args(["k8s", str(project / "job.toml"), "--namespace", "ml", "--storage",
                                             "1Gi", *options]))
    return job, project


@contextlib.contextmanager
def _kubelet(tmp_path, job, hosts, nodes, relay=True):
    bed = testbed.Testbed.up("k8s", nodes=nodes, hooks=False)
    kubelet = Kubelet(bed, manifests(job), hosts, str(tmp_path / "kubelet"), relay=relay)
    try:
        yield kubelet
    finally:
        kubelet.stop_all()
        bed.down()


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """The job's manifests (2 node pods, a volume for the run directory) and a kubelet on a
    testbed of four nodes: n1, n2 for <name>-node-0, -1; n3, n4 for <name>-join-0, -1."""
    job, project = _job(tmp_path, monkeypatch, "--nodes", "2")
    hosts = {k8s.manager_address(job).rsplit(":", 1)[0]: "c"}
    for i in range(2):
        hosts[k8s.hook_address(job, i).rsplit(":", 1)[0]] = f"n{1 + i}"
        hosts[k8s.hook_address(job, i, joining=True).rsplit(":", 1)[0]] = f"n{3 + i}"
    with _kubelet(tmp_path, job, hosts, 4) as kubelet:
        yield job, kubelet, project


def test_the_pods_train_survive_a_killed_node_pod_and_scale_2_4_2_through_joining_pods(cluster, tmp_path):
    job, kubelet, project = cluster
    name = job.name
    nodes = [kubelet.start(f"n{1 + i}", "StatefulSet", f"{name}-node", i) for i in range(2)]
    chief = kubelet.start("c", "Job", f"{name}-chief")
    run_dir = Path(kubelet.claims(f"{name}-runs")) / name
    _wait("20 pushes", lambda: len(_pushes(run_dir)) >= 20, chief)

    # node pod 1 (worker 0; the PS and worker 1 are on node pod 0) is lost and replaced under its name
    killed_at = len(_pushes(run_dir))
    nodes[1].kill()
    replaced = kubelet.start("n2", "StatefulSet", f"{name}-node", 1)
    _wait("the replaced pod's worker", lambda: any(r["worker"] == 0 for r in _pushes(run_dir, killed_at)) and
          any(n.startswith("tfsync-worker") for n in tasks_under(replaced.main.pid).values()), chief)

    # kubectl scale statefulset/<name>-join --replicas=2: both join, 2 -> 3 -> 4 workers
    joins = [kubelet.start(f"n{3 + i}", "StatefulSet", f"{name}-join", i) for i in range(2)]
    _wait("both joins", lambda: all("joined;" in p.log() for p in joins), chief, timeout=300)
    _wait("pushes of workers 2 and 3", lambda: {2, 3} <= {r["worker"] for r in _pushes(run_dir)}, chief)

    # kubectl scale ... --replicas=0: both pods deleted (SIGTERM; their hooks stop their tasks): 4 -> 2
    assert kubelet.delete(joins, grace_s=30) == [0, 0], [p.log()[-2000:] for p in joins]
    _wait("the job back at 2 workers", lambda: any(e["to"] == 2 for e in _event(run_dir, "scaled")), chief)
    shrunk_at = len(_pushes(run_dir))   # (records are written in order: those after it are at 2 workers)
    _wait("pushes at 2 workers, and 2 epochs in all (the accuracy near its plateau)",
          lambda: len(_pushes(run_dir, shrunk_at)) >= 10 and
          sum(r["batch_size"] for r in _pushes(run_dir)) >= 2 * TRAIN_SIZE, chief)

    # kubectl exec job/<name>-chief -- tfsync stop RUN_DIR: the Job's pod ends, exit code 0
    stop = chief.exec([f"{sys.prefix}/bin/tfsync", "stop", job.run_dir])
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert chief.main.wait(timeout=300) == 0, chief.log()[-3000:]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped"] and summary["workers"] == 2
    # every counted push once, numbered 1..pushes, across the loss, the joins and the shrink
    pushes = _pushes(run_dir)
    assert [r["pushes"] for r in pushes] == list(range(1, summary["pushes"] + 1))
    assert summary["samples"] == sum(r["batch_size"] for r in pushes)
    assert [r["task"] for r in summary["recoveries"]][:1] == ["worker:0"]
    scales = [(s["from"], s["to"], s["by"]) for s in summary["scales"]]
    assert scales[:2] == [(2, 3, "join"), (3, 4, "join")] and scales[-1][1:] == (2, "loss"), scales
    assert {s["node"] for s in summary["scales"][:2]} == {k8s.hook_address(job, i, joining=True) for i in range(2)}
    assert {r["worker"] for r in _pushes(run_dir, shrunk_at)} == {0, 1}

    # the same job run locally (2 workers on loopback) for as many samples: the same accuracy
    local = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", str(project / "job.toml"), "--json",
                            "--run-dir", str(tmp_path / "local"), "--no-report",
                            "--set", f"train.epochs={summary['samples'] / TRAIN_SIZE:.6f}"],
                           capture_output=True, text=True, timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]
    assert abs(summary["test_accuracy"] - json.loads(local.stdout)["test_accuracy"]) <= 0.02
    assert summary["test_accuracy"] > 0.85


def test_tf_config_pods_train_the_users_model_each_task_a_pod_of_its_own(tmp_path, monkeypatch):
    """--mode tfconfig: a Job per task, each pod with its TF_CONFIG (no hooks); the workers
    start in the chief's run directory on the shared volume once the chief made it; the
    chief's `tfsync run` gets the user's --set; the Job's pod ends with exit code 0."""
    job, _ = _job(tmp_path, monkeypatch, "--mode", "tfconfig", "--set", "train.epochs=1")
    spec = k8s.task_spec(job)
    places = {"chief": "c", "ps": "n1", "worker": ["n2", "n3"]}
    hosts = {spec["chief"][0].rsplit(":", 1)[0]: "c", spec["ps"][0].rsplit(":", 1)[0]: "n1",
             **{a.rsplit(":", 1)[0]: places["worker"][i] for i, a in enumerate(spec["worker"])}}
    # (TF's port 2222 is not one the testbed's relay passes: the pods reach each other directly)
    with _kubelet(tmp_path, job, hosts, 3, relay=False) as kubelet:
        tasks = [kubelet.start("n1", "Job", f"{job.name}-ps-0")]
        tasks += [kubelet.start(node, "Job", f"{job.name}-worker-{i}") for i, node in enumerate(places["worker"])]
        chief = kubelet.start("c", "Job", f"{job.name}-chief")   # (its init container waits for the PS)
        assert chief.main.wait(timeout=600) == 0, chief.log()[-3000:]
        assert "run on this machine" not in chief.log(), chief.log()[-3000:]   # (they are the platform's)
        assert all(t.main.poll() is None for t in tasks)   # TF's servers serve until deleted (kubectl delete -f)
    run_dir = Path(tmp_path / "kubelet" / "claims" / f"{job.name}-runs" / job.name)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["samples"] >= TRAIN_SIZE and summary["workers"] == 2 and summary["test_accuracy"] > 0.85
    assert summary["task_ports"].startswith("started by the platform from TF_CONFIG")   # no hooks: no tfsync tasks
    pushes = _pushes(run_dir)
    assert [r["pushes"] for r in pushes] == list(range(1, summary["pushes"] + 1))
