"""The user's own model, data, loss and optimizer named in a job file: resolved relative
to the job file, checked on one batch before any task starts, every mistake one line
naming the field."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import DATA, run_here
from tfsync.base.usercode import UserCodeError
from tfsync.job.config import load_job
from tfsync.job.errors import ConfigError

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "regression")
MODULE = os.path.join(EXAMPLE, "model.py")

JOB = """
[job]
name = "reg"
run_dir = "{run_dir}"
[model]
fn = "{model}"
{model_args}
[data]
fn = "{data}"
[train]
optimizer = "adam"
learning_rate = {{schedule = "ExponentialDecay", initial_learning_rate = 0.01, decay_steps = 20, decay_rate = 0.5}}
loss = "{loss}"
batch_size = 16
epochs = 2
{train_extra}
[[protocol]]
name = "bsp"
until = 0.5
[[protocol]]
name = "asp"
"""


def job_file(tmp_path, model="regression.py:build", data="regression.py:data", loss="mse", model_args="",
             train_extra=""):
    """A job file beside a copy of the user's module (names relative to the job file)."""
    folder = tmp_path / "project"
    folder.mkdir(exist_ok=True)
    (folder / "regression.py").write_text(open(MODULE).read())  # the example, copied
    path = folder / "job.toml"
    path.write_text(JOB.format(run_dir=tmp_path / "run", model=model, data=data, loss=loss,
                               model_args=model_args, train_extra=train_extra))
    return path


def workload(path):
    from tfsync.engine.workload import Workload
    return Workload.from_config(load_job(path))


@pytest.mark.unit
def test_file_references_resolve_against_the_job_file_from_any_directory(tmp_path, monkeypatch):
    path = job_file(tmp_path)
    monkeypatch.chdir("/")
    cfg = load_job(path)
    assert cfg.model.fn == f"{tmp_path / 'project' / 'regression.py'}:build"
    work = workload(path)
    assert work.y_train.dtype == np.float32 and work.x_train.shape == (448, 20)
    assert json.loads(json.dumps(cfg.to_dict()))["model"] == {"fn": cfg.model.fn}  # no bundled name beside it


@pytest.mark.unit
@pytest.mark.parametrize("kw, field, words", [
    ({"model": "no_such_module_xyz:build"}, "model.fn", "module 'no_such_module_xyz' not found"),
    ({"model": "regression.py:nope"}, "model.fn", "has no attribute 'nope'"),
    ({"model": "regression.py:NOT_A_FUNCTION"}, "model.fn", "is a int, not a function"),
    ({"model": "missing.py:build"}, "model.fn", "does not exist"),
    ({"model": "regression.py:not_a_model"}, "model.fn", "returned a dict, expected a tf_keras Model"),
    ({"data": "regression.py:a_list"}, "data.fn", "returned a list"),
    ({"model_args": "args = {features = 5}"}, "model.fn", "does not take the data's x_train (examples of shape (20,)"),
    ({"data": "regression.py:not_a_dataset"}, "data.fn", "the DatasetFactory's dataset: returned a list"),
    ({"data": "regression.py:not_pairs"}, "data.fn", "expected (features, label) pairs"),
    ({"loss": "NoSuchLoss"}, "train.loss", "is not a tf_keras.losses class"),
    ({"model_args": "args = {units = -1}"}, "model.fn", "raised ValueError"),
])
def test_each_mistake_in_user_code_is_one_line_naming_the_field(tmp_path, kw, field, words):
    with pytest.raises(UserCodeError) as e:
        workload(job_file(tmp_path, **kw))
    assert e.value.field == field and words in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.unit
@pytest.mark.parametrize("kw, field", [
    ({"loss": "mse\"\nmomentum = 0.5\n#"}, "train.momentum"),     # momentum is sgd's
    ({"train_extra": "loss_args = {reduction = \"sum\"}"}, None),  # checked when built
])
def test_job_file_rules_between_fields(tmp_path, kw, field):
    if field is None:
        with pytest.raises(UserCodeError, match="reduction is tfsync's to set"):
            workload(job_file(tmp_path, **kw))
        return
    with pytest.raises(ConfigError) as e:
        load_job(job_file(tmp_path, **kw))
    assert e.value.field == field


