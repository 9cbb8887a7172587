"""Issue 31 case 7: a disk that fills up during a run. The run stops with one line (what,
where, how much it needed and how much is free), exit 1; metrics.jsonl holds whole lines
only; the summary is written if it still fits; `tfsync resume` goes on once space is
freed, without writing the training records again. The disk is a small tmpfs (root)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import DATA, fill_disk, linear_job, small_disk, wait_for_checkpoints
from tfsync.base.nospace import NoSpaceError
from tfsync.engine.generation import write_record_file
from tfsync.engine.records import RunRecorder


def whole_lines(path):
    """Every line of ``path`` ends with a newline and is JSON; returns them."""
    text = path.read_text()
    assert text.endswith("\n"), f"{path} ends in the middle of a line: {text[-80:]!r}"
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.unit
def test_records_on_a_full_disk_stop_at_a_whole_line_naming_what_and_where(tmp_path):
    with small_disk(tmp_path / "disk", "1m") as disk:
        rec = RunRecorder(str(disk / "run"), tensorboard=False)
        rec.begin(1000.0, workers=2)
        rec.event("phase", protocol="asp")
        before = (disk / "run" / "metrics.jsonl").stat().st_size
        fill_disk(disk, leave=4096)   # one page: part of the next 64 KB of records fits
        record = {"worker": 0, "loss": 0.5, "samples_per_s": 1.0, "batch_size": 32, "staleness": 0, "lr": 0.1,
                  "samples": 32, "dropped": False, "pushes": 1, "pad": "x" * 200}
        with pytest.raises(NoSpaceError) as e:
            for i in range(1000):
                rec.push({**record, "pushes": i + 1})
        line = str(e.value)
        assert line.startswith("disk full: cannot write the run's records (metrics.jsonl) to ")
        assert str(disk / "run" / "metrics.jsonl") in line and "it needs 6" in line and " free there" in line
        assert "\n" not in line
        assert (disk / "run" / "metrics.jsonl").stat().st_size == before   # cut back to the last whole line
        assert [r.get("event") for r in whole_lines(disk / "run" / "metrics.jsonl")] == ["run", "phase"]
        rec.close()


@pytest.mark.unit
def test_training_records_are_not_written_again_when_intact(tmp_path):
    """A resumed run finds its data records whole: they are left as they are (no second
    copy's space needed); records that differ are replaced needing their own size only."""
    with small_disk(tmp_path / "disk", "1m") as disk:
        path = str(disk / "train_x.bin")
        a = np.arange(150_000, dtype=np.float32)   # 600 KB of a 1 MB disk
        write_record_file(path, a)
        first = os.stat(path)
        write_record_file(path, a)
        again = os.stat(path)
        assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
        write_record_file(path, a[::-1].copy())   # other data: replaced, though two copies would not fit
        assert np.array_equal(np.fromfile(path, np.float32), a[::-1])
        with pytest.raises(NoSpaceError, match=r"cannot write the training records to .* \(it needs 1.2 MB, "):
            write_record_file(path, np.zeros(300_000, np.float32))
        assert not os.path.exists(path) and os.listdir(disk) == []   # nothing half-written left behind


@pytest.mark.cluster
def test_a_run_whose_disk_fills_stops_in_one_line_and_resumes_when_space_is_freed(tmp_path):
    """The MLP's checkpoint (~440 KB) no longer fits once the disk keeps 128 KB: the run
    ends at that checkpoint (exit 1, one line, whole metrics lines, a failure summary);
    freed, `tfsync resume` finishes the job and leaves the data records untouched."""
    with small_disk(tmp_path / "disk", "96m") as disk:
        run_dir, job = disk / "run", disk / "job.toml"
        # 30 epochs: the disk fills long before the run could end, however slow this machine is
        job.write_text(linear_job("full", "bsp", epochs=30, checkpoint_every=5).replace(
            'name = "linear"', 'name = "mlp"').format(run_dir=run_dir))
        env = dict(os.environ, TFSYNC_HOME=str(tmp_path / "home"))
        run = subprocess.Popen([sys.executable, "-m", "tfsync.cli", "run", str(job), "--json", "--data", DATA],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            wait_for_checkpoints(run_dir, count=1, timeout=240)
            filler = fill_disk(disk, leave=128 * 1024)
            _, err = run.communicate(timeout=300)
        finally:
            if run.poll() is None:
                run.kill()
        lines = [line for line in err.splitlines() if line.strip()]
        assert run.returncode == 1, err
        assert "Traceback" not in err
        assert lines[-1].startswith("tfsync: error: disk full: cannot write checkpoint ckpt-"), err
        assert f"to {run_dir / 'checkpoints'} (it needs " in lines[-1] and "free there" in lines[-1]
        assert "tfsync resume" in lines[-1]
        recs = whole_lines(run_dir / "metrics.jsonl")
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["failed"] == lines[-1].removeprefix("tfsync: error: ")
        assert summary["samples"] < summary["workload_samples"]
        assert not list((run_dir / "checkpoints").glob("*_temp"))   # the failed one's files are gone
        data = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (run_dir / "data").iterdir()}

        filler.unlink()
        r = subprocess.run([sys.executable, "-m", "tfsync.cli", "resume", str(job), "--json", "--data", DATA,
                            "--set", "train.epochs=1"],   # the rest of a shorter workload
                           capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr
        done = json.loads((run_dir / "summary.json").read_text())
        assert "failed" not in done and done["samples"] >= done["workload_samples"]
        assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (run_dir / "data").iterdir()} == data
        assert len(whole_lines(run_dir / "metrics.jsonl")) > len(recs)


@pytest.mark.cluster
def test_a_disk_full_before_any_checkpoint_says_to_start_again_not_to_resume(tmp_path):
    """The disk fills while the data is staged: no checkpoint exists, so the line says
    `tfsync run` starts the job again (a resume would find nothing to go on from)."""
    with small_disk(tmp_path / "disk", "8m") as disk:
        run_dir, job = disk / "run", disk / "job.toml"
        job.write_text(linear_job("full", "bsp", epochs=1).format(run_dir=run_dir))
        fill_disk(disk, leave=256 * 1024)
        r = subprocess.run([sys.executable, "-m", "tfsync.cli", "run", str(job), "--json", "--data", DATA],
                           capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, TFSYNC_HOME=str(tmp_path / "home")))
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1, r.stderr
    assert lines[-1].startswith("tfsync: error: disk full: cannot write the training records"), r.stderr
    assert lines[-1].endswith(f"then `tfsync run {job}` starts the job again (it has no checkpoint yet)")


@pytest.mark.unit
def test_a_checkpoint_whose_list_cannot_be_written_is_removed_and_the_older_ones_stay(tmp_path, monkeypatch):
    """The list is written before older checkpoints go: when it cannot be (a full disk), the
    new checkpoint's files are removed and the ones the list names are all still there."""
    import errno
    import types

    import tensorflow as tf

    from tfsync.engine.checkpoints import CheckpointDir

    def save(prefix):
        for suffix in (".index", ".data-00000-of-00001"):
            with open(prefix + suffix, "wb") as f:
                f.write(b"x" * 100)

    gen = types.SimpleNamespace(save=save, model=types.SimpleNamespace(variables=[]))
    ckpts = CheckpointDir(str(tmp_path), keep=2)
    ckpts.save(gen, 1)
    ckpts.save(gen, 2)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tf.compat.v1.train, "update_checkpoint_state", full)
    with pytest.raises(NoSpaceError, match="the checkpoint list"):
        ckpts.save(gen, 3)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index",
                                            "ckpt-2.data-00000-of-00001", "ckpt-2.index"]
    monkeypatch.undo()
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-2")
    assert ckpts.kept == [str(tmp_path / "ckpt-1"), str(tmp_path / "ckpt-2")]
