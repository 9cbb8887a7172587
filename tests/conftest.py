"""Shared fixtures. Cluster tests start real TF task processes on free loopback ports;
the engine tears them down even when a test fails."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# `tfsync run` draws its report at the end (about 1.5 s of matplotlib a run, some 40 runs
# in the suite); tests/test_report.py turns it back on where the report is what it checks.
os.environ.setdefault("TFSYNC_NO_REPORT", "1")

import pytest  # noqa: E402

TIERS = ("unit", "cluster")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test is in one tier, unit or cluster (its module's pytestmark, or its own mark
    in a module of both): an unmarked test would be left out of `-m unit` and `-m cluster`
    runs alike. Checked on everything collected, before -m deselects."""
    wrong = [item.nodeid for item in items if sum(item.get_closest_marker(t) is not None for t in TIERS) != 1]
    if wrong:
        shown = ", ".join(wrong[:5]) + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")
        raise pytest.UsageError(f"{len(wrong)} tests are not marked exactly one of unit and cluster: {shown}; "
                                "give the module a pytestmark = pytest.mark.unit (or .cluster), or mark each test")


def pytest_sessionstart(session):
    """Byte-compile tfsync once (about 2 s): each of the suite's hundreds of `tfsync`
    processes would otherwise compile every module it imports, 0.5-1.5 s each, where
    PYTHONDONTWRITEBYTECODE is set (as on CI machines) or the checkout is fresh."""
    import compileall
    compileall.compile_dir(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tfsync"),
                           quiet=1)


def pytest_collection_finish(session):
    """What collecting imported (TensorFlow, tf_keras, every test module) lives as long as
    the session: Python's full collections skip it (gc.freeze), as `tfsync run` does; the
    engine makes one at each generation's close, some 150 in the suite."""
    import gc
    gc.freeze()


@pytest.fixture
def tiny_problem():
    """A 5-feature, 3-class linear problem small enough to replay exactly in one process."""
    import numpy as np
    import tf_keras as keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    y = rng.integers(0, 3, 64).astype(np.int64)

    def model_fn():
        return keras.Sequential([keras.layers.Input((5,)),
                                 keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(seed=1))])

    def optimizer_fn():
        return keras.optimizers.SGD(0.1, momentum=0.9)

    def loss_fn(labels, logits):
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)

    return x, y, model_fn, optimizer_fn, loss_fn


@pytest.fixture(scope="session", autouse=True)
def private_tfsync_home(tmp_path_factory):
    """Tests never read or write the user's job store (~/.tfsync): a stored switch point
    there would change what `tfsync run` trains."""
    old = os.environ.get("TFSYNC_HOME")
    os.environ["TFSYNC_HOME"] = str(tmp_path_factory.mktemp("tfsync_home"))
    yield
    if old is None:
        os.environ.pop("TFSYNC_HOME", None)
    else:
        os.environ["TFSYNC_HOME"] = old


@pytest.fixture(scope="session")
def main_job(tmp_path_factory):
    """One `tfsync run` of the short main job as a user runs it, shared by the tests of what
    it shows (tests/test_report.py) and of what it writes (tests/test_run_job.py): the
    linear model, BSP for half of its 2 epochs then ASP through a hot switch, the report
    on, the progress on stderr, under umask 022. Returns (stdout, stderr, run dir, the
    summary it wrote); tests that change its outputs work on a copy."""
    import json
    import subprocess
    import sys

    from helpers import DATA, linear_job

    tmp_path = tmp_path_factory.mktemp("main_job")
    run_dir, job = tmp_path / "run", tmp_path / "job.toml"
    job.write_text(linear_job("seen", {"name": "bsp", "until": 0.5}, "asp", epochs=2, eval_every=40,
                              checkpoint_every=60).format(run_dir=run_dir))
    env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"), TFSYNC_NO_REPORT="0")  # the report: on
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", str(job), "--data", DATA], env=env,
                       capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.umask(0o022))
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout, r.stderr, run_dir, json.loads((run_dir / "summary.json").read_text())