@pytest.mark.unit
def test_a_user_model_needs_a_loss_and_both_name_and_fn_are_refused(tmp_path):
    path = job_file(tmp_path)
    text = path.read_text()
    path.write_text(text.replace('loss = "mse"\n', ""))
    with pytest.raises(ConfigError, match="train.loss: missing"):
        load_job(path)
    path.write_text(text.replace('[model]\n', '[model]\nname = "cnn"\n'))
    with pytest.raises(ConfigError, match="give model.fn or model.name, not both"):
        load_job(path)
    path.write_text(text.replace('schedule = "ExponentialDecay"', 'schedule = "Wobbly"'))
    with pytest.raises(ConfigError, match="train.learning_rate.schedule"):
        load_job(path)


@pytest.mark.unit
def test_the_command_line_says_it_in_one_line_and_exits_2(tmp_path, capsys, monkeypatch):
    path = job_file(tmp_path, model="regression.py:nope")
    monkeypatch.chdir("/")
    r = run_here(capsys, "run", str(path), "--no-manager")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == f"tfsync: error: {path}: model.fn: regression.py has no attribute 'nope'" \
        .replace("regression.py", str(tmp_path / "project" / "regression.py"))


@pytest.mark.cluster
def test_the_regression_example_trains_through_tfsync_run(tmp_path):
    """examples/regression: a model outside the package, named by file path, float targets,
    Adam and a decaying schedule through BSP -> ASP on real task processes; each push
    records schedule(update) x the configuration factor (2 workers: 2x in BSP)."""
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", os.path.join(EXAMPLE, "job.toml"), "--json",
                        "--no-manager", "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    # it learned: predicting 0 everywhere has a test loss near 1.9
    assert summary["test_accuracy"] is None and 0 < summary["test_loss"] < 0.3
    assert summary["samples"] >= 4 * 448
    import tf_keras as keras
    sched = keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=100, decay_rate=0.5)
    recs = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    pushes = [x for x in recs if "worker" in x]
    for p in pushes:
        scale = 2.0 if p["protocol"] == "bsp" else 1.0
        if p["mode"] == "aggregate":  # the update it joins is the next one
            assert p["lr"] == pytest.approx(scale * float(sched(p["updates"])), rel=1e-5)
    assert {p["protocol"] for p in pushes} == {"bsp", "asp"}


