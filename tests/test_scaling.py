"""Elastic workers on real TF task processes: a running job scaled 2 -> 3 -> 2 workers
by a manager's command (tfsync.engine.scaling)."""

import json

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tfsync.engine.commands import Command, Controller
from tfsync.engine.generation import TrainSetup
from tfsync.engine.engine import Engine
from tfsync.engine.phase import Phase
from tfsync.policy import BSP, BatchSizer

pytestmark = pytest.mark.cluster

M = 16  # rows per input batch; a step uses the first batch_size of them


def _schedule():
    return keras.optimizers.schedules.ExponentialDecay(0.02, decay_steps=4, decay_rate=0.7)


class _Times(keras.optimizers.schedules.LearningRateSchedule):
    """The reference's rate at step k: the schedule's x the rate factor of update k."""

    def __init__(self, factors):
        self.factors = tf.constant(factors, tf.float32)

    def __call__(self, step):
        return _schedule()(step) * tf.gather(self.factors, tf.cast(step, tf.int32))


class ScaleAt(Controller):
    """Scale to each of ``counts`` in turn, ``every`` updates after the last change."""

    def __init__(self, engine_ref, counts, every=3):
        self.engine_ref, self.counts, self.every, self.results, self.since = engine_ref, list(counts), every, [], 0

    def commands(self):
        e = self.engine_ref[0]
        if self.counts and len(self.results) == len(e.runlog.scales) and e.ledger.updates >= self.since + self.every:
            self.since = e.ledger.updates + 1
            return [Command(f"s{len(self.results)}", "scale", workers=self.counts.pop(0))]
        return []

    def result(self, result):
        self.results.append(result)


