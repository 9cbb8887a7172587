"""metrics.jsonl after going back to a checkpoint: each counted push once."""

import json
import os

import pytest

from tfsync.engine.records import RunRecorder, set_aside_previous_run

pytestmark = pytest.mark.unit


def test_rewind_moves_the_pushes_after_the_checkpoint_out(tmp_path):
    rec = RunRecorder(str(tmp_path), tensorboard=False)
    for k in range(1, 11):
        rec.push({"worker": k % 2, "pushes": k, "loss": 1.0})
        if k == 6:
            rec.event("checkpoint", pushes=6)
    rec.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"worker": 1, "pushes": 11, "lo')  # the line a crash cut short
    rec = RunRecorder(str(tmp_path), tensorboard=False)
    assert rec.rewind(6, "resume") == 4
    rec.push({"worker": 0, "pushes": 7, "loss": 0.5})
    rec.close()
    lines = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    assert [r["pushes"] for r in lines if "worker" in r] == [1, 2, 3, 4, 5, 6, 7]
    assert [r["event"] for r in lines if "event" in r] == ["checkpoint", "rewind"]
    assert lines[-2]["discarded"] == 4 and lines[-2]["why"] == "resume"
    gone = [json.loads(x) for x in open(tmp_path / "metrics.discarded.jsonl")]
    assert [(r["pushes"], r["discarded"]) for r in gone] == [(7, "resume"), (8, "resume"), (9, "resume"),
                                                             (10, "resume")]
    assert "metrics.discarded.jsonl" in os.listdir(set_aside_previous_run(str(tmp_path)))  # a new run starts clean


def test_push_lines_are_held_for_at_most_half_a_second(tmp_path):
    """Pushes are written in blocks (not a write per push), yet a reader of metrics.jsonl
    (a test waiting for N pushes, `tail -f`) sees each within FLUSH_S of the next."""
    import time

    from tfsync.engine import records

    rec = RunRecorder(str(tmp_path), tensorboard=False)
    pushes = lambda: sum('"worker"' in line for line in open(tmp_path / "metrics.jsonl"))  # noqa: E731
    rec.push({"worker": 0, "pushes": 1, "loss": 1.0})
    assert pushes() == 0   # held: a block is written, not a line per push
    time.sleep(records.FLUSH_S)
    rec.push({"worker": 1, "pushes": 2, "loss": 1.0})
    assert pushes() == 2
    rec.close()


def test_tensorboard_gets_one_point_a_tag_per_block_of_pushes(tmp_path, monkeypatch):
    """The push scalars go to TensorBoard once a flush, at the last push's number: each
    worker's loss, speed and batch size and the staleness as means over the block, the
    rate, the samples and the moving mean of the loss as they were at its last push."""
    import tensorflow as tf

    from tfsync.engine import records

    monkeypatch.setattr(records, "FLUSH_S", 3600.0)   # one block, however slow the machine
    rec = RunRecorder(str(tmp_path))
    for k in range(1, 7):
        w = k % 2
        rec.push({"worker": w, "pushes": k, "loss": float(k), "samples_per_s": 10.0 * k, "batch_size": 8 * (w + 1),
                  "staleness": k % 3, "lr": 0.1 / k, "samples": 8 * k, "dropped": False})
    rec.event("checkpoint", pushes=6)   # an event writes what is held
    rec.push({"worker": 0, "pushes": 7, "loss": 7.0, "samples_per_s": 70.0, "batch_size": 8, "staleness": 0,
              "lr": 0.01, "samples": 60, "dropped": False})
    rec.close()
    points = {}
    for f in (tmp_path / "tb").iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(f)):
            for v in event.summary.value:
                points.setdefault(v.tag, []).append((event.step, round(v.simple_value, 5)))
    assert points["loss/worker1"] == [(6, 3.0)] and points["loss/worker0"] == [(6, 4.0), (7, 7.0)]
    assert points["samples_per_s/worker1"] == [(6, 30.0)] and points["batch_size/worker1"] == [(6, 16.0)]
    assert points["train/staleness"] == [(6, 1.0), (7, 0.0)]
    assert points["train/lr"] == [(6, round(0.1 / 6, 5)), (7, 0.01)] and points["train/samples"] == [(6, 48), (7, 60)]
    ema = 1.0
    for k in range(2, 7):
        ema = 0.9 * ema + 0.1 * k
    assert points["train/loss"][0] == (6, round(ema, 5))
