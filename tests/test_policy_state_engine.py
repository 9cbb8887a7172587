"""Policy state beside the checkpoint, on a real cluster: what LB-BSP learned goes on
through a restart switch and through a resume in a new engine, and the ledger (clocks)
continue (tfsync.engine.checkpoints: ``<prefix>.tfsync.json``)."""

import json

import pytest

from tfsync.engine.generation import TrainSetup
from tfsync.engine.engine import Engine
from tfsync.engine.phase import Phase
from tfsync.policy import LBBSP

pytestmark = pytest.mark.cluster

ROUND = 16


def _engine(problem, run_dir):
    x, y, model_fn, optimizer_fn, loss_fn = problem
    setup = TrainSetup(model_fn, optimizer_fn, loss_fn, x, y, max_batch_size=ROUND, shuffle=False)
    return Engine(setup, run_dir=str(run_dir), tensorboard=False, timeout_s=120)


def _lbbsp():
    return LBBSP(batch_size=ROUND // 2, predictor="ema", hi=ROUND)


def _lines(run_dir):
    with open(run_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def test_lbbsp_predictions_go_on_through_a_restart_switch(tiny_problem, tmp_path):
    engine = _engine(tiny_problem, tmp_path)
    engine.run([Phase(_lbbsp(), until=0.5), Phase(_lbbsp(), switch="restart")], total_samples=20 * ROUND)
    lines = _lines(tmp_path)
    assert [(r["why"], r["restored"]) for r in lines if r.get("event") == "policy_state"] == [("switch", True)]
    switch = next(i for i, r in enumerate(lines) if r.get("event") == "switch")
    after = [r for r in lines[switch:] if "worker" in r]
    assert after and all("predicted" in r for r in after[:2])  # a fresh LB-BSP predicts nothing yet


def test_resume_restores_lbbsp_state_and_the_clocks_and_refuses_a_state_that_does_not_fit(tiny_problem, tmp_path):
    first = _engine(tiny_problem, tmp_path)
    done = first.run([Phase(_lbbsp())], total_samples=10 * ROUND)
    checkpoint = first.runlog.checkpoints[-1]
    saved = json.loads(open(checkpoint["path"] + ".tfsync.json").read())
    assert saved["policy"]["protocol"] == "lbbsp" and saved["ledger"]["clocks"] == done["clocks"]

    again = _engine(tiny_problem, tmp_path)
    summary = again.run([Phase(_lbbsp())], total_samples=20 * ROUND, resume=checkpoint)
    lines = _lines(tmp_path)
    resume = max(i for i, r in enumerate(lines) if r.get("event") == "resume")
    assert any(r.get("event") == "policy_state" and r["restored"] for r in lines[resume:])
    after = [r for r in lines[resume:] if "worker" in r]
    assert all("predicted" in r for r in after[:2])
    assert {r["step"] for r in after if r["worker"] == 0} and min(r["step"] for r in after) > 1  # clocks go on
    assert sum(summary["clocks"]) == sum(done["clocks"]) + len(after)

    # a saved state that does not fit is refused and the policy starts afresh: the same
    # checkpoint resumed by LB-BSP of another predictor kind
    other = LBBSP(batch_size=ROUND // 2, predictor="last", hi=ROUND)
    _engine(tiny_problem, tmp_path).run([Phase(other)], total_samples=12 * ROUND, resume=checkpoint)
    refused = [r for r in _lines(tmp_path) if r.get("event") == "policy_state"]
    assert refused and not refused[-1]["restored"] and "predictor" in refused[-1]["reason"]