@pytest.mark.cluster
def test_the_tfrecord_example_trains_from_a_dataset_factory_read_on_the_workers(tmp_path):
    """examples/tfrecord: the data function returns a DatasetFactory over TFRecord shards,
    each worker reading its own share of them; the job trains and evaluates, and tfsync
    wrote no copy of the training set into the run directory (the workers read it). Run
    from Python, ``tfsync.run`` with overrides as ``--set`` takes them."""
    project = tmp_path / "project"
    shutil.copytree(os.path.join(os.path.dirname(EXAMPLE), "tfrecord"), project,
                    ignore=shutil.ignore_patterns("shards", "__pycache__"))
    code = "import json, sys, tfsync; print(json.dumps(tfsync.run(sys.argv[1], sys.argv[2:], progress=False)))"
    r = subprocess.run([sys.executable, "-c", code, str(project / "job.toml"), f'data.args.npz="{DATA}"',
                        f'job.run_dir="{tmp_path / "run"}"'], capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, "\n".join(x for x in r.stderr.splitlines() if "E0000" not in x)[-3000:]
    summary = json.loads(r.stdout)
    assert summary["samples"] >= 6000 and summary["test_accuracy"] > 0.8
    assert len(list((project / "shards").glob("train-*.tfrecord"))) == 4
    assert not (tmp_path / "run" / "data").exists()


SCHEDULES = '''
import tf_keras as keras


class Warmup(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, peak, steps):
        self.peak, self.steps = peak, steps

    def __call__(self, step):
        import tensorflow as tf
        return self.peak * tf.minimum(1.0, tf.cast(step + 1, tf.float32) / self.steps)

    def get_config(self):
        return {"peak": self.peak, "steps": self.steps}


def warmup(peak=0.1, steps=10):
    return Warmup(peak, steps)


def half():
    return 0.5


def plain(step):
    return 0.1
'''


@pytest.mark.unit
def test_a_learning_rate_schedule_of_the_users_own_from_a_job_file(tmp_path, monkeypatch):
    """train.learning_rate = "file.py:function" or {schedule = "file.py:function", options}:
    resolved against the job file, called, and used by the optimizer; what is not a number
    or a LearningRateSchedule is one line naming the field."""
    from tfsync.engine.tfcompat import lr_schedule
    from tfsync.engine.workload import build_optimizer

    path = job_file(tmp_path)
    (path.parent / "schedules.py").write_text(SCHEDULES)
    text = path.read_text()
    old = 'learning_rate = {schedule = "ExponentialDecay", initial_learning_rate = 0.01, decay_steps = 20, decay_rate = 0.5}'
    monkeypatch.chdir("/")
    path.write_text(text.replace(old, 'learning_rate = {schedule = "schedules.py:warmup", peak = 0.2, steps = 4}'))
    t = load_job(path).train
    assert t.learning_rate["schedule"] == str(path.parent / "schedules.py") + ":warmup"
    opt = build_optimizer(t.optimizer, t.learning_rate, t.base_momentum, t.optimizer_args)
    assert [round(float(lr_schedule(opt)(k)), 4) for k in (0, 1, 3, 9)] == [0.05, 0.1, 0.2, 0.2]
    path.write_text(text.replace(old, 'learning_rate = "schedules.py:half"'))
    t = load_job(path).train
    opt = build_optimizer(t.optimizer, t.learning_rate, t.base_momentum, {})
    assert lr_schedule(opt) is None and opt.learning_rate.numpy() == 0.5
    path.write_text(text.replace(old, 'learning_rate = "schedules.py:plain"'))
    t = load_job(path).train
    with pytest.raises(UserCodeError, match=r"train.learning_rate: .*plain\(\) raised TypeError"):
        build_optimizer(t.optimizer, t.learning_rate, t.base_momentum, {})
    (path.parent / "callables.py").write_text(SCHEDULES + "\n\ndef fn():\n    return plain\n")
    path.write_text(text.replace(old, 'learning_rate = "callables.py:fn"'))
    t = load_job(path).train
    with pytest.raises(UserCodeError, match="train.learning_rate: got function .*subclass LearningRateSchedule"):
        build_optimizer(t.optimizer, t.learning_rate, t.base_momentum, {})
    path.write_text(text.replace(old, 'learning_rate = "fast"'))
    with pytest.raises(ConfigError, match='train.learning_rate = "fast": must be a number > 0, a schedule table'):
        load_job(path)


def _short_named_job(tmp_path, model="", data="", train=""):
    path = tmp_path / "job.toml"
    path.write_text(f'[model]\n{model}\n[data]\n{data}\n[train]\n{train}\n')
    return path


@pytest.mark.unit
def test_short_names_are_the_bundled_functions_called_as_user_code(tmp_path):
    """model.name = "cnn" and data.name = "mnist" stand for tfsync.examples.images:cnn and
    :mnist, called on the path that data.fn and model.fn take: the same model and data as
    the references written out, and the job signature the search stores under is that of
    the short names, as before they were references."""
    from tfsync.job.config import JobConfig
    from tfsync.job.schema import DATASETS, MODELS
    from tfsync.examples import images
    from tfsync.switch.trials import config_signature

    short = load_job(_short_named_job(tmp_path, data=f'path = "{DATA}"'))
    assert short.model.function == ("model.name", "tfsync.examples.images:cnn") == ("model.name", MODELS["cnn"])
    assert short.data.function == ("data.name", "tfsync.examples.images:mnist") == ("data.name", DATASETS["mnist"])
    (tmp_path / "ref").mkdir()
    ref = load_job(_short_named_job(
        tmp_path / "ref", model='fn = "tfsync.examples.images:cnn"\nargs = {input_shape = [28, 28, 1], classes = 10}',
        data=f'fn = "tfsync.examples.images:mnist"\nargs = {{path = "{DATA}"}}',
        train='loss = "SparseCategoricalCrossentropy"\nloss_args = {from_logits = true}'))
    assert ref.model.function == ("model.fn", "tfsync.examples.images:cnn")
    a, b = workload(tmp_path / "job.toml"), workload(tmp_path / "ref" / "job.toml")
    assert a.source == b.source == DATA and a.model_field == "model.name" and b.model_field == "model.fn"
    assert all(np.array_equal(p, q) for p, q in zip((a.x_train, a.y_train, a.x_test, a.y_test),
                                                    (b.x_train, b.y_train, b.x_test, b.y_test)))
    want = images.cnn((28, 28, 1), 10, seed=0).get_weights()
    for work in (a, b):
        assert all(np.array_equal(p, q) for p, q in zip(work.model_fn().get_weights(), want))
    assert a.model_fn().name == "cnn" and a.y_train.dtype == np.int64
    # the signatures of the bundled jobs, as stored by searches before the short names were references
    assert config_signature(JobConfig().to_dict()) == "772726ade4a8af98"
    assert config_signature(load_job(os.path.join(EXAMPLE, "..", "..", "jobs", "mnist.toml")).to_dict()) \
        == "1435f408e18bb89a"


@pytest.mark.unit
def test_a_short_name_fails_as_a_reference_does_naming_its_field(tmp_path, monkeypatch):
    """A short name goes through the checks of a reference: an entry of MODELS whose module
    is missing, data that is not there, or data that a bundled classifier cannot take is
    one line naming model.name or data.name."""
    from tfsync.job import schema

    monkeypatch.setitem(schema.MODELS, "broken", "no_such_module_xyz:build")
    cases = [
        (dict(model='name = "broken"', data=f'path = "{DATA}"'), "model.name",
         "module 'no_such_module_xyz' not found"),
        (dict(data=f'path = "{tmp_path}/missing.npz"'), "data.name",
         f"tfsync.examples.images:mnist(path=...) raised DataError: {tmp_path}/missing.npz: no such file"),
        (dict(data=f'fn = "{MODULE}:data"'), "model.name",
         "cnn classifies: it needs integer class labels, got float32"),
        (dict(model='name = "mlp"', data=f'fn = "{TWO_HEADS}:data"'), "model.name",
         "mlp is built for one input array and class labels"),
    ]
    for kw, field, words in cases:
        with pytest.raises(UserCodeError) as e:
            workload(_short_named_job(tmp_path, **kw))
        assert e.value.field == field and words in str(e.value) and "\n" not in str(e.value), str(e.value)


TWO_HEADS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "two_heads.py")


