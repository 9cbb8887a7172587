"""No file tfsync writes in a run or home directory is written through a symbolic link: a
link planted at each such path leaves the file it points to untouched."""

import json
import os
import stat
import sys

import numpy as np
import pytest

from tfsync.base import safefile

pytestmark = pytest.mark.unit

SECRET = "the victim's own content\n"


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_text(SECRET)
    path.chmod(0o644)
    return path


def plant(link, victim):
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim)
    return link


def untouched(victim):
    return victim.read_text() == SECRET and stat.S_IMODE(victim.stat().st_mode) == 0o644


def test_a_whole_file_write_replaces_a_link_and_sets_its_mode(tmp_path, victim):
    target = plant(tmp_path / "run" / "summary.json", victim)
    safefile.write(target, "{}", mode=0o600)
    assert untouched(victim)
    assert not target.is_symlink() and target.read_text() == "{}"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_an_append_or_a_new_file_through_a_link_is_refused(tmp_path, victim):
    link = plant(tmp_path / "run" / "metrics.jsonl", victim)
    with pytest.raises(safefile.UnsafePathError, match="metrics.jsonl is a symbolic link"):
        safefile.open_append(link)
    with pytest.raises(safefile.UnsafePathError):
        safefile.create_new(link)
    with pytest.raises(safefile.UnsafePathError):
        safefile.make_dir(plant(tmp_path / "run" / "control", tmp_path))
    assert untouched(victim)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with safefile.replacing(path) as f:
            f.write("half")
            raise RuntimeError("crash")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["summary.json"]


def test_the_run_recorder_never_writes_through_links(tmp_path, victim):
    from tfsync.engine.records import RunRecorder

    run = tmp_path / "run"
    plant(run / "summary.json", victim)
    rec = RunRecorder(str(run), tensorboard=False)
    rec.summary({"pushes": 1})
    rec.close()
    assert json.loads((run / "summary.json").read_text()) == {"pushes": 1}
    os.unlink(run / "metrics.jsonl")
    plant(run / "metrics.jsonl", victim)
    with pytest.raises(safefile.UnsafePathError):
        RunRecorder(str(run), tensorboard=False)
    assert untouched(victim)


def test_training_records_control_files_and_tokens_never_follow_links(tmp_path, victim):
    from tfsync.api import auth
    from tfsync.engine.generation import TrainSetup, write_records
    from tfsync.manager import embedded

    run = tmp_path / "run"
    for name in ("data/train_x.bin", "data/train_y.bin", "control/token", "control/manager.json"):
        plant(run / name, victim)
    x, y = np.zeros((4, 3), np.float32), np.arange(4)
    write_records(TrainSetup(None, None, None, x, y, max_batch_size=2), str(run))
    token = auth.new_token()
    control = embedded.write_control(str(run), token, {"address": "127.0.0.1:1"})
    assert untouched(victim)
    assert auth.read_token(control / "token") == token
    for name in ("token", "manager.json"):
        assert stat.S_IMODE((control / name).stat().st_mode) == 0o600
    assert np.fromfile(run / "data" / "train_y.bin", np.int64).tolist() == [0, 1, 2, 3]


def test_jsonl_trials_csv_and_task_logs_never_follow_links(tmp_path, victim):
    from tfsync.hooks.tasks import TaskSupervisor
    from tfsync.policy.pushlog import write_jsonl
    from tfsync.cli.rl import write_csv
    from tfsync.switch.trials import JsonTrials, TrialKey, TrialResult

    write_jsonl(str(plant(tmp_path / "a.jsonl", victim)), [{"a": 1}])
    write_csv(str(plant(tmp_path / "b.csv", victim)), [{"a": 1}])
    trials = JsonTrials(str(tmp_path / "trials.json"))
    plant(tmp_path / "trials.json", victim)
    trials.put(TrialKey("sig", 0.5, 0), TrialResult(0.9, 10.0))
    assert untouched(victim)
    sup = TaskSupervisor(str(tmp_path / "logs"), task_command=[sys.executable, "-c", ""])
    plant(tmp_path / "logs" / "job" / "ps-0.log", victim)
    with pytest.raises(safefile.UnsafePathError):
        sup.start("job", '{"ps": ["127.0.0.1:2222"]}', [("ps", 0)], {})
    assert untouched(victim) and sup.tasks() == []
