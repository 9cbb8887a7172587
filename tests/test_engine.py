"""The engine on real TF task processes (2 workers + 1 PS, separate OS processes)."""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from tfsync.base import arrays
from tfsync.engine import step
from tfsync.engine.callbacks import Callback
from tfsync.engine.cluster import LocalCluster
from tfsync.engine.generation import Generation, TrainSetup
from tfsync.engine.lifecycle import STANDING_PER_WORKER, Lifecycle
from tfsync.engine.engine import Engine
from tfsync.engine.phase import EngineError, Phase
from tfsync.policy import ASP, BSP, NOTHING, SSP, FixedSizer, Grant

pytestmark = pytest.mark.cluster

M = 16  # rows per input batch; a step uses the first batch_size of them


def _records(run_dir):
    with open(run_dir / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if "worker" in r]


def _reference(problem, batch_order, sizes):
    """Single-process SGD: each update on the concatenated examples of all workers
    (``sizes``: one batch size per worker, or such a tuple per update)."""
    x, y, model_fn, optimizer_fn, loss_fn = problem
    model, opt = model_fn(), optimizer_fn()
    per_update = sizes if isinstance(sizes[0], (tuple, list)) else [sizes] * len(batch_order)
    for k, update_sizes in zip(batch_order, per_update):
        k %= arrays.length(y) // M  # the input pipeline repeats
        rows = arrays.take((x, y), slice(k * M, (k + 1) * M))  # labels may be a dict (several outputs)
        bx, by = tf.nest.map_structure(lambda a: np.concatenate([a[:b] for b in update_sizes]), rows)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(by, model(bx))) + sum(model.losses)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return model.get_weights()


def _engine(problem, run_dir, **kw):
    x, y, model_fn, optimizer_fn, loss_fn = problem
    setup = TrainSetup(model_fn, optimizer_fn, loss_fn, x, y, max_batch_size=M, shuffle=False)
    return Engine(setup, run_dir=str(run_dir), tensorboard=False, **{"timeout_s": 120, **kw})


class _DiesAfterListening(LocalCluster):
    """A generation whose worker 1 dies once every task listens, before the coordinator
    has connected to them (as when it is killed while a restart switch connects)."""
    doomed = False

    def wait_ready(self, tasks=None) -> None:
        super().wait_ready(tasks)
        if self.doomed:
            self.doomed = False
            self.kill_task("worker", 1)
            self.procs[("worker", 1)].wait(timeout=30)