@pytest.mark.unit
def test_several_inputs_and_outputs_from_a_data_function_are_checked_written_and_read_back(tmp_path, monkeypatch):
    """A data function returns a dict of labels (a regression and a classification head):
    the job checks it on one batch, holds out validation rows of every array, evaluates the
    loss (no argmax accuracy); the engine's records read back as the same structure, for
    features as a tuple of two inputs too; wrong structures are one line naming data.fn."""
    import tensorflow as tf

    from tfsync.engine.evaluator import scores
    from tfsync.engine.generation import TrainSetup, make_dataset_fn, write_records

    job = _short_named_job(tmp_path, model=f'fn = "{TWO_HEADS}:build"',
                           data=f'fn = "{TWO_HEADS}:data"\nvalidation = 0.25', train=f'loss = "{TWO_HEADS}:loss"')
    work = workload(job)
    assert set(work.y_train) == {"value", "kind"} and work.y_train["value"].dtype == np.float32
    assert len(work.x_train) == len(work.y_train["kind"]) == 48 and len(work.y_test["value"]) == 16
    s = scores(work.model_fn(), work.x_test, work.y_test, work.loss_fn)
    assert s["accuracy"] is None and s["loss"] > 0
    with pytest.raises(UserCodeError, match="train.loss: .*for several outputs name a loss of your own"):
        workload(_short_named_job(tmp_path, model=f'fn = "{TWO_HEADS}:build"', data=f'fn = "{TWO_HEADS}:data"',
                                  train='loss = "mse"'))
    for fn, words in (("uneven", "y_train has arrays of different lengths: y_train['value'] 63, y_train['kind'] 64"),
                      ("a_list_inside", "y_train['kind'] is a list, expected a NumPy array")):
        with pytest.raises(UserCodeError) as e:
            workload(_short_named_job(tmp_path, model=f'fn = "{TWO_HEADS}:build"', data=f'fn = "{TWO_HEADS}:{fn}"',
                                      train=f'loss = "{TWO_HEADS}:loss"'))
        assert e.value.field == "data.fn" and words in str(e.value), str(e.value)

    x = (work.x_train[:, :2], work.x_train[:, 2:])  # two inputs
    setup = TrainSetup(None, None, None, x, work.y_train, max_batch_size=8, shuffle=False)
    records = write_records(setup, str(tmp_path / "run"))
    assert sorted(os.path.basename(f) for f in records["files"]) == [
        "train_x_0.bin", "train_x_1.bin", "train_y_0.bin", "train_y_1.bin"]
    monkeypatch.chdir(tmp_path / "run")  # the tasks' working directory
    bx, by = next(iter(make_dataset_fn(setup, records, workers=1)()))
    assert isinstance(bx, tuple) and set(by) == {"value", "kind"} and by["kind"].dtype == tf.int64
    for got, want in zip(tf.nest.flatten((bx, by)), tf.nest.flatten((x, work.y_train))):
        np.testing.assert_array_equal(got.numpy(), want[:8])
