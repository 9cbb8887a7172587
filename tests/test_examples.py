"""The examples users start from (examples/<name>/: a job file and its model module),
each copied out of the repository, shrunk to a few seconds of training, and run as a
user runs it: `tfsync run job.toml` in a process of its own, on real task processes."""

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CIFAR = os.path.join(ROOT, "..", "shared", "data", "cifar10_subset.npz")


def copy_example(name, tmp_path, changes):
    """examples/<name> copied to tmp_path/project, job.toml edited line by line."""
    project = tmp_path / "project"
    shutil.copytree(os.path.join(ROOT, "examples", name), project, ignore=shutil.ignore_patterns("__pycache__"))
    job = project / "job.toml"
    text = job.read_text()
    for old, new in changes.items():
        assert old in text, f"examples/{name}/job.toml no longer has {old!r}: update this test"
        text = text.replace(old, new)
    job.write_text(text)
    return job


def run(job, tmp_path):
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", str(job), "--json", "--no-manager",
                        "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-2000:]
    pushes = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    return json.loads(r.stdout), [p for p in pushes if "worker" in p]


def mean_loss(pushes):
    return sum(p["loss"] for p in pushes) / len(pushes)


@pytest.mark.skipif(not os.path.exists(CIFAR), reason="needs ../shared/data/cifar10_subset.npz")
def test_the_cifar10_resnet_example_trains_a_batch_norm_resnet(tmp_path):
    """examples/cifar10_resnet, shrunk to ResNet-8 (one block per stage, 8/16/32 filters)
    on 2 000 images: SGD with momentum and a piecewise-constant rate through BSP -> ASP;
    the training loss falls and the test accuracy (batch norm's moving statistics, kept
    on the PS) is clearly above chance (0.1). About 70 updates: 0.29 on a quiet machine,
    0.18 once in CI under load; on 2 000 test images chance is 0.10 +- 0.007, so 0.15 is
    seven deviations above it, and broken moving statistics give 0.10."""
    job = copy_example("cifar10_resnet", tmp_path, {
        "args = {depth = 3, width = 16}": "args = {depth = 1, width = 8}",
        "# args = {path = ": "args = {path = ",
        '"/data/cifar10.npz", limit = 5000, subtract_mean = true}': f'"{CIFAR}", limit = 2000}}',
        "eval_every = 100": "eval_every = 0"})
    summary, pushes = run(job, tmp_path)
    assert summary["samples"] >= 3 * 2000
    assert {p["protocol"] for p in pushes} == {"bsp", "asp"}
    assert mean_loss(pushes[-10:]) < mean_loss(pushes[:4]) - 0.3, [p["loss"] for p in pushes]
    # the loss is reported; above chance (ln 10 = 2.3) while the moving statistics settle (2.81 once, beside other tests)
    assert summary["test_accuracy"] > 0.15 and summary["test_loss"] < 3.5
    import tensorflow as tf
    ckpt = tf.train.load_checkpoint(summary["checkpoints"][-1]["path"])  # the final weights
    moving = [ckpt.get_tensor(k) for k in ckpt.get_variable_to_shape_map() if "moving_mean" in k]
    assert len(moving) == 9 and all(abs(m).max() > 0 for m in moving)  # every step moved them (init: 0)


def test_the_text_classifier_example_learns_topics_from_token_ids(tmp_path):
    """examples/text_classifier on 2 000 generated sentences: TextVectorization in the data
    function, int32 token ids into an Embedding, Adam, BSP -> ASP; the test accuracy over
    four topics is far above chance (0.25) and the loss falls."""
    job = copy_example("text_classifier", tmp_path, {
        "args = {train = 20000, test = 2000,": "args = {train = 2000, test = 1000,",
        "epochs = 2": "epochs = 3",
        "eval_every = 100": "eval_every = 0"})
    summary, pushes = run(job, tmp_path)
    assert summary["samples"] >= 2000
    assert {p["protocol"] for p in pushes} == {"bsp", "asp"}
    assert mean_loss(pushes[-10:]) < mean_loss(pushes[:4]) / 2, [p["loss"] for p in pushes]
    assert summary["test_accuracy"] > 0.7
