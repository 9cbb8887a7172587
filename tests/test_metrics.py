"""Evaluation metrics and validation data: ``train.metrics`` in job files (forms, one-line
errors, checked on one batch), ``data.validation`` (a held-out share of the training
arrays), and the evaluator's loss and metrics in summary.json, metrics.jsonl and
TensorBoard, equal to tf_keras's ``model.evaluate`` on the same weights."""

import json
import logging
import subprocess
import sys
import types

import numpy as np
import pytest

from helpers import run_here
from tfsync.base import usercode
from tfsync.base.usercode import UserCodeError
from tfsync.job.config import JobConfig, load_job
from tfsync.job.errors import ConfigError

MODULE = '''
import numpy as np
import tensorflow as tf
import tf_keras as keras

import tfsync


def data(n=512, features=20, test=False):
    """Float targets; with test=True the last 64 examples are test arrays."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = (x @ np.linspace(-1, 1, features).astype(np.float32) * 0.5 + 0.25).astype(np.float32)
    return (x[:-64], y[:-64], x[-64:], y[-64:]) if test else (x, y)


def factory(test=False):
    x, y = data(64)
    f = tfsync.DatasetFactory(lambda context: tf.data.Dataset.from_tensor_slices((x, y)), examples=64)
    return (f, x[:8], y[:8]) if test else f


def build(features=20, units=8):
    init = keras.initializers.GlorotUniform(seed=1)
    return keras.Sequential([keras.layers.Input((features,)),
                             keras.layers.Dense(units, activation="relu", kernel_initializer=init),
                             keras.layers.Dense(1, kernel_initializer=init)])


def within(y_true, y_pred, tol=0.5):
    """Per example: 1 where the prediction is within tol of the target."""
    return tf.cast(tf.abs(y_true - y_pred) < tol, tf.float32)


def needs_class_ids(y_true, y_pred):
    return tf.reduce_sum(tf.one_hot(y_true, 3) * y_pred, -1)
'''

JOB = """
[job]
name = "metrics"
run_dir = "{run_dir}"
[cluster]
workers = 2
[model]
fn = "reg.py:build"
[data]
fn = "reg.py:{data}"
{data_extra}
[train]
loss = "mse"
optimizer = "adam"
learning_rate = 0.01
batch_size = 16
epochs = 2
eval_every = 8
{train_extra}
[[protocol]]
name = "bsp"
"""


def job_file(tmp_path, data="data", data_extra="", train_extra=""):
    folder = tmp_path / "project"
    folder.mkdir(exist_ok=True)
    (folder / "reg.py").write_text(MODULE)
    path = folder / "job.toml"
    path.write_text(JOB.format(run_dir=tmp_path / "run", data=data, data_extra=data_extra, train_extra=train_extra))
    return path


def workload(path):
    from tfsync.engine.workload import Workload
    return Workload.from_config(load_job(path))


def _config_error(d) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict(d, source="job.toml")
    assert "\n" not in str(e.value)
    return e.value


# ---- the job file -------------------------------------------------------------------------

@pytest.mark.unit
def test_metric_forms_load_round_trip_and_stay_out_of_jobs_without_them(tmp_path, monkeypatch):
    forms = ["accuracy", "mae", "AUC", {"metric": "SparseTopKCategoricalAccuracy", "k": 5, "name": "top5"},
             "mypkg.metrics:f1"]
    c = JobConfig.from_dict({"train": {"metrics": forms}, "data": {"validation": 0.1}})
    assert c.train.metrics == tuple(forms) and c.data.validation == 0.1
    assert c.to_dict()["train"]["metrics"] == forms and JobConfig.from_dict(c.to_dict()) == c
    d = JobConfig().to_dict()  # unset: not in the dict (nor in a job's search signature)
    assert "metrics" not in d["train"] and "validation" not in d["data"]
    assert JobConfig.from_dict({"train": {"metrics": []}}).train.metrics is None
    path = job_file(tmp_path, train_extra='metrics = ["reg.py:within", {metric = "reg.py:within", tol = 1.0, '
                                          'name = "within1"}]')
    monkeypatch.chdir("/")  # file references resolve against the job file
    ref = f"{tmp_path / 'project' / 'reg.py'}:within"
    assert load_job(path).train.metrics == (ref, {"metric": ref, "tol": 1.0, "name": "within1"})


