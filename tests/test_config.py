"""Tests of the job configuration (tfsync.job: config, schema, fields, rules, overrides): the job
file, defaults, round trips and one-line errors."""
import dataclasses
from pathlib import Path

import pytest

from tfsync import policy
from tfsync.job.config import JobConfig, load_job
from tfsync.job.errors import ConfigError
from tfsync.job.schema import ProtocolEntry
from tfsync.policy import catalogue

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[1] / "jobs" / "mnist.toml"


def _error(d, source="job.toml") -> ConfigError:
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict(d, source=source)
    assert "\n" not in str(e.value)
    return e.value


def test_defaults():
    c = JobConfig.from_dict({})
    assert c == JobConfig()
    assert (c.job.name, c.job.run_dir, c.job.seed) == ("job", "runs/job", 0)
    assert (c.cluster.workers, c.cluster.ps, c.cluster.host) == (2, 1, "127.0.0.1")
    assert (c.data.name, c.data.path, c.model.name) == ("mnist", None, "cnn")
    t = c.train
    assert (t.batch_size, t.learning_rate, t.base_momentum, t.optimizer) == (64, 0.01, 0.9, "sgd")
    assert t.momentum is None and (t.loss, t.optimizer_args, c.model.fn, c.data.fn) == (None, {}, None, None)
    assert (t.epochs, t.checkpoint_every, t.eval_every, t.timeout_s) == (1.0, 200, 0, 600.0)
    assert c.protocol == (ProtocolEntry("bsp", until=0.5), ProtocolEntry("asp", until=1.0))
    assert (c.switch.method, c.switch.lr, c.switch.batch, c.switch.momentum) == ("hot", "linear", "local", "keep")
    assert JobConfig.from_dict({"job": {"name": "abc"}}).job.run_dir == "runs/abc"


def test_example_job_file_loads_and_round_trips():
    c = load_job(EXAMPLE)
    assert c.job.name == "mnist" and c.job.run_dir == "runs/mnist"
    assert c.train.momentum == c.train.base_momentum == JobConfig().train.base_momentum  # written out: 0.9
    assert dataclasses.replace(c.train, momentum=None) == JobConfig().train and c.protocol == JobConfig().protocol
    assert JobConfig.from_dict(c.to_dict()) == c


def test_round_trip_with_every_option():
    d = {"job": {"name": "x", "run_dir": "/tmp/r", "seed": 7},
         "cluster": {"workers": 3, "ps": 2, "host": "10.0.0.1"},
         "data": {"name": "cifar10", "path": "/data/c.npz"}, "model": {"name": "mlp"},
         "train": {"batch_size": 32, "learning_rate": 1, "momentum": 0, "epochs": 2,
                   "checkpoint_every": 0, "eval_every": 50, "timeout_s": 30},
         "protocol": [{"name": "ssp", "until": 0.25},
                      {"name": "bsp", "until": 0.5, "batch_sizes": [8, 16, 32]},
                      {"name": "ssp", "staleness": 0}, ],
         "switch": {"method": "restart", "lr": "constant", "batch": "global", "momentum": "ramp_exp"}}
    c = JobConfig.from_dict(d)
    assert c.train.learning_rate == 1.0 and isinstance(c.train.epochs, float)
    assert [p.options().get("staleness") for p in c.protocol] == [3, None, 0]
    assert c.protocol[1].batch_sizes == (8, 16, 32) and c.protocol[2].until == 1.0
    assert JobConfig.from_dict(c.to_dict()) == c
    assert c.to_dict()["protocol"][1]["batch_sizes"] == [8, 16, 32]
    assert "path" not in JobConfig().to_dict()["data"]


def test_unknown_key():
    e = _error({"train": {"batchsize": 3}})
    assert e.field == "train.batchsize"
    assert str(e).startswith("job.toml: train.batchsize: unknown key (did you mean batch_size?)")
    assert _error({"protocol": [{"name": "bsp", "stale": 1}]}).field == "protocol[0].stale"


def test_unknown_section():
    e = _error({"trian": {}})
    assert e.field == "trian" and "unknown section [trian]" in str(e) and "[train]" in str(e)


def test_wrong_type():
    e = _error({"train": {"learning_rate": "0.1"}})
    assert str(e) == ('job.toml: train.learning_rate = "0.1": must be a number > 0, a schedule table '
                      '{schedule = "ExponentialDecay", ...} or a "module:function" reference returning a '
                      'tf_keras LearningRateSchedule (got string)')
    assert _error({"cluster": {"workers": True}}).field == "cluster.workers"
    assert _error({"train": {"batch_size": 64.0}}).field == "train.batch_size"
    assert _error({"train": 5}).field == "train"


