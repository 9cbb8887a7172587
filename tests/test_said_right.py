"""What commands print says what happened: an ETA only where there is a rate, the switch
point in words that fit it, a search's scores named for what they are."""

import io

import pytest

from tfsync.base.progress import progress_bar
from tfsync.cli.search import format_result
from tfsync.switch.plan import SwitchPlan

pytestmark = pytest.mark.unit


class _Stream(io.StringIO):
    def isatty(self):
        return False


def test_no_eta_before_anything_is_done():
    out = _Stream()
    update = progress_bar(out)
    update(0, 12, "trial 1")
    update(3, 12, "trial 4")
    first, second = out.getvalue().splitlines()
    assert "eta ?" in first
    assert second.split("eta ")[1].split(" s")[0].replace(",", "").isdigit()


@pytest.mark.parametrize("fraction, words", [(1.0, "BSP only"), (0.0, "ASP only"),
                                             (0.25, "BSP for 0.25 of the workload, then ASP")])
def test_a_switch_point_is_said_as_its_plan_runs(fraction, words):
    assert SwitchPlan.words(fraction) == words
    assert [p for p, _ in SwitchPlan.bsp_then_asp(fraction).phases] == \
        {"BSP only": ["bsp"], "ASP only": ["asp"]}.get(words, ["bsp", "asp"])


def test_a_search_result_names_its_scores_and_the_plan():
    result = {"fraction": 1.0, "target": -0.5, "beta": 0.01, "metric": "neg_log_loss", "bsp": [],
              "tried": [{"fraction": 0.5, "scores": [-0.6, -0.62], "mean": -0.61, "accepted": False,
                         "confidence": 0.1}],
              "trials_run": 2, "trials_reused": 0, "search_time_s": 10.0}
    text = format_result(result, "abc")
    assert "BSP only (no earlier switch was acceptable)" in text and "-ln(test loss)" in text
    assert "-0.6000, -0.6200" in text


def _job(tmp_path, text):
    from tfsync.job.config import load_job
    path = tmp_path / "job.toml"
    path.write_text(text)
    return load_job(str(path))


def test_a_batch_larger_than_the_training_set_is_refused_with_the_numbers(tmp_path, caplog):
    from tfsync.cli.jobrun import check_batch_fits
    from tfsync.job.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^train.batch_size: a worker's batch of 100,000 is larger than the "
                                          r"training set \(60,000 examples\); at most 60,000$"):
        check_batch_fits(_job(tmp_path, "[train]\nbatch_size = 100000\n"), 60_000, 2)
    with pytest.raises(ConfigError, match=r"^protocol.0.batch_sizes: a worker's batch of 900"):
        check_batch_fits(_job(tmp_path, '[[protocol]]\nname = "bsp"\nbatch_sizes = [900, 10]\n'), 500, 2)
    check_batch_fits(_job(tmp_path, "[train]\nbatch_size = 40000\n"), 60_000, 2)   # a round of 80,000: said
    assert "one round of their batches (80,000 samples) is larger than the training set (60,000 examples)" \
        in caplog.text
    caplog.clear()
    check_batch_fits(_job(tmp_path, "[train]\nbatch_size = 64\n"), 60_000, 2)
    assert caplog.text == ""