@pytest.mark.unit
@pytest.mark.parametrize("train, field, words", [
    ({"metrics": "mae"}, "train.metrics", "must be an array, each entry a tf_keras metric name"),
    ({"metrics": ["mae", 3]}, "train.metrics[1]", "(got integer)"),
    ({"metrics": ["top 5"]}, "train.metrics[0]", 'must be a tf_keras metric name ("accuracy", "mae", "AUC"), a '
                                                  '"module:function" reference, or a table'),
    ({"metrics": [{"metric": "x.py\n:f"}]}, "train.metrics[0].metric", "no control characters"),
    ({"metrics": [{"k": 5}]}, "train.metrics[0].metric", "missing; a table names its metric"),
    ({"metrics": [{"metric": "AUC", "name": "a b"}]}, "train.metrics[0].name", "letters, digits and '_'"),
    ({"metrics": ["mae", "mae"]}, "train.metrics[1]", "listed once (train.metrics[0] is the same)"),
    ({"metrics": [{"metric": "AUC", "name": "loss"}]}, "train.metrics[0].name", "test_loss is the loss"),
    ({"metrics": ["AUC", {"metric": "AUC"}]}, "train.metrics[1].metric", "give one a name"),
])
def test_each_bad_metric_entry_is_one_line_naming_it(train, field, words):
    e = _config_error({"train": train})
    assert e.field == field and str(e).startswith(f"job.toml: {field}") and words in str(e), str(e)


@pytest.mark.unit
@pytest.mark.parametrize("v", [0, 1, 1.5, -0.1, "0.1", True])
def test_validation_is_a_fraction_between_0_and_1(v):
    e = _config_error({"data": {"validation": v}})
    assert e.field == "data.validation" and "must be a number > 0 and < 1" in str(e)


# ---- resolving and computing metrics -------------------------------------------------------

@pytest.mark.unit
def test_names_are_keras_names_and_mistakes_are_one_line():
    import tf_keras as keras

    from tfsync.job.metrics import resolve

    def r2(y_true, y_pred):
        return y_pred

    specs = resolve(["accuracy", "mae", "AUC", "RootMeanSquaredError",
                     {"metric": "SparseTopKCategoricalAccuracy", "k": 5, "name": "top5"},
                     {"metric": "top_k_categorical_accuracy", "k": 2, "name": "top2"},
                     keras.metrics.Precision(name="prec"), keras.metrics.Recall, r2])
    assert [s.name for s in specs] == ["accuracy", "mae", "auc", "root_mean_squared_error", "top5", "top2",
                                       "prec", "recall", "r2"]
    assert [s.name for s in resolve(["AUC"])] == ["auc"]  # never Keras's counted "auc_1"
    assert resolve(None) is None
    for items, field, words in [
        (["nope"], "train.metrics[0]", "'nope' is not a tf_keras metric"),
        (["Mean"], "train.metrics[0]", "is not a tf_keras metric"),  # a mean of values, not of (y, out)
        ([{"metric": "MeanIoU"}], "train.metrics[0]", "MeanIoU() raised TypeError"),
        ([{"metric": "AUC", "name": "auc"}, "AUC"], "train.metrics[1]", "two metrics named 'auc'"),
        ([{"metric": "mae", "name": "loss"}], "train.metrics[0]", "test_loss is the loss"),
        ([{"metric": "accuracy", "k": 2}], "train.metrics[0]", "takes no options"),
        ([lambda y, p: p], "train.metrics[0]", "has no name"),
        ([3], "train.metrics[0]", "a int; expected a metric name"),
        (["no_such_module_xyz:f"], "train.metrics[0]", "module 'no_such_module_xyz' not found"),
    ]:
        with pytest.raises(UserCodeError) as e:
            resolve(items)
        assert e.value.field == field and words in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.unit
def test_train_setup_takes_metric_objects_and_functions(tiny_problem):
    import tf_keras as keras

    from tfsync.engine.generation import TrainSetup

    x, y, model_fn, optimizer_fn, loss_fn = tiny_problem

    def hits(y_true, y_pred):
        return keras.metrics.sparse_categorical_accuracy(y_true, y_pred)

    setup = TrainSetup(model_fn, optimizer_fn, loss_fn, x, y, max_batch_size=8,
                       metrics=[keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2"), hits, "mae"])
    assert [m.name for m in setup.metrics] == ["top2", "hits", "mae"]
    assert TrainSetup(model_fn, optimizer_fn, loss_fn, x, y, max_batch_size=8).metrics is None
    with pytest.raises(UserCodeError, match=r"^metrics\[2\]: two metrics named 'top2'"):
        TrainSetup(model_fn, optimizer_fn, loss_fn, x, y, max_batch_size=8,
                   metrics=["accuracy", {"metric": "SparseTopKCategoricalAccuracy", "k": 2, "name": "top2"},
                            keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")])


def _classifier():
    import tf_keras as keras
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4)).astype("float32")
    y = rng.integers(0, 5, 300)
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(5, activation="softmax")])
    return model, x, y