def test_out_of_range():
    e = _error({"train": {"batch_size": -3}})
    assert str(e) == "job.toml: train.batch_size = -3: must be an integer >= 1"
    assert e.field == "train.batch_size"
    assert _error({"train": {"momentum": 1.0}}).field == "train.momentum"
    assert _error({"train": {"timeout_s": 0}}).field == "train.timeout_s"
    assert _error({"train": {"epochs": float("nan")}}).field == "train.epochs"
    assert _error({"cluster": {"ps": 0}}).field == "cluster.ps"
    assert _error({"job": {"name": "a/b"}}).field == "job.name"
    assert "train.checkpoint_every = -1" in str(_error({"train": {"checkpoint_every": -1}}))


def test_bad_choices():
    assert _error({"data": {"name": "imagenet"}}).field == "data.name"
    assert _error({"model": {"name": "resnet"}}).field == "model.name"
    assert _error({"train": {"optimizer": "adamx"}}).field == "train.optimizer"
    assert _error({"switch": {"method": "warm"}}).field == "switch.method"
    assert _error({"switch": {"momentum": "auto"}}).field == "switch.momentum"


def test_a_momentum_rule_with_a_straggler_policy_is_refused():
    protocols = [{"name": "bsp", "until": 0.5}, {"name": "asp"}]
    e = _error({"switch": {"stragglers": "greedy", "momentum": "zero"}, "protocol": protocols})
    assert e.field == "switch.momentum" and "keeps the base momentum" in str(e)
    JobConfig.from_dict({"switch": {"stragglers": "greedy", "momentum": "keep"}, "protocol": protocols})


def test_bad_protocol_name():
    e = _error({"protocol": [{"name": "bspx", "until": 0.5}, {"name": "asp"}]})
    assert e.field == "protocol[0].name"
    assert str(e) == ('job.toml: protocol[0].name = "bspx": must be one of '
                      '"bsp", "asp", "ssp", "pssp", "elastic_bsp", "rlp", "lbbsp", "fluentps", "auto"')


def test_protocol_registry_is_extensible():
    class DSPS(policy.SSP):
        name = "dsps"

    policy.register(DSPS)
    try:
        c = JobConfig.from_dict({"protocol": [{"name": "dsps", "staleness": 5}]})
        assert c.protocol == (ProtocolEntry("dsps", until=1.0, staleness=5),)
    finally:
        catalogue.unregister("dsps")
    assert _error({"protocol": [{"name": "dsps"}]}).field == "protocol[0].name"


def test_fluentps_and_elastic_bsp_options():
    c = JobConfig.from_dict({"protocol": [
        {"name": "pssp", "until": 0.3, "probability": "dynamic", "execution": "soft"},
        {"name": "elastic_bsp", "lookahead": 30}]})
    assert c.protocol[0].options() == {**catalogue.spec("pssp").defaults(), "probability": "dynamic",
                                       "execution": "soft"}
    assert c.protocol[0].options()["staleness"] == 3
    assert c.protocol[1].options() == {**catalogue.spec("elastic_bsp").defaults(), "lookahead": 30}
    assert _error({"protocol": [{"name": "pssp", "probability": 1.5}]}).field == "protocol[0].probability"
    assert _error({"protocol": [{"name": "pssp", "probability": "often"}]}).field == "protocol[0].probability"
    assert _error({"protocol": [{"name": "pssp", "execution": "eager"}]}).field == "protocol[0].execution"
    e = _error({"protocol": [{"name": "ssp", "lookahead": 4}]})
    assert e.field == "protocol[0].lookahead" and '"elastic_bsp"' in str(e)


def test_lbbsp_options():
    c = JobConfig.from_dict({"protocol": [{"name": "lbbsp", "predictor": "arima", "blocking": False}]})
    assert c.protocol[0].options() == {**catalogue.spec("lbbsp").defaults(), "predictor": "arima",
                                       "blocking": False}
    e = _error({"protocol": [{"name": "lbbsp", "predictor": "oracle"}]})
    assert e.field == "protocol[0].predictor" and '"narx"' in str(e)
    assert _error({"protocol": [{"name": "lbbsp", "blocking": "yes"}]}).field == "protocol[0].blocking"
    assert _error({"protocol": [{"name": "bsp", "predictor": "ema"}]}).field == "protocol[0].predictor"


