"""What `tfsync search` and `tfsync runs` say about a search (issue 32 case 4): progress as
each trial starts, a last line that matches the answer, a loss search's trials as losses,
and `--show` pointing at a search stored with other settings. The trials' training is
replaced by a stand-in (``run_trial_process``) here: the searches on real tasks are in
test_search_cli.py and test_user_job.py."""


import pytest

from helpers import linear_job, tfsync_here

pytestmark = pytest.mark.unit

JOB = linear_job("recurring", {"name": "bsp", "until": 0.5}, "asp", epochs=3)


tfsync = tfsync_here


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setenv("TFSYNC_HOME", str(tmp_path / "home"))
    path = tmp_path / "job.toml"
    path.write_text(JOB.format(run_dir=tmp_path / "run"))
    return path


def stand_in(score_of, wall_of=lambda f: 1.0):
    """A trial that trains nothing: its summary's converged score and time from its BSP share."""
    def run(cfg, data_path):
        names = [p.name for p in cfg.protocol]
        fraction = cfg.protocol[0].until if len(names) > 1 else 1.0 if names == ["bsp"] else 0.0
        return {"wall_s": wall_of(fraction), **score_of(fraction), "evals": []}
    return run


def test_a_search_says_each_trial_as_it_starts_and_ends_on_its_answer(job, monkeypatch, capsys):
    # only BSP reaches the target: the answer is BSP only, and the last line must say so
    monkeypatch.setattr("tfsync.cli.search.run_trial_process",
                        stand_in(lambda f: {"converged_accuracy": 0.9 if f >= 1.0 else 0.5}))
    code, out, err = tfsync(capsys, "search", str(job), "--runs", "1", "--settings", "2")
    assert code == 0, err
    assert "training trial 1 of 4: BSP only, run 0 ..." in err and "training trial 2 of 4: BSP 0.5 then ASP" in err
    assert "training trial 4 of 4: ASP only, run 0 ..." in err
    assert "BSP only (no earlier switch was acceptable)" in out
    assert out.strip().splitlines()[-1].startswith(f"stored; `tfsync run {job}` now runs BSP to the end"), out
    # a job whose BSP phase has a straggler policy keeps it: not "BSP only"
    code, out, err = tfsync(capsys, "search", str(job), "--runs", "1", "--settings", "2",
                            "--set", "cluster.workers=3", "--set", "switch.stragglers=greedy")
    assert code == 0, err
    assert "now runs BSP with the greedy straggler policy to the end" in out.strip().splitlines()[-1], out
    from tfsync.job.config import load_job
    from tfsync.cli.search import stored_switch_point
    cfg, found = stored_switch_point(load_job(str(job), overrides=["cluster.workers=3", "switch.stragglers=greedy"]))
    assert found["fraction"] == 1.0 and [p.name for p in cfg.protocol] == ["bsp"]   # what `tfsync run` now runs


def test_a_loss_searchs_trials_show_as_losses(job, monkeypatch, capsys):
    monkeypatch.setattr("tfsync.cli.search.run_trial_process",
                        stand_in(lambda f: {"converged_accuracy": None, "test_loss": 0.25 if f >= 0.5 else 2.0}))
    code, out, err = tfsync(capsys, "search", str(job), "--runs", "1", "--settings", "1", "--target-loss", "0.3")
    assert code == 0, err
    code, out, err = tfsync(capsys, "runs", "recurring")
    assert code == 0 and "converged test loss 0.25" in out and "%" not in out.split("\n", 1)[1], out


def test_show_without_the_searchs_settings_names_the_set_that_finds_it(job, monkeypatch, capsys):
    monkeypatch.setattr("tfsync.cli.search.run_trial_process", stand_in(lambda f: {"converged_accuracy": 0.9}))
    code, _, err = tfsync(capsys, "search", str(job), "--runs", "1", "--settings", "1", "--target", "0.8",
                          "--set", "train.learning_rate=0.1")
    assert code == 0, err
    code, _, err = tfsync(capsys, "search", "--show", str(job))
    assert code == 1 and err.count("\n") == 1
    assert "a search of recurring is stored with other settings" in err and "--set train.learning_rate=0.1" in err
    code, out, _ = tfsync(capsys, "search", "--show", str(job), "--set", "train.learning_rate=0.1")
    assert code == 0 and "switch point for job signature" in out


def test_a_search_says_which_trials_changed_their_worker_count_and_keeps_it_with_the_point(job, monkeypatch, capsys):
    """A trial that lost a worker under cluster.min_workers (or was scaled) trained at
    another count than the signature's: the answer says so, and so does `--show` later."""
    def score(f):
        scales = [{"from": 2, "to": 1, "by": "loss", "samples": 300}] if f == 0.5 else []
        return {"converged_accuracy": 0.9, "workload_samples": 1000, "scales": scales}
    monkeypatch.setattr("tfsync.cli.search.run_trial_process", stand_in(score))
    code, out, err = tfsync(capsys, "search", str(job), "--runs", "1", "--settings", "1", "--target", "0.8")
    assert code == 0, err
    said = "scaled during the search: BSP 0.5 run 0: 2 -> 1 workers (loss, at 30 % of its workload)"
    assert said in out and out.count("scaled during") == 1, out
    code, out, _ = tfsync(capsys, "search", "--show", str(job))
    assert code == 0 and said in out, out


def test_a_search_answers_asp_only_or_bsp_only_when_they_train_fastest(job, monkeypatch, capsys):
    # every plan acceptable, ASP fastest: the answer is ASP only, and `tfsync run` then runs ASP alone
    monkeypatch.setattr("tfsync.cli.search.run_trial_process",
                        stand_in(lambda f: {"converged_accuracy": 0.9}, lambda f: 100.0 + 60.0 * f))
    code, out, err = tfsync(capsys, "search", str(job), "--runs", "1", "--settings", "1")
    assert code == 0, err
    assert ("switch point for job signature" in out and ": ASP only (acceptable and fastest: ASP only 100 s, "
            "switch at 0.5 130 s, BSP only 160 s of training on average)" in out), out
    assert "now runs ASP alone" in out.strip().splitlines()[-1], out
    from tfsync.job.config import load_job
    from tfsync.cli.search import stored_switch_point
    cfg, found = stored_switch_point(load_job(str(job)))
    assert found["fraction"] == 0.0 and found["searched"] == 0.5 and [p.name for p in cfg.protocol] == ["asp"]
    # the switch's restart costs more than ASP saves: BSP only
    monkeypatch.setattr("tfsync.cli.search.run_trial_process",
                        stand_in(lambda f: {"converged_accuracy": 0.9}, lambda f: 100.0 + (50.0 if f < 1 else 0.0)))
    code, out, err = tfsync(capsys, "search", str(job), "--runs", "1", "--settings", "1", "--set", "train.learning_rate=0.02")
    assert code == 0, err
    assert ": BSP only (acceptable and fastest: BSP only 100 s, " in out, out
    # --no-ends: Algorithm 1's answer, and no ASP trial
    code, out, err = tfsync(capsys, "search", str(job), "--runs", "1", "--settings", "1", "--set", "train.learning_rate=0.03",
                            "--no-ends")
    assert code == 0, err
    assert "ASP only" not in err and ": BSP for 0.5 of the workload, then ASP\n" in out, out