def test_bsp_scaled_2_3_2_mid_run_equals_single_process_adam_on_each_rounds_batches(tiny_problem, tmp_path):
    """BSP with Adam and a decaying schedule, scaled 2 -> 3 -> 2 workers while it trains
    (each scale a restart from a checkpoint): every round has one push of each worker of
    its time, none twice, nothing counted lost; the rate follows the configuration rule
    (x n: 2, 3, 2 as the count goes); the weights equal single-process Adam on the union of
    each round's batches at those rates."""
    # the controller counts updates as the coordinator sees them, the coordinator's rounds
    # (not the PS's): while the PS ran them, a busy coordinator saw the first 3 updates after
    # the PS had run 14, this tiny workload's every round, and the second scale found nothing
    # left to scale (`tfsync scale` on a running job: tests/test_control.py)
    x, y, model_fn, _, loss_fn = tiny_problem
    setup = TrainSetup(model_fn, lambda: keras.optimizers.Adam(_schedule()), loss_fn, x, y, max_batch_size=M,
                       shuffle=False)
    ref = []
    controller = ScaleAt(ref, [3, 2])
    engine = Engine(setup, run_dir=str(tmp_path), tensorboard=False, timeout_s=120, controller=controller,
                    ps_rounds=False)
    ref.append(engine)
    total = 10 * 4 + 15 * 4 + 10 * 4
    summary = engine.run([Phase(BSP(BatchSizer(5)), lr_scale=2.0)], total_samples=total)
    assert [(r.ok, r.message.split(" in ")[0]) for r in controller.results] == \
        [(True, "scaled 2 -> 3 workers"), (True, "scaled 3 -> 2 workers")], controller.results
    scales = summary["scales"]
    assert [(s["from"], s["to"]) for s in scales] == [(2, 3), (3, 2)] and summary["workers"] == 2
    assert len(engine.lifecycle.clusters) == 3

    recs = [r for r in map(json.loads, open(tmp_path / "metrics.jsonl")) if "worker" in r]
    rounds = {}
    for r in recs:
        assert r["worker"] not in rounds.setdefault(r["round"], {}), r   # no push twice
        rounds[r["round"]][r["worker"]] = r
    counts = [len(rounds[k]) for k in sorted(rounds)]
    starts = [s["updates"] for s in scales]
    expected = [2 if u < starts[0] else 3 if u < starts[1] else 2 for u in range(len(counts))]
    assert counts == expected and summary["updates"] == len(rounds)
    assert summary["samples"] == sum(r["batch_size"] for r in recs) >= total
    for k in sorted(rounds):   # the rate of each update: the schedule's x n
        for r in rounds[k].values():
            assert r["lr"] == pytest.approx(float(_schedule()(k)) * counts[k], rel=1e-5)

    # the reference: each generation's workers read their input from its start again
    model = model_fn()
    opt = keras.optimizers.Adam(_Times([float(n) for n in counts]))
    for u, n in enumerate(counts):
        k = (u - max([s for s in starts if s <= u], default=0)) % (len(y) // M)   # (the input repeats)
        bx, by = x[k * M:k * M + 5], y[k * M:k * M + 5]
        bx, by = np.concatenate([bx] * n), np.concatenate([by] * n)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(by, model(bx)))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    for got, want in zip(engine.final_weights(), model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_lost_workers_shrink_a_job_with_elastic_bounds_instead_of_restarting_their_tasks(tiny_problem, tmp_path):
    """4 workers, min_workers = 2: worker 1's task is killed mid-run, and worker 2's while
    the engine handles that loss (two nodes lost a moment apart: the first look at the
    tasks saw one); the job goes on with 2 workers from a checkpoint taken at the loss (no
    restarted task, no rejoin): one 'scaled' event by "loss" for both, BSP rounds of 2
    pushes after it, the rate x n each time, every counted update applied on the PS."""
    from tfsync.engine.callbacks import Callback

    class KillTwo(Callback):
        done = False

        def on_push(self, engine, push, record):
            if engine.ledger.pushes >= 16 and not self.done:
                self.done = True
                engine.generation.cluster.kill_task("worker", 1)

        def on_event(self, engine, kind, fields):
            if kind == "worker_lost" and fields["worker"] == 1:
                engine.generation.cluster.kill_task("worker", 2)

    x, y, model_fn, optimizer_fn, loss_fn = tiny_problem
    setup = TrainSetup(model_fn, optimizer_fn, loss_fn, x, y, max_batch_size=M, shuffle=False)
    engine = Engine(setup, workers=4, run_dir=str(tmp_path), tensorboard=False, timeout_s=120,
                    min_workers=2, callbacks=[KillTwo()])
    summary = engine.run([Phase(BSP(BatchSizer(5)), lr_scale=4.0)], total_samples=20 * 8 + 10 * 12)
    (scaled,) = summary["scales"]
    assert (scaled["from"], scaled["to"], scaled["by"], scaled["lost"]) == (4, 2, "loss", [1, 2])
    assert summary["workers"] == 2 and len(engine.lifecycle.clusters) == 2
    lost = {r["task"]: r for r in summary["recoveries"]}
    assert set(lost) == {"worker:1", "worker:2"} and {r["shrunk_to"] for r in lost.values()} == {2}
    recs = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert not [r for r in recs if r.get("event") == "worker_rejoined"]
    assert sorted(r["worker"] for r in recs if r.get("event") == "worker_lost") == [1, 2]
    pushes = [r for r in recs if "worker" in r and "event" not in r]
    before = [r for r in pushes if r["updates"] < scaled["updates"]]
    after = [r for r in pushes if r["updates"] >= scaled["updates"]]
    # (how many rounds came after depends on how far the PS ran ahead of the records the
    # coordinator had seen when it killed the task: at least two)
    assert {r["worker"] for r in after} == {0, 1} and len(after) >= 2 * 2
    assert all(r["lr"] == pytest.approx(0.1 * 2) for r in after)
    assert all(r["lr"] == pytest.approx(0.1 * 4) for r in before)
    rounds = {}
    for r in after:
        rounds.setdefault(r["round"], []).append(r["worker"])
    assert all(sorted(ws) == [0, 1] for ws in rounds.values())
    # every update counted was applied on the PS; rounds the PS ran whose pushes had not
    # reached the coordinator when the task died are applied, not counted, as after any
    # worker loss. How many depends on how far the PS ran ahead of the drained records (a
    # busy machine: 2 past the steps in flight), but each took one of the dead worker's
    # steps, granted and not counted: at most its steps lost, or the steps in flight and
    # the round closed at the loss, as before
    extra = max(sum(r["steps_lost"] for r in lost.values()), lost["worker:1"]["in_flight_lost"] + 1)
    assert summary["updates"] <= summary["optimizer_iterations"] <= summary["updates"] + extra