@pytest.mark.unit
def test_scores_equal_model_evaluate_for_a_classifier_and_a_regression():
    import tf_keras as keras

    from tfsync.engine.evaluator import scores
    from tfsync.job.metrics import resolve
    from tfsync.engine.workload import as_in_fit

    model, x, y = _classifier()
    specs = resolve(["accuracy", {"metric": "SparseTopKCategoricalAccuracy", "k": 2, "name": "top2"}])
    got = scores(model, x, y, keras.losses.SparseCategoricalCrossentropy(reduction="none"), specs, chunk=64)
    model.compile(loss="sparse_categorical_crossentropy",
                  metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")])
    want = model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    assert set(got["metrics"]) == {"accuracy", "top2"}
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert got["metrics"]["top2"] == pytest.approx(want["top2"]) and got["accuracy"] == pytest.approx(want["accuracy"])
    assert 0.3 < got["metrics"]["top2"] < 0.6  # a random 5-class model: about 2 in 5
    default = scores(model, x, y, None, None)  # no metrics named: argmax accuracy, as before
    assert default == {"loss": None, "accuracy": pytest.approx(want["accuracy"]), "metrics": {}}

    rng = np.random.default_rng(1)
    xr = rng.normal(size=(200, 4)).astype("float32")
    yr = (xr @ np.array([1, -1, 0.5, 0], "float32")).astype("float32")  # (N,) against (N, 1) outputs
    reg = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
    specs = resolve(["mae", "mse", {"metric": "RootMeanSquaredError", "name": "rmse"}])
    got = scores(reg, xr, yr, as_in_fit(keras.losses.MeanSquaredError(reduction="none")), specs, chunk=64)
    reg.compile(loss="mse", metrics=["mae", "mse", keras.metrics.RootMeanSquaredError(name="rmse")])
    want = reg.evaluate(xr, yr, batch_size=64, verbose=0, return_dict=True)
    assert got["accuracy"] is None and got["metrics"]["mae"] > 0.1
    for k in ("mae", "mse", "rmse"):
        assert got["metrics"][k] == pytest.approx(want[k], rel=1e-5), k
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)


@pytest.mark.unit
def test_the_background_evaluator_reports_loss_and_metrics_and_the_recorder_writes_them(tmp_path):
    import tensorflow as tf
    import tf_keras as keras

    from tfsync.engine.evaluator import Evaluator
    from tfsync.engine.records import RunRecorder
    from tfsync.job.metrics import resolve

    model, x, y = _classifier()
    ev = Evaluator(lambda: keras.models.clone_model(model), x, y, every=1, samples=100,
                   loss_fn=keras.losses.SparseCategoricalCrossentropy(reduction="none"),
                   metrics=resolve(["accuracy", {"metric": "SparseTopKCategoricalAccuracy", "k": 2, "name": "top2"}]))
    assert ev.request(types.SimpleNamespace(model=model), 7, 3, 96, 1.5)
    ev.wait()
    (e,) = ev.drain()
    assert e.pushes == 7 and e.loss > 0 and set(e.metrics) == {"accuracy", "top2"}
    assert e.accuracy == e.metrics["accuracy"] and e.metrics["top2"] >= e.accuracy
    record = e.to_dict()
    assert record["loss"] == e.loss and record["metrics"] == e.metrics

    rec = RunRecorder(str(tmp_path))
    rec.evaluation(record, e.pushes)
    rec.close()
    (line,) = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    assert line["event"] == "eval" and line["metrics"] == e.metrics and line["loss"] == e.loss
    tags = {}
    for f in (tmp_path / "tb").iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(f)):
            for v in event.summary.value:
                tags[v.tag] = (event.step, v.simple_value)
    assert set(tags) == {"test/loss", "test/accuracy", "test/top2"}
    assert tags["test/top2"] == (7, pytest.approx(e.metrics["top2"]))


# ---- the workload: validation data, metrics on one batch -----------------------------------

@pytest.mark.unit
def test_validation_holds_out_a_fixed_share_of_the_training_arrays(tmp_path):
    from tfsync.engine.workload import hold_out

    work = workload(job_file(tmp_path, data_extra="validation = 0.125"))
    x, y = work.x_train, work.y_train
    assert (len(y), len(work.y_test)) == (448, 64) and "validation: 64 of the 512" in work.eval_data
    full = np.concatenate([x, work.x_test])
    assert len(np.unique(full, axis=0)) == 512  # disjoint, nothing lost
    held = hold_out(512, 0.125)
    assert held.tolist() == hold_out(512, 0.125).tolist() and held.max() > 448 > held.min()  # fixed, not the tail
    assert np.array_equal(work.x_test, workload(job_file(tmp_path, data_extra="validation = 0.125")).x_test)
    none = workload(job_file(tmp_path))
    assert none.x_test is None and len(none.y_train) == 512 and none.eval_data.startswith("none")


