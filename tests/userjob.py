"""A user's model module, outside the package, for the cluster tests that run a user's job
through `tfsync` exactly as the bundled MNIST job (issue 16): tests/test_user_job.py and
tests/test_straggler_engine.py. Not a test module: imported by them."""

MODULE = '''
import numpy as np
import tf_keras as keras


def blobs(n=1600, features=12, classes=4, seed=0):
    """Gaussian blobs: float features, int32 class ids."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=2.0, size=(classes, features)).astype(np.float32)
    y = rng.integers(0, classes, n).astype(np.int32)
    x = (centers[y] + rng.normal(size=(n, features))).astype(np.float32)
    return (x[:1280], y[:1280]), (x[1280:], y[1280:])


def mlp(features=12, classes=4, units=16):
    return keras.Sequential([keras.layers.Input((features,)), keras.layers.Dense(units, activation="tanh"),
                             keras.layers.Dense(classes)])
'''

# The [job], [model], [data] and the first lines of [train] of a job on it; a test adds
# the rest of [train] and its own sections.
JOB_HEAD = """
[job]
name = "{name}"
run_dir = "{run_dir}"
[model]
fn = "blobs_model.py:mlp"
args = {{units = {units}}}
[data]
fn = "blobs_model.py:blobs"
[train]
loss = "SparseCategoricalCrossentropy"
loss_args = {{from_logits = true}}
optimizer = "adam"
"""


def user_job(folder, job_text: str, file: str = "job.toml"):
    """Write the user's model module and ``job_text`` (a job naming it, relative to the job
    file) into ``folder`` (created), a folder tfsync has never seen; the job file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "blobs_model.py").write_text(MODULE)
    job = folder / file
    job.write_text(job_text)
    return job