def test_non_increasing_until():
    e = _error({"protocol": [{"name": "bsp", "until": 0.5}, {"name": "ssp", "until": 0.5},
                             {"name": "asp"}]})
    assert e.field == "protocol[1].until" and "strictly increase" in str(e)
    assert "protocol[1].until = 0.5" in str(e)


def test_until_rules():
    assert _error({"protocol": [{"name": "bsp"}, {"name": "asp"}]}).field == "protocol[0].until"
    assert _error({"protocol": [{"name": "bsp", "until": 1.0},
                                {"name": "asp"}]}).field == "protocol[0].until"
    assert _error({"protocol": [{"name": "bsp", "until": 0.5}]}).field == "protocol[0].until"
    assert _error({"protocol": [{"name": "bsp", "until": 0}, {"name": "asp"}]}).field \
        == "protocol[0].until"
    assert _error({"protocol": [{"name": "asp", "until": 1.5}]}).field == "protocol[0].until"
    assert _error({"protocol": []}).field == "protocol"
    assert _error({"protocol": {"name": "bsp"}}).field == "protocol"
    assert _error({"protocol": [{"until": 1.0}]}).field == "protocol[0].name"


def test_staleness_only_for_ssp():
    e = _error({"protocol": [{"name": "asp", "staleness": 2}]})
    assert e.field == "protocol[0].staleness" and '"ssp", "pssp"' in str(e)
    assert _error({"protocol": [{"name": "ssp", "staleness": -1}]}).field == \
        "protocol[0].staleness"


def test_wrong_batch_sizes_length():
    e = _error({"cluster": {"workers": 2},
                "protocol": [{"name": "bsp", "until": 0.5, "batch_sizes": [32, 32, 32]},
                             {"name": "asp"}]})
    assert e.field == "protocol[0].batch_sizes"
    assert "[32, 32, 32]" in str(e) and "cluster.workers = 2" in str(e)
    assert _error({"protocol": [{"name": "asp", "batch_sizes": [32, 0]}]}).field == \
        "protocol[0].batch_sizes"


def test_direct_construction_is_validated():
    c = JobConfig()
    with pytest.raises(ConfigError, match=r"^train.batch_size = 0: must be an integer >= 1$"):
        dataclasses.replace(c, train=dataclasses.replace(c.train, batch_size=0))
    with pytest.raises(ConfigError, match="protocol"):
        JobConfig(protocol=(ProtocolEntry("bsp"), ProtocolEntry("asp")))


def test_load_job_file_errors(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=f"^{missing}: no such job file"):
        load_job(missing)
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nbatch_size = 64\nlearning_rate = \n")
    with pytest.raises(ConfigError, match=r"bad.toml: TOML syntax error: .*line 3"):
        load_job(bad)
    val = tmp_path / "val.toml"
    val.write_text("[train]\nbatch_size = -3\n")
    with pytest.raises(ConfigError) as e:
        load_job(val)
    assert str(e.value) == f"{val}: train.batch_size = -3: must be an integer >= 1"


# ---- --set KEY=VALUE: load_job(path, overrides) ----

def _user_job(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[model]\nfn = "m.py:build"\nargs = {units = 4, act = "relu"}\n\n'
                   '[train]\nloss = "MeanSquaredError"\nepochs = 1.0\n\n'
                   '[[protocol]]\nname = "bsp"\nuntil = 0.5\n\n[[protocol]]\nname = "ssp"\nstaleness = 3\n')
    return job


def test_set_overrides_nested_values_and_the_signature(tmp_path, monkeypatch):
    from tfsync.switch.trials import config_signature
    job = _user_job(tmp_path)
    before = job.read_text()
    base = load_job(job)
    c = load_job(job, overrides=["train.epochs=2", "model.args.units=8", "model.args.layers=[16, 8]",
                                 "cluster.workers=4", "data.validation=0.1", 'job.name="exp-1"', "switch.lr=constant"])
    assert c.train.epochs == 2.0 and c.cluster.workers == 4 and c.data.validation == 0.1
    assert c.model.args == {"units": 8, "act": "relu", "layers": [16, 8]}  # the rest of the table kept
    assert (c.job.name, c.job.run_dir, c.switch.lr) == ("exp-1", "runs/exp-1", "constant")  # bare word: a string
    assert job.read_text() == before and load_job(job) == base  # the file is not touched
    assert load_job(job, overrides=["model.args={units = 2}"]).model.args == {"units": 2}  # a whole table
    # what a run records (and the recurring-job signature) is the overridden job
    assert c.to_dict()["train"]["epochs"] == 2.0
    assert config_signature(load_job(job, overrides=["train.epochs=2"]).to_dict()) != config_signature(base.to_dict())
    assert config_signature(load_job(job, overrides=["train.epochs=1.0"]).to_dict()) == config_signature(base.to_dict())
    # later --set wins; file references in a --set are relative to the working directory
    assert load_job(job, overrides=["train.epochs=2", "train.epochs=3"]).train.epochs == 3.0
    assert c.model.fn == f"{tmp_path}/m.py:build"
    (tmp_path / "w").mkdir()
    monkeypatch.chdir(tmp_path / "w")
    assert load_job(job, overrides=["model.fn=n.py:make"]).model.fn == f"{Path.cwd()}/n.py:make"
    assert load_job(job, overrides=["train.epochs=2"]).model.fn == f"{tmp_path}/m.py:build"  # the file's: its dir