def test_a_task_that_dies_while_a_restart_switch_connects_costs_a_fresh_start_of_that_generation(
        tiny_problem, tmp_path, caplog):
    """... and otherwise the restart switch's run is a plain one's (the restart case of
    test_bsp_with_unequal_batches_equals_single_process_sgd_across_a_switch): 2 workers
    with batch sizes (5, 11), every BSP update one SGD step on the 16 examples, weights,
    momentum and step counter continued exactly through the switch (new task processes,
    data iterators restarted)."""
    made = []

    def factory(*args, **kw):
        made.append(_DiesAfterListening(*args, **kw))
        made[-1].doomed = len(made) == 2   # the switch's generation
        return made[-1]

    ref = _reference(tiny_problem, [0, 1, 2, 0, 1, 2], (5, 11))
    engine = _engine(tiny_problem, tmp_path, cluster_factory=factory)
    phases = [Phase(BSP(FixedSizer([5, 11])), until=0.5), Phase(BSP(FixedSizer([5, 11])), switch="restart")]
    summary = engine.run(phases, total_samples=6 * 16)   # (TensorFlow's connect waited for ever on it)
    assert summary["updates"] == 6 and len(made) == 3
    assert [r.levelname for r in caplog.records if "a task did not answer" in r.getMessage()] == ["WARNING"]
    for got, want in zip(engine.final_weights(), ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert summary["samples"] == 96
    assert summary["optimizer_iterations"] == 6  # the step counter continued through the switch
    sw = summary["switches"][0]
    assert sw["method"] == "restart" and sw["updates"] == 3
    recs = _records(tmp_path)
    assert sorted({r["batch_size"] for r in recs}) == [5, 11]
    assert all(r["mode"] == "aggregate" and r["protocol"] == "bsp" for r in recs)


@pytest.mark.parametrize("switch", ["hot"])   # (a restart switch's: in the test above, and the momentum one's)
def test_bsp_with_unequal_batches_equals_single_process_sgd_across_a_switch(tiny_problem, tmp_path, switch):
    """2 workers with batch sizes (5, 11): every BSP update equals one SGD step on the 16
    examples (LB-BSP eq. 8), through a hot or a restart switch: weights, momentum and
    step counter continue exactly (new task processes, data iterators restart). The
    restart switch's run: test_a_task_that_dies_while_a_restart_switch_connects_... (and
    its 2 clusters: test_a_policys_momentum_is_the_optimizers_...)."""
    ref = _reference(tiny_problem, [0, 1, 2, 3, 4, 5] if switch == "hot" else [0, 1, 2, 0, 1, 2], (5, 11))
    engine = _engine(tiny_problem, tmp_path)
    phases = [Phase(BSP(FixedSizer([5, 11])), until=0.5), Phase(BSP(FixedSizer([5, 11])), switch=switch)]
    summary = engine.run(phases, total_samples=6 * 16)
    assert summary["updates"] == 6 and summary["samples"] == 96
    assert summary["optimizer_iterations"] == 6  # the step counter continued through the switch
    for got, want in zip(engine.final_weights(), ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    sw = summary["switches"][0]
    assert sw["method"] == switch and sw["updates"] == 3
    assert len(engine.lifecycle.clusters) == (2 if switch == "restart" else 1)
    recs = _records(tmp_path)
    assert sorted({r["batch_size"] for r in recs}) == [5, 11]
    assert all(r["mode"] == "aggregate" and r["protocol"] == "bsp" for r in recs)


class _MomentumBSP(BSP):
    """BSP whose start sets the optimizer's momentum (as auto does at its moves)."""

    def start(self, view):
        return dataclasses.replace(super().start(view), momentum=0.5)


def test_a_policys_momentum_is_the_optimizers_from_its_decision_on_and_a_restarts_new_tasks_keep_it(
        tiny_problem, tmp_path):
    """A policy's decision sets momentum 0.5 (the job's is 0.9); a restart switch then
    starts new tasks under a phase that sets none: every one of the 6 updates equals
    single-process SGD at momentum 0.5 (the new tasks keep the momentum in force, not the
    optimizer's)."""
    x, y, model_fn, _, loss_fn = tiny_problem
    ref = _reference((x, y, model_fn, lambda: keras.optimizers.SGD(0.1, momentum=0.5), loss_fn),
                     [0, 1, 2, 0, 1, 2], (5, 11))
    engine = _engine(tiny_problem, tmp_path)
    phases = [Phase(_MomentumBSP(FixedSizer([5, 11])), until=0.5), Phase(BSP(FixedSizer([5, 11])), switch="restart")]
    summary = engine.run(phases, total_samples=6 * 16)
    assert summary["updates"] == 6 and len(engine.lifecycle.clusters) == 2
    for got, want in zip(engine.final_weights(), ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ps_rounds", [True, False])
def test_bsp_with_adam_and_a_decaying_schedule_equals_single_process_adam_across_a_restart(tiny_problem, tmp_path,
                                                                                         ps_rounds):
    """Stateful optimizer + schedule: BSP with Adam, ExponentialDecay and batch sizes
    (5, 11) gives the weights of single-process Adam on the 16 examples (its moments and
    step count restored through a restart switch), and each push records the rate of the
    update it joined: the schedule at that update. The same whether the PS closes the
    rounds itself (every round of both phases) or the coordinator does."""
    import tf_keras as keras

    def schedule():
        return keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)

    problem = (*tiny_problem[:3], lambda: keras.optimizers.Adam(schedule()), tiny_problem[4])
    ref = _reference(problem, [0, 1, 2, 0, 1, 2], (5, 11))
    engine = _engine(problem, tmp_path, ps_rounds=ps_rounds)
    phases = [Phase(BSP(FixedSizer([5, 11])), until=0.5), Phase(BSP(FixedSizer([5, 11])), switch="restart")]
    summary = engine.run(phases, total_samples=6 * 16)
    assert summary["optimizer_iterations"] == 6 and summary["ps_rounds"] == (6 if ps_rounds else 0)
    for got, want in zip(engine.final_weights(), ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    recs = _records(tmp_path)
    assert len(recs) == 12
    for r in recs:  # "updates": updates done before the one this push joins
        assert r["lr"] == pytest.approx(float(schedule()(r["updates"])), rel=1e-6)
    assert len({r["lr"] for r in recs}) == 6


class _Decay(keras.optimizers.schedules.LearningRateSchedule):
    """0.05 x 0.8^step, a user's schedule that loops and branches in Python on the step
    (converted by autograph where the engine calls it)."""

    def __call__(self, step):
        rate = tf.constant(0.05)
        for _ in tf.range(tf.cast(step, tf.int32)):
            rate = rate * 0.8
        if step < 0:
            rate = rate * 0.0
        return rate

    def get_config(self):
        return {}


def test_a_schedule_is_followed_on_the_apply_path_and_through_a_hot_switch(tiny_problem, tmp_path):
    """BSP (x2 rate, aggregated, rounds the PS closes) then ASP (applied on arrival) by a
    hot switch, with a user's rate schedule that decays every update: each BSP push
    records 2 x schedule(its update), and the ASP pushes, applied in whatever order they
    reach the PS, record schedule(k) for the update numbers k that follow the switch."""
    problem = (*tiny_problem[:3], lambda: keras.optimizers.SGD(_Decay(), momentum=0.5), tiny_problem[4])
    engine = _engine(problem, tmp_path)
    phases = [Phase(BSP(FixedSizer([8, 8])), until=0.5, lr_scale=2.0),
              Phase(ASP(FixedSizer([8, 8])), switch="hot", lr_scale=1.0)]
    summary = engine.run(phases, total_samples=8 * 16)
    recs = _records(tmp_path)
    bsp = [r for r in recs if r["protocol"] == "bsp"]
    asp = [r for r in recs if r["protocol"] == "asp"]
    assert len(bsp) == 8 and len(asp) >= 8  # ASP's steps in flight at the end count too
    assert summary["optimizer_iterations"] == summary["updates"] == 4 + len(asp)
    for r in bsp:
        assert r["lr"] == pytest.approx(2 * float(_Decay()(r["updates"])), rel=1e-6)
    # each ASP update ran at schedule(k) for an update number k after the switch; two pushes
    # applied at the same moment on the PS may both read k (asynchronous updates are not
    # serialised, as under TF's own apply_gradients): a rate is used twice, none is invented
    rates = {k: float(_Decay()(k)) for k in range(4, 4 + len(asp))}
    for r in asp:
        assert any(r["lr"] == pytest.approx(v, rel=1e-6) for v in rates.values()), r["lr"]
    used = {k for k, v in rates.items() if any(r["lr"] == pytest.approx(v, rel=1e-6) for r in asp)}
    assert len(used) >= len(asp) - 2 and min(used) == 4, sorted(used)


def test_an_asynchronous_phase_whose_work_a_round_already_did_grants_nothing_and_the_plan_goes_on(tiny_problem,
                                                                                                 tmp_path):
    """BSP's last round (16 samples) carries the run past the end of the short ASP phase
    after it: that phase has no work left, so it grants no step (none is cut short: the
    engine grants no asynchronous step a phase has no room for) and the BSP after it
    trains the rest."""
    engine = _engine(tiny_problem, tmp_path)
    phases = [Phase(BSP(FixedSizer([8, 8])), until=0.5), Phase(ASP(FixedSizer([8, 8])), until=0.52, switch="hot"),
              Phase(BSP(FixedSizer([8, 8])), switch="hot")]
    summary = engine.run(phases, total_samples=170)   # BSP to 85 (96 in rounds of 16), ASP to 88
    protocols = [r["protocol"] for r in _records(tmp_path)]
    assert "asp" not in protocols and protocols.count("bsp") == 22 and summary["samples"] == 176


@pytest.mark.parametrize("data", ["two outputs from arrays", "dataset factory"])
def test_float_targets_stay_floats_and_bsp_regression_equals_the_single_process_reference(tiny_problem, tmp_path,
                                                                                         data):
    """A regression target of 0.49 trains as 0.49 (labels keep their dtype; they were cast
    to int64), BSP with batch sizes (5, 11) equal to single-process SGD on the 16 rows: from
    arrays with a second, classification head beside it (the labels a dict of a float and
    an integer array: tests/two_heads.py), and from a tf.data factory that each worker
    reads itself."""
    import tf_keras as keras

    from tfsync import DatasetFactory

    if data == "two outputs from arrays":
        import two_heads

        x, y = two_heads.data()
        problem = (x, y, two_heads.build, lambda: keras.optimizers.SGD(0.1), two_heads.loss)
        assert y["value"].dtype == np.float32 and y["kind"].dtype == np.int64
    else:
        x = tiny_problem[0]
        y = (x @ np.linspace(-1, 1, 5, dtype=np.float32) * 0.3 + 0.49).astype(np.float32)

        def model_fn():
            return keras.Sequential([keras.layers.Input((5,)), keras.layers.Dense(
                1, kernel_initializer=keras.initializers.GlorotUniform(seed=1))])

        def loss_fn(targets, predictions):
            return keras.losses.mean_squared_error(tf.reshape(targets, (-1, 1)), predictions)

        problem = (x, y, model_fn, lambda: keras.optimizers.SGD(0.1), loss_fn)
    ref = _reference(problem, [0, 1, 2, 3], (5, 11))
    if data == "dataset factory":
        factory = DatasetFactory(lambda context: tf.data.Dataset.from_tensor_slices((x, y)), examples=len(y))
        problem = (factory, None, *problem[2:])
    engine = _engine(problem, tmp_path)
    assert engine.run([Phase(BSP(FixedSizer([5, 11])))], total_samples=4 * 16)["updates"] == 4
    for got, want in zip(engine.final_weights(), ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ssp_never_exceeds_the_staleness_bound(tiny_problem, tmp_path):
    """Worker 1 is made slow (a 32x larger batch); no worker may start step c+s+1 before
    every worker finished step c, checked on the worker-side clocks of every step."""
    x, y, model_fn, optimizer_fn, loss_fn = tiny_problem
    big_x = np.repeat(x, 64, axis=0)
    big_y = np.repeat(y, 64, axis=0)
    setup = TrainSetup(model_fn, optimizer_fn, loss_fn, big_x, big_y, max_batch_size=2048, shuffle=False)
    s = 1
    engine = Engine(setup, run_dir=str(tmp_path), tensorboard=False, timeout_s=120)
    engine.run([Phase(SSP(staleness=s, sizer=FixedSizer([4, 2048])))], total_samples=40 * 2052)
    recs = _records(tmp_path)
    ends = {w: sorted(r["end"] for r in recs if r["worker"] == w) for w in (0, 1)}
    lead = 0
    for r in recs:
        other = 1 - r["worker"]
        done_by_other = sum(1 for e in ends[other] if e <= r["start"])
        assert r["step"] <= done_by_other + s + 1, f"step {r['step']} of worker {r['worker']} broke the bound"
        lead = max(lead, r["step"] - 1 - done_by_other)
    assert lead == s, "the fast worker never ran ahead: the test did not exercise the bound"


def test_a_worker_lost_while_the_run_drains_its_last_steps_ends_the_run(tiny_problem, tmp_path, monkeypatch):
    """The workload is done and the engine waits for the steps still running when a worker
    dies (CI killed one just then): the recovery restarts the cluster, nothing is left in
    flight, and the run ends at once with its final checkpoint (it waited for train.timeout_s,
    then failed). Worker 1 is stopped at one of its pushes within twelve steps of the end,
    granted a step there (which it cannot run, stopped) and killed a second later, so its
    death is seen while the engine drains. The engine grants ASP no step past the workload
    (``Ledger.within``); here it grants as a round's grants do, all of them, so that steps
    run on after the workload is done, at depth 4. (The grant at the stop is the test's
    own: ASP's top-up alone left worker 1 nothing in flight on a loaded machine, where it
    ran every step it held before the coordinator saw the push it was stopped at.)"""
    import signal
    import threading

    from tfsync.policy.ledger import Ledger

    monkeypatch.setattr(Ledger, "within", lambda self, decision, end_samples: decision)
    total, engine = 320, None

    class StopThenKillWorker1(ASP):
        fired = False

        def on_push(self, push, view):
            decision = super().on_push(push, view)
            if not self.fired and push.worker == 1 and view.samples >= total - 96:
                self.fired, pid = True, engine.lifecycle.task_pid("worker", 1)
                os.kill(pid, signal.SIGSTOP)
                threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
                if not any(g.worker == 1 for g in decision.grants):   # a step it cannot run: in flight at the end
                    decision = dataclasses.replace(decision, grants=(*decision.grants, Grant(1, 8)))
            return decision

    # a step timeout longer than the test's own (pytest's): ending by it would fail the test
    engine = _engine(tiny_problem, tmp_path, timeout_s=3600)
    summary = engine.run([Phase(StopThenKillWorker1(FixedSizer([8, 8]), depth=4))], total_samples=total)
    assert summary["samples"] >= total and [r["task"] for r in summary["recoveries"]] == ["worker:1"]
    assert summary["checkpoints"][-1]["why"] == "final"


def test_a_ps_that_dies_during_a_periodic_checkpoint_is_recovered(tiny_problem, tmp_path, monkeypatch):
    """The PS is killed just as a periodic checkpoint starts (CI: the save raised
    UnavailableError "Socket closed" and the run failed): the engine restarts the cluster
    from the checkpoint before and finishes. The same run's first generation: a loop's
    first call instantiates the PS's function on the coordinator, which TF 2.21 does
    unsafely beside another call (tfsync.engine.links.Links.start): so no loop starts
    before the one started before it has made its first call."""
    import signal

    import psutil

    from tfsync.engine import links
    from tfsync.engine.checkpoints import CheckpointDir

    events = []
    run, arrived, answered = links.Links._run, links.Links._arrived, links.Links._answered

    def run_(self, loop, outgoing):
        events.append("start")
        return run(self, loop, outgoing)

    def arrived_(self, number, rows):
        if number < 0:
            events.append("first call")
        return arrived(self, number, rows)

    def answered_(self, done):
        if self._priming:
            events.append("first call")
        return answered(self, done)

    monkeypatch.setattr(links.Links, "_run", run_)
    monkeypatch.setattr(links.Links, "_arrived", arrived_)
    monkeypatch.setattr(links.Links, "_answered", answered_)

    engine, saves, real_save = None, [], CheckpointDir.save

    def save_after_killing_the_ps(self, generation, number, state=None):
        saves.append(number)
        if len(saves) == 2:  # the second periodic checkpoint: one exists to restore from
            ps = psutil.Process(engine.lifecycle.task_pid("ps", 0))
            ps.send_signal(signal.SIGKILL)
            ps.wait(10)
        return real_save(self, generation, number, state)

    monkeypatch.setattr(CheckpointDir, "save", save_after_killing_the_ps)
    engine = _engine(tiny_problem, tmp_path, checkpoint_every=4)
    summary = engine.run([Phase(BSP(FixedSizer([8, 8])))], total_samples=320)
    assert [r["task"] for r in summary["recoveries"]] == ["ps:0"]
    assert summary["samples"] >= 320
    loops = links.RECEIVERS + 1
    assert events[:2 * loops] == ["start", "first call"] * loops, events


def test_asp_applies_every_push_and_records_each_step(tiny_problem, tmp_path, monkeypatch):
    """... through closures of 4 steps each: more steps than the standing closures hold, so
    closures end and are replaced, and no step is lost or counted twice across them. ASP
    grants steps ahead (up to 64 a worker on a fast model), but none past the update the
    next periodic checkpoint is due at: each is taken after exactly ``checkpoint_every``
    more updates, with nothing in flight to wait for."""
    monkeypatch.setattr(step, "STEPS_PER_CLOSURE", 4)
    scheduled, schedule = [], Lifecycle._schedule
    monkeypatch.setattr(Lifecycle, "_schedule", lambda lc, *a: (scheduled.append(1), schedule(lc, *a))[1])
    traces, close = [], Generation.close
    monkeypatch.setattr(Generation, "close", lambda gen: (traces.append(gen.step_fn.experimental_get_tracing_count()),
                                                          close(gen))[1])
    engine = _engine(tiny_problem, tmp_path, checkpoint_every=6)
    summary = engine.run([Phase(ASP(FixedSizer([8, 16])))], total_samples=400)
    assert traces == [1]   # the closures ran the warm-up's trace of the step, not a second one
    periodic = [c["updates"] for c in summary["checkpoints"] if c["why"] == "periodic"]
    assert periodic == list(range(6, summary["updates"], 6)), periodic
    recs = _records(tmp_path)
    assert summary["updates"] == summary["pushes"] == len(recs)
    assert 400 <= summary["samples"] < 400 + 16   # ASP grants 8 ahead, none the workload has no room for
    assert {r["worker"] for r in recs} == {0, 1}
    for r in recs:
        assert r["end"] > r["start"] and r["samples_per_s"] > 0 and np.isfinite(r["loss"])
        assert r["batch_size"] == (8 if r["worker"] == 0 else 16)
    steps = {w: [r["step"] for r in recs if r["worker"] == w] for w in (0, 1)}
    assert all(v == list(range(1, len(v) + 1)) for v in steps.values())
    assert len(scheduled) > 2 * STANDING_PER_WORKER   # closures ended (4 steps each) and were replaced
    assert (tmp_path / "summary.json").exists() and list((tmp_path / "checkpoints").glob("ckpt-*.index"))


def test_a_step_that_fails_midway_through_a_closure_ends_the_run_at_once_with_its_error(tiny_problem, tmp_path):
    """A user's loss that raises on the 21st input batch (a NaN example there): a closure
    runs many steps, and the one that fails ends the run with TF's error in one line, at
    once (not after ``timeout_s``), with the steps before it counted."""
    x, y, model_fn, optimizer_fn, _ = tiny_problem
    x = np.repeat(x, 8, axis=0)
    y = np.repeat(y, 8, axis=0)
    x[20 * M] = np.nan

    def loss_fn(labels, logits):
        losses = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        return tf.debugging.check_numerics(losses, "the loss")

    engine = _engine((x, y, model_fn, optimizer_fn, loss_fn), tmp_path, timeout_s=3600)   # (longer than pytest's)
    with pytest.raises(EngineError, match=r"a training step failed: InvalidArgumentError: the loss : Tensor had NaN values$"):
        engine.run([Phase(ASP(FixedSizer([M, M])))], total_samples=len(y) * 4)
    assert 1 <= len(_records(tmp_path)) < len(y) * 4 // M


def test_an_error_in_the_users_code_while_tracing_names_its_file_and_line(tiny_problem, tmp_path):
    """The step is traced with autograph converting only the user's code: a mistake there
    is told as autograph tells it under model.fit, by the user's file and line."""
    def loss_fn(labels, logits):
        losses = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        return losses * undefined_weight  # noqa: F821 - the user's mistake

    engine = _engine((*tiny_problem[:4], loss_fn), tmp_path)
    told = r"(?s)in user code:.*test_engine\.py\", line \d+, in loss_fn.*undefined_weight"
    with pytest.raises(NameError, match=told):
        engine.run([Phase(ASP(FixedSizer([M, M])))], total_samples=4 * M)


def test_a_lost_worker_is_recovered_once_then_ends_the_run_with_a_clear_error_and_no_orphans(tiny_problem,
                                                                                          tmp_path):
    engine = _engine(tiny_problem, tmp_path)
    engine.lifecycle.max_recoveries = 1  # per task: the second loss of worker 1 ends the run
    killed = []

    class Killer(Callback):
        def on_push(self, eng, push, record):
            # The second kill waits for the first recovery: on a slow machine worker 0 can push
            # 20 more steps before the first loss is noticed, and a kill of the dead task is no loss.
            if eng.ledger.pushes >= 20 * (len(killed) + 1) and len(eng.runlog.recoveries) == len(killed) < 2:
                eng.generation.cluster.kill_task("worker", 1)
                killed.append(eng.generation.cluster.procs[("worker", 1)].pid)

    engine.callbacks.append(Killer())
    with pytest.raises(EngineError, match=r"task worker:1 died"):
        engine.run([Phase(ASP())], total_samples=3000 * M)  # ends, so a missed loss fails in seconds
    assert len(killed) == 2
    assert [e["task"] for e in engine.runlog.recoveries] == ["worker:1"]  # the first loss was recovered
    assert engine.runlog.checkpoints[-1]["why"] == "worker_lost"
    for cluster in engine.lifecycle.clusters:
        assert all(p.poll() is not None for p in cluster.procs.values()), "a task process outlived the engine"


def test_pssp_then_elastic_bsp_on_real_tasks(tiny_problem, tmp_path):
    """The simulator's FluentPS and ElasticBSP policy objects drive the real engine: a
    PSSP phase with lazy pulls, then ElasticBSP supersteps whose last steps aggregate."""
    from tfsync.policy import PSSP, ElasticBSP

    engine = _engine(tiny_problem, tmp_path)
    pssp = PSSP(staleness=0, probability=1.0, sizer=FixedSizer([4, 16]), seed=1)
    elastic = ElasticBSP(lookahead=6, sizer=FixedSizer([4, 16]))
    summary = engine.run([Phase(pssp, until=0.4), Phase(elastic)], total_samples=1200)
    assert summary["samples"] >= 1200
    stats = [t["stats"] for t in summary["timeline"]]
    assert stats[0]["delayed_pulls"] > 0 and stats[1]["barriers"] >= 3
    recs = _records(tmp_path)
    el = [r for r in recs if r["protocol"] == "elastic_bsp"]
    # each superstep ends in an aggregated push; applied ones before it only where ElasticBSP
    # gave a worker more than one step, which depends on the measured speeds (a loaded CI
    # run gave every worker one step a superstep: only "aggregate")
    assert "aggregate" in {r["mode"] for r in el} <= {"apply", "aggregate"}
    rounds = sorted({r["round"] for r in el})
    assert len(rounds) >= 3
    for rnd in rounds[:-1]:  # a superstep: each worker ends its steps with one aggregated push
        # (the last one may be cut short by the end of the workload)
        for w in (0, 1):
            steps = [r for r in el if r["round"] == rnd and r["worker"] == w]
            assert [r["mode"] for r in steps] == ["apply"] * (len(steps) - 1) + ["aggregate"]


def test_shuffled_workers_read_different_examples_with_a_global_seed(tiny_problem, tmp_path):
    """tf.random.set_seed (as tfsync run sets job.seed) fixes the shuffle's seed where the
    input graph is traced, on the coordinator: without an offset per worker both workers
    read the same batches, and every BSP round averaged one gradient twice."""
    x, y, model_fn, optimizer_fn, loss_fn = tiny_problem
    tf.random.set_seed(0)
    try:
        setup = TrainSetup(model_fn, optimizer_fn, loss_fn, x, y, max_batch_size=8, shuffle=True)
        engine = Engine(setup, run_dir=str(tmp_path), tensorboard=False, timeout_s=120)
        engine.run([Phase(BSP(FixedSizer([8, 8])))], total_samples=12 * 16)
    finally:
        tf.random.set_seed(None)  # the other tests' randomness as before
    rounds = {}
    for r in _records(tmp_path):
        rounds.setdefault(r["round"], []).append(r["loss"])
    pairs = [v for v in rounds.values() if len(v) == 2]
    assert len(pairs) >= 10 and sum(a == b for a, b in pairs) <= 1, pairs


def test_regularization_losses_and_python_control_flow_are_trained_as_model_fit_trains_them(tiny_problem,
                                                                                             tmp_path):
    """A kernel_regularizer's loss (model.losses) is added to every step's loss, as
    model.fit adds it (it was left out in silence); a layer, a loss and an optimizer's
    update_step that branch and loop in Python on tensors are converted by autograph (the
    engine's own step is not). BSP (5, 11) equals single-process SGD on the regularized loss."""
    import tf_keras as keras

    x, y, _, _, loss_fn = tiny_problem

    class Branchy(keras.layers.Layer):
        def call(self, h):   # (each example alone: a worker's batch gives what the union gives)
            for _ in tf.range(2):
                h = h - 0.5
            if tf.shape(h)[-1] > 2:
                return h * 2.0
            return h

    def branchy_loss(labels, logits):
        per_example = loss_fn(labels, logits)
        if tf.reduce_any(tf.math.is_nan(per_example)):
            per_example = tf.zeros_like(per_example)
        return per_example

    class FiniteSGD(keras.optimizers.SGD):
        def update_step(self, gradient, variable):
            if tf.reduce_all(tf.math.is_finite(gradient)):
                keras.optimizers.SGD.update_step(self, gradient, variable)

    def model_fn():
        return keras.Sequential([keras.layers.Input((5,)), keras.layers.Dense(
            3, kernel_initializer=keras.initializers.GlorotUniform(seed=1),
            kernel_regularizer=keras.regularizers.L2(0.5)), Branchy()])

    problem = (x, y, model_fn, lambda: FiniteSGD(0.1), branchy_loss)
    ref = _reference(problem, [0, 1, 2, 3], (5, 11))
    engine = _engine(problem, tmp_path)
    engine.run([Phase(BSP(FixedSizer([5, 11])))], total_samples=4 * 16)
    for got, want in zip(engine.final_weights(), ref):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ps_rounds_halt_for_a_command_and_go_on_with_its_batch_sizes(tiny_problem, tmp_path):
    """While the PS closes and opens BSP rounds itself, a manager's batch-sizes command
    stops it after the round in flight; the next rounds run the new sizes (PS-run again),
    every round has one push of each worker with the sizes of its time, nothing is lost."""
    from tfsync.engine.commands import Command, Controller

    class AfterSixPushes(Controller):
        results = []

        def commands(self):
            if engine.ledger.pushes >= 6 and not self.results:
                return [Command("c1", "batch_sizes", batch_sizes=(3, 7))]
            return []

        def result(self, result):
            self.results.append(result)

    controller = AfterSixPushes()
    engine = _engine(tiny_problem, tmp_path, controller=controller)
    total = 16 * 4 + 10 * 40   # rounds enough that the PS is still at it when the command comes, however fast
    summary = engine.run([Phase(BSP(FixedSizer([5, 11])))], total_samples=total)
    assert [r.ok for r in controller.results] == [True]
    rounds = {}
    for r in _records(tmp_path):
        rounds.setdefault(r["round"], []).append((r["worker"], r["batch_size"]))
    assert all(sorted(pushes) in ([(0, 5), (1, 11)], [(0, 3), (1, 7)]) for pushes in rounds.values()), rounds
    new = [k for k, pushes in rounds.items() if sorted(pushes) == [(0, 3), (1, 7)]]
    # (>= 2, not more: on a loaded machine the PS runs rounds ahead until the command halts it)
    assert len(new) >= 2 and new == list(range(min(new), max(rounds) + 1))   # from one round on, to the end
    assert summary["samples"] == sum(b for pushes in rounds.values() for _, b in pushes) >= total
    assert summary["updates"] == len(rounds) == summary["ps_rounds"]


def test_ps_rounds_stop_at_each_periodic_checkpoints_update(tiny_problem, tmp_path):
    """checkpoint_every = 3 while the PS closes the rounds: it runs them up to the update a
    checkpoint is due, the engine saves there and asks for the next ones; every
    checkpoint at its multiple of 3, nothing lost."""
    engine = _engine(tiny_problem, tmp_path, checkpoint_every=3)
    summary = engine.run([Phase(BSP(FixedSizer([5, 11])))], total_samples=12 * 16)
    assert [(c["why"], c["updates"]) for c in summary["checkpoints"]] == \
        [("periodic", 3), ("periodic", 6), ("periodic", 9), ("final", 12)]
    assert summary["updates"] == 12 and summary["ps_rounds"] >= 8   # (the round each pilot starts from included)


def test_ps_rounds_take_the_batch_sizes_lbbsp_decides_at_each_rounds_end(tiny_problem, tmp_path, caplog):
    """LB-BSP on PS-run rounds: the policy sees every push and sizes each round's end
    (here scripted: 5 + 11 and 11 + 5 by turns); the PS grants the new sizes from the next
    round it opens. Every round is PS-run, keeps the total, and the weights equal
    single-process SGD on each round's sizes as recorded."""
    from tfsync.policy.lbbsp import LBBSP, LBBSPSizer

    class ByTurns(LBBSPSizer):
        calls = 0

        def sizes(self, view):
            ByTurns.calls += 1
            self.current = {0: 5, 1: 11} if self.calls % 2 else {0: 11, 1: 5}
            return self.current

    engine = _engine(tiny_problem, tmp_path)
    summary = engine.run([Phase(LBBSP(sizer=ByTurns(8)))], total_samples=24 * 16)
    rounds = {}
    for r in _records(tmp_path):
        rounds.setdefault(r["round"], {})[r["worker"]] = r["batch_size"]
    sizes = [(rounds[k][0], rounds[k][1]) for k in sorted(rounds)]
    # (how many rounds pass before new sizes land on the PS depends on the machine's load)
    assert len(sizes) == 24 and set(sizes) == {(5, 11), (11, 5)}, sizes
    assert summary["updates"] == summary["ps_rounds"] == 24 and summary["samples"] == 24 * 16
    assert ByTurns.calls >= 23   # the first round's grant, then every round's end but the last
    assert not [r for r in caplog.records if "the PS closed a round" in r.getMessage()]
    assert tuple(engine.ledger.batch_sizes) == sizes[-1]   # the ledger mirrored the sizes the PS granted
    for got, want in zip(engine.final_weights(), _reference(tiny_problem, range(24), sizes)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_decision_the_steady_round_does_not_make_halts_the_ps_rounds_and_is_carried_out(tiny_problem, tmp_path,
                                                                                            caplog):
    """A policy steady while it sees nothing (a straggler policy before a detection) has
    its BSP rounds run by the PS; its decision to leave them (here ASP at half the rate,
    after 6 updates) halts them and is carried out once the round in flight has closed:
    every later push applied alone at the new rate, nothing lost, no warning."""
    from tfsync.policy.base import Decision

    class Leaves(BSP):
        left, asp = False, ASP()

        def steady_round(self, view):   # (BSP's own is for BSP itself)
            return None if self.left else Decision(self.grants_for(sorted(view.members), view), barrier=True)

        def start(self, view):   # (after the periodic checkpoint)
            return Decision(self.asp.start(view).grants, lr_scale=0.5) if self.left else super().start(view)

        def on_push(self, push, view):
            if not self.left and view.updates >= 6:
                self.left = True
                return Decision(self.asp.start(view).grants, barrier=view.pending > 0, lr_scale=0.5)
            return self.asp.on_push(push, view) if self.left else super().on_push(push, view)

    # (a periodic checkpoint at 10 ends the PS's first rounds there: unbounded, under load
    # it ran all 30 before the coordinator had seen the 6th, and ASP had nothing left)
    engine = _engine(tiny_problem, tmp_path, checkpoint_every=10)
    summary = engine.run([Phase(Leaves(FixedSizer([5, 11])))], total_samples=30 * 16)
    records = _records(tmp_path)
    modes = [r["mode"] for r in records]
    first = modes.index("apply")
    assert summary["ps_rounds"] >= 5 and set(modes[:first]) == {"aggregate"} and set(modes[first:]) == {"apply"}
    rates = {r["mode"]: r["lr"] for r in records}
    assert rates["apply"] == pytest.approx(rates["aggregate"] * 0.5)
    assert summary["samples"] == sum(r["batch_size"] for r in records) >= 30 * 16
    assert not [r for r in caplog.records if "steady round" in r.getMessage()]


def test_an_undo_puts_back_the_weights_and_optimizer_state_kept_and_sets_the_pushes_since_aside(tiny_problem,
                                                                                                  tmp_path):
    """BSP rounds of sizes (5, 11); after the third, the weights are kept and each worker
    runs one ASP step (applied alone: the weights and the momentum move); once both are
    in, the next BSP round is granted with an undo (as auto after a failed ASP trial). The
    6 updates counted equal single-process SGD with momentum on input blocks 0-2 and 4-6
    (block 3 went to the undone steps; the input goes on), the step counter says 6, and
    the two ASP pushes are in ``metrics.discarded.jsonl``, not ``metrics.jsonl``."""
    from tfsync.policy import Decision, PushMode

    class KeepsThenUndoes(BSP):
        stage = "bsp"

        def on_push(self, push, view):
            if self.stage == "bsp" and not view.in_flight and view.updates == 2:
                self.stage = "asp"
                return Decision((Grant(0, 5, PushMode.APPLY), Grant(1, 11, PushMode.APPLY)), barrier=True,
                                keep_weights=True)
            if self.stage == "asp":
                if view.in_flight:
                    return NOTHING
                self.stage = "after"
                return Decision(self.grants_for(sorted(view.members), view), undo=True)
            return super().on_push(push, view)

    engine = _engine(tiny_problem, tmp_path)
    summary = engine.run([Phase(KeepsThenUndoes(FixedSizer([5, 11])))], total_samples=6 * 16)
    assert (summary["updates"], summary["samples"], summary["optimizer_iterations"]) == (6, 96, 6)
    for got, want in zip(engine.final_weights(), _reference(tiny_problem, [0, 1, 2, 4, 5, 6], (5, 11))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    records = _records(tmp_path)
    assert len(records) == 12 and {r["mode"] for r in records} == {"aggregate"}
    with open(tmp_path / "metrics.discarded.jsonl") as f:
        set_aside = [json.loads(line) for line in f]
    assert [(r["mode"], r["batch_size"], r["discarded"]) for r in sorted(set_aside, key=lambda r: r["worker"])] == [
        ("apply", 5, "undo"), ("apply", 11, "undo")]


def test_the_checkpoint_guard_names_each_weight_that_holds_nan_or_inf(tiny_problem, tmp_path):
    """What keeps a diverged model out of the checkpoints (``Loop.checkpoint`` refuses
    to save when it finds one): every weight with a NaN or an infinity, by name, checked
    where it lives in one call."""
    engine = _engine(tiny_problem, tmp_path)
    try:
        engine.lifecycle.open(engine.lifecycle.launch())
        gen = engine.generation
        weights = gen.model.weights
        assert gen.non_finite() == []
        weights[0].assign(tf.tensor_scatter_nd_update(weights[0], [[0] * len(weights[0].shape)], [float("nan")]))
        weights[-1].assign(tf.fill(weights[-1].shape, float("inf")))
        assert gen.non_finite() == [weights[0].name, weights[-1].name]
        with pytest.raises(EngineError, match=f"the weights are no longer finite after update 0 \\({weights[0].name} "):
            engine.loop.checkpoint("periodic")
    finally:
        engine.close()


def test_records_a_policy_can_wait_for_are_drained_in_batches_and_none_is_lost(tiny_problem, tmp_path):
    """A policy that can wait for its records (``patience``, ASP's) has them drained in
    batches: one drain every ``patience`` seconds takes every row queued meanwhile. Every
    step is still recorded, once and in each worker's order."""
    class Patient(ASP):
        def patience(self, view):
            return 0.3

    engine = _engine(tiny_problem, tmp_path)
    summary = engine.run([Phase(Patient(FixedSizer([8, 8])))], total_samples=2400)
    recs = _records(tmp_path)
    assert summary["pushes"] == len(recs) and summary["samples"] >= 2400
    steps = {w: [r["step"] for r in recs if r["worker"] == w] for w in (0, 1)}
    assert all(v == list(range(1, len(v) + 1)) for v in steps.values())
    assert summary["rows_per_drain"] >= 3, summary["rows_per_drain"]


def test_while_the_ps_runs_the_rounds_their_records_are_drained_in_batches_and_equal_single_process_sgd(
        tiny_problem, tmp_path, monkeypatch):
    """While the PS closes the BSP rounds itself, no round waits for the coordinator, so
    the records wait (``PILOT_LINGER_S``, here 0.3 s) and a drain takes several rounds'
    rows: nothing is lost, every round is PS-run, and the weights are single-process
    SGD's. The summary says the coordinator's CPU while it trained."""
    from tfsync.engine import loop

    monkeypatch.setattr(loop, "PILOT_LINGER_S", 0.3)
    engine = _engine(tiny_problem, tmp_path)
    summary = engine.run([Phase(BSP(FixedSizer([5, 11])))], total_samples=24 * 16)
    recs = _records(tmp_path)
    assert summary["pushes"] == len(recs) == 48 and summary["updates"] == summary["ps_rounds"] == 24
    assert summary["rows_per_drain"] > 3, summary["rows_per_drain"]   # a round: 2 rows and its marker
    for got, want in zip(engine.final_weights(), _reference(tiny_problem, range(24), (5, 11))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    load = summary["coordinator"]
    assert load["cpu_s"] > 0 and load["ms_per_push"] == pytest.approx(1000 * load["cpu_s"] / 48, rel=0.01)
    assert load["cores"] == pytest.approx(load["cpu_s"] / summary["train_s"], rel=0.05)
    assert 0 <= load["batches_waiting"] <= load["batches_waiting_max"] < 48
