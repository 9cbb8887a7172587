"""The protocol catalogue: a protocol added in one file is nameable in job files and by
`tfsync switch`, and what derives from the catalogue agrees with it."""

import argparse
import importlib
import sys
import textwrap
from types import SimpleNamespace

import pytest

from tfsync.cli import build_parser
from tfsync.cli.jobrun import max_batch
from tfsync.job.config import JobConfig, load_job
from tfsync.job.errors import ConfigError
from tfsync.policy import ASP, BSP, LBBSP, BatchSizer, FixedSizer, Option, Policy, catalogue, register
from tfsync.policy.rlp import teacher
from tfsync.rl.evaluate import STATIC
from tfsync.switch.configuration import ConfigPolicy
from tfsync.switch.online import GreedyStragglerPolicy
from tfsync.switch.stragglers import StragglerDetector

pytestmark = pytest.mark.unit

TOY = '''
"""A toy protocol: each push grants its worker `burst` more steps."""
from tfsync.policy import Decision, Option, Policy, register


class Toy(Policy):
    name = "toy"
    options = (Option("burst", int, lo=1, hi=8, help="steps granted per push"),)

    def __init__(self, burst: int = 1, sizer=None, seed=None):
        super().__init__(sizer, seed)
        self.burst = burst

    def on_push(self, push, view):
        return Decision(self.grants_for([push.worker] * self.burst, view))


register(Toy)
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy protocol, from a module of its own on sys.path."""
    (tmp_path / "toy_protocol.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("toy_protocol")
    yield module
    catalogue.unregister("toy")
    sys.modules.pop("toy_protocol", None)


def job_file(tmp_path, toy_phase: str):
    path = tmp_path / "toy.toml"
    path.write_text(textwrap.dedent('''
        [cluster]
        workers = 2

        [[protocol]]
        name = "bsp"
        until = 0.5

        [[protocol]]
        name = "toy"
    ''') + toy_phase)
    return path


def switch_choices() -> tuple:
    """The protocols `tfsync switch --help` lists for --to."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = next(a for a in sub.choices["switch"]._actions if "--to" in a.option_strings).help
    return tuple(text.removeprefix("the protocol: ").partition(" (")[0].split(", "))


def test_a_protocol_in_one_file_is_nameable_in_a_job_file(toy, tmp_path):
    cfg = load_job(job_file(tmp_path, "burst = 3\n"))
    assert [p.name for p in cfg.protocol] == ["bsp", "toy"]
    assert cfg.protocol[1].options() == {"burst": 3}
    assert JobConfig.from_dict(cfg.to_dict()) == cfg
    assert load_job(job_file(tmp_path, "")).protocol[1].options() == {"burst": 1}  # the constructor's default

    with pytest.raises(ConfigError) as e:
        load_job(job_file(tmp_path, "burst = 9\n"))
    path = tmp_path / "toy.toml"
    assert str(e.value) == f"{path}: protocol[1].burst = 9: must be an integer in [1, 8]"
    assert e.value.field == "protocol[1].burst"
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict({"protocol": [{"name": "asp", "burst": 2}]})
    assert e.value.field == "protocol[0].burst" and str(e.value).endswith('applies only to "toy"')


def test_build_phases_builds_the_new_protocol(toy, tmp_path):
    from tfsync.cli.jobrun import build_phases

    bsp, phase = build_phases(load_job(job_file(tmp_path, "burst = 3\n")), num_train=1000)
    assert isinstance(phase.policy, toy.Toy) and phase.policy.burst == 3
    assert phase.policy.sizer.batch_size == JobConfig().train.batch_size and phase.until == 1.0
    assert (bsp.lr_scale, phase.lr_scale) == (2.0, 1.0)  # toy is not aggregating: eta, not n * eta


def test_every_catalogue_name_is_a_job_file_and_switch_choice(toy):
    names = catalogue.names()
    assert "toy" in names and "fluentps" in names
    assert set(names) <= set(switch_choices())
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict({"protocol": [{"name": "nope"}]})
    assert str(e.value) == "protocol[0].name = \"nope\": must be one of " + ", ".join(f'"{n}"' for n in names)
    for name in names:
        required = {k: "x" for k, o in catalogue.spec(name).options.items() if o.required}
        assert JobConfig.from_dict({"protocol": [{"name": name, **required}]}).protocol[0].name == name


def test_straggler_policies_are_registered_but_not_nameable():
    assert {"sync_switch_greedy", "sync_switch_elastic"} <= set(catalogue.names(every=True))
    assert not {"sync_switch_greedy", "sync_switch_elastic"} & set(catalogue.names() + switch_choices())
    with pytest.raises(ConfigError, match="protocol.0..name"):
        JobConfig.from_dict({"protocol": [{"name": "sync_switch_greedy"}]})


def test_switch_options_travel_as_numbers_and_come_back_typed(toy):
    from tfsync.policy.checks import check_switch

    sent = catalogue.to_numbers({"staleness": 2, "probability": 1, "average": True})
    assert sent == {"staleness": 2.0, "probability": 1.0, "average": 1.0}
    back = catalogue.from_numbers("fluentps", {**sent, "lr_scale": 0.5})
    assert back == {"staleness": 2, "probability": 1.0, "average": True, "lr_scale": 0.5}
    assert [type(back[k]) for k in ("staleness", "probability", "average")] == [int, float, bool]
    assert catalogue.from_numbers("toy", catalogue.to_numbers({"burst": 4})) == {"burst": 4}
    with pytest.raises(ValueError, match="execution = 'soft': a switch carries numbers only"):
        catalogue.to_numbers({"execution": "soft"})
    with pytest.raises(ValueError, match="'bsp' has no option 'staleness'"):
        check_switch("bsp", {"staleness": 1})


def test_get_checks_declared_options_in_one_line(toy):
    assert catalogue.get("toy", burst=8).burst == 8
    with pytest.raises(ValueError) as e:
        catalogue.get({"name": "toy", "burst": 0})
    assert str(e.value) == "protocol 'toy': burst = 0: must be an integer in [1, 8]"
    with pytest.raises(ValueError, match=r"staleness = 'x': must be an integer >= 0 \(got str\)"):
        catalogue.get("ssp", staleness="x")


def test_register_refuses_options_the_class_does_not_take():
    class Bad(Policy):
        name = "bad"
        options = (Option("nope", int),)

    with pytest.raises(TypeError, match="'nope' must be an argument of Bad"):
        register(Bad)
    Bad.options = (Option("seed", int, default=-1, lo=0),)
    with pytest.raises(TypeError, match="default seed = -1"):
        register(Bad)
    assert "bad" not in catalogue.names(every=True)


def test_max_batch_is_what_each_policy_declares():
    def phases(*policies):
        return [SimpleNamespace(policy=p) for p in policies]

    assert max_batch(phases(BSP(BatchSizer(32)), ASP(FixedSizer([8, 48]))), 2) == 48
    assert max_batch(phases(LBBSP(batch_size=32)), 8) == 64  # twice the even batch: the input's rows a step
    profiles = [{"m": 0.001, "b": 0.01}] * 4
    assert max_batch(phases(LBBSP(batch_size=32, profiles=profiles)), 4) == 32 * 4 - 3  # X less 1 per other
    assert max_batch(phases(LBBSP(batch_size=32, hi=50)), 4) == 50
    greedy = GreedyStragglerPolicy(StragglerDetector(1.0, 3), bsp=BSP(BatchSizer(16)), asp=ASP(BatchSizer(64)))
    assert max_batch(phases(greedy), 4) == 64  # its ASP's batches too


def test_traits_drive_the_configuration_policy_and_rl_baselines():
    assert [n for n in catalogue.names() if catalogue.spec(n).aggregating] == ["bsp", "lbbsp", "auto"]
    conf = ConfigPolicy()
    assert conf.hyper("lbbsp", 4, 64, 0.9).lr_scale == 4.0 and conf.hyper("fluentps", 4, 64, 0.9).lr_scale == 1.0
    assert STATIC == ("bsp", "asp", "ssp2", "ssp5", "ssp8")
    assert teacher("ssp5").__name__ == "ssp5"
    for bad in ("ssp", "bsp2", "lbbsp", "fluentps3"):
        with pytest.raises(ValueError, match="expected one of bsp, asp, ssp<s>"):
            teacher(bad)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_a_straggler_jobs_switch_point_of_0_or_1_runs(fraction):
    """A search on a straggler job stores 1 when only BSP was acceptable (0: ASP alone):
    BSP to the end, still straggler-aware (ASP while one is seen), or plain ASP; both were
    refused as a protocol list the straggler policy could not take."""
    from tfsync.job.config import JobConfig
    from tfsync.cli.jobrun import build_phases, with_switch_point
    from tfsync.switch.online import GreedyStragglerPolicy

    cfg = JobConfig.from_dict({"cluster": {"workers": 3}, "switch": {"stragglers": "greedy"},
                               "protocol": [{"name": "bsp", "until": 0.5}, {"name": "asp"}]})
    (phase,) = build_phases(with_switch_point(cfg, fraction), num_train=1000)
    if fraction == 0.0:
        assert phase.policy.name == "asp"
        return
    assert isinstance(phase.policy, GreedyStragglerPolicy) and phase.policy.asp.name == "asp"
    assert phase.policy.bsp_samples == (None if fraction == 1.0 else 500)
    assert phase.policy.lr_scales == {"bsp": 3.0, "asp": 1.0}