@pytest.mark.unit
def test_test_arrays_are_the_validation_data_and_a_factory_needs_them(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="tfsync.engine.workload"):
        work = workload(job_file(tmp_path, data_extra="args = {test = true}\nvalidation = 0.5"))
    assert len(work.y_train) == 448 and len(work.y_test) == 64 and work.eval_data == "test arrays (64 examples)"
    assert "data.validation = 0.5 not used: the data gives test arrays" in caplog.text
    with pytest.raises(UserCodeError) as e:
        workload(job_file(tmp_path, data="factory", data_extra="validation = 0.1"))
    assert e.value.field == "data.validation" and "\n" not in str(e.value)
    assert "cannot hold out from a tfsync.DatasetFactory; return (factory, x_test, y_test)" in str(e.value)
    work = workload(job_file(tmp_path, data="factory", data_extra="args = {test = true}\nvalidation = 0.1"))
    assert len(work.y_test) == 8
    with pytest.raises(UserCodeError, match=r"data.validation: 0.0005 of 512 training examples holds out 0"):
        workload(job_file(tmp_path, data_extra="validation = 0.0005"))


@pytest.mark.unit
@pytest.mark.parametrize("metrics, field, words", [
    ('["mae", "nope"]', "train.metrics[1]", "'nope' is not a tf_keras metric"),
    ('["reg.py:no_such"]', "train.metrics[0]", "has no attribute 'no_such'"),
    ('["mae", "reg.py:needs_class_ids"]', "train.metrics[1]", "needs_class_ids does not take the labels (shape (), "
                                                             "float32) with the model's output (shape (2, 1))"),
])
def test_a_metric_that_cannot_take_the_labels_is_refused_on_one_batch(tmp_path, metrics, field, words):
    with pytest.raises(UserCodeError) as e:
        workload(job_file(tmp_path, train_extra=f"metrics = {metrics}"))
    assert e.value.field == field and words in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.unit
def test_the_command_line_refuses_a_bad_metric_in_one_line_with_exit_2(tmp_path, capsys, monkeypatch):
    path = job_file(tmp_path, train_extra='metrics = ["mae", {metric = "SparseTopKCategoricalAccuracy", k = 2}, '
                                          '"Nope"]')
    monkeypatch.chdir("/")
    r = run_here(capsys, "run", str(path), "--no-manager")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (f"tfsync: error: {path}: train.metrics[2]: 'Nope' is not a "
                                                 'tf_keras metric; expected e.g. "accuracy", "mae", "AUC", '
                                                 '"SparseTopKCategoricalAccuracy" or "module:function"')


# ---- a real run -------------------------------------------------------------------------

@pytest.mark.cluster
def test_a_run_reports_each_metric_on_the_validation_data_as_model_evaluate_does(tmp_path):
    """Two workers train a regression with 1/8 of its arrays held out; summary.json, the
    eval events of metrics.jsonl and TensorBoard carry test_loss, test_mae and a metric of
    the user's own, equal to tf_keras's model.evaluate of the final checkpoint."""
    import tensorflow as tf
    import tf_keras as keras

    path = job_file(tmp_path, data_extra="validation = 0.125",
                    train_extra='metrics = ["mae", {metric = "reg.py:within", tol = 0.5}]')
    r = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", str(path), "--json", "--no-manager"],
                       capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout)
    assert s["test_accuracy"] is None and 0 < s["test_loss"] < 0.5 and 0 < s["test_mae"] < 0.6
    assert 0.5 < s["test_within"] <= 1.0 and "validation: 64 of the 512" in s["meta"]["eval_data"]

    work = workload(path)  # the same held-out arrays, in this process
    model = work.model_fn()
    final = [c for c in s["checkpoints"] if c["why"] == "final"][-1]
    tf.train.Checkpoint(model=model).read(final["path"]).expect_partial()
    within = usercode.resolve(f"{tmp_path / 'project' / 'reg.py'}:within", "test")
    model.compile(loss="mse", metrics=["mae", keras.metrics.MeanMetricWrapper(within, name="within", tol=0.5)])
    want = model.evaluate(work.x_test, work.y_test, verbose=0, return_dict=True)
    for k in ("loss", "mae", "within"):
        assert s[f"test_{k}"] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k

    evals = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl") if '"eval"' in x]
    evals = [e for e in evals if e.get("event") == "eval"]
    assert len(evals) >= 2 and all(set(e["metrics"]) == {"mae", "within"} and e["loss"] > 0 for e in evals)
    assert evals[-1]["metrics"] == {"mae": s["test_mae"], "within": s["test_within"]}
    assert evals[-1]["loss"] == s["test_loss"] and s["evals"][-1]["metrics"] == evals[-1]["metrics"]
    tags = set()
    for f in (tmp_path / "run" / "tb").iterdir():
        tags |= {v.tag for e in tf.compat.v1.train.summary_iterator(str(f)) for v in e.summary.value}
    assert {"test/loss", "test/mae", "test/within"} <= tags