def test_set_indexes_arrays_of_tables(tmp_path):
    job = _user_job(tmp_path)
    c = load_job(job, overrides=["protocol.0.until=0.3", "protocol.1.staleness=5"])
    assert (c.protocol[0].name, c.protocol[0].until) == ("bsp", 0.3)
    assert c.protocol[1].settings["staleness"] == 5
    c = load_job(job, overrides=['protocol.1={name = "asp"}'])
    assert [p.name for p in c.protocol] == ["bsp", "asp"]
    c = load_job(EXAMPLE, overrides=['protocol=[{name = "ssp", staleness = 2}]'])
    assert [(p.name, p.settings["staleness"]) for p in c.protocol] == [("ssp", 2)]


@pytest.mark.parametrize("given, field", [
    ("train.epochs=abc", "train.epochs"),
    ("cluster.workers=0", "cluster.workers"),
    ("protocol.0.until=2", "protocol[0].until"),
    ("protocol.1.staleness=-1", "protocol[1].staleness"),
    ("train.batchsize=3", "train.batchsize"),
    ("model.args.units=[1, {a = [[[[1]]]]}]", None),  # fine: nested, but not too deep
])
def test_set_bad_value_is_the_files_one_line_error(tmp_path, given, field):
    job = _user_job(tmp_path)
    if field is None:
        load_job(job, overrides=[given])
        return
    with pytest.raises(ConfigError) as e:
        load_job(job, overrides=[given])
    msg = str(e.value)
    assert e.value.field == field and "\n" not in msg, msg
    assert msg.startswith(f"{job}: {field}") and msg.endswith(f"(given by --set {given.split('=')[0]})"), msg


@pytest.mark.parametrize("given, why", [
    ("train.epochs", "expected KEY=VALUE"),
    ("=2", "empty KEY"),
    ("  =2", "empty KEY"),
    ("train..epochs=2", "KEY must be"),
    ("train.epochs.x=2", "train.epochs is a float, not a table"),
    ("model.fn.x=2", "model.fn is a string, not a table"),
    ("train.0=2", "train is a table, not an array"),
    ("train.epochs.0=2", "train.epochs is a float, not an array"),
    ("protocol.2.until=0.9", "protocol has 2 entries (0 .. 1); no entry 2"),
    ("inject.0.worker=1", "inject is not in the job file"),
    ("0=1", "KEY starts with an index"),
    ("job.name=[1, 2", "VALUE is not a TOML value"),
    ('job.name="x', "VALUE is not a TOML value"),
    ("job.name=1\nx = 2", "VALUE spans lines"),
])
def test_malformed_set_is_one_line_naming_it(tmp_path, given, why):
    with pytest.raises(ConfigError) as e:
        load_job(_user_job(tmp_path), overrides=["train.batch_size=32", given])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--set ") and why in msg, msg
    assert given.split("=")[0].split("\n")[0].strip()[:5] in msg


def test_set_values_are_toml_and_bare_words_are_strings():
    from tfsync.job.overrides import parse_override
    values = {"2": 2, "0.5": 0.5, "true": True, '"text"': "text", "'lit'": "lit", "[1, 2]": [1, 2],
              "{a = 1}": {"a": 1}, "adam": "adam", "runs/x-1": "runs/x-1", "m.py:f": "m.py:f", " 3 ": 3, "": ""}
    for text, value in values.items():
        o = parse_override(f"k={text}")
        assert o.value == value and type(o.value) is type(value), text
    o = parse_override('model.args."a.b".0 = 1')
    assert o.path == ("model", "args", "a.b", 0) and o.field == "model.args.a.b[0]" and o.value == 1
