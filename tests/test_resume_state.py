"""What a resume takes back from the state beside a checkpoint (tfsync.engine.switching),
and what it leaves: the policy's rate factor and membership go with its state only; a
state that does not fit never stops the resume; a checkpoint never fails for a state."""

import json
from types import SimpleNamespace

import pytest

from tfsync.engine.switching import resume_from, resume_policy
from tfsync.policy import BSP, LBBSP, BatchSizer, Decision, Grant, PushMode
from tfsync.policy.ledger import Ledger

pytestmark = pytest.mark.unit


def _log(workers=3):
    """A run log's parts that resuming uses (tfsync.engine.runlog.RunLog), its events kept."""
    events = []
    return SimpleNamespace(
        ledger=Ledger(workers), events=events,
        recorder=SimpleNamespace(event=lambda kind, **f: events.append((kind, f))),
        event=lambda kind, **f: events.append((kind, f)), rewind=lambda checkpoint, why: None)


def _gen(rates):
    return SimpleNamespace(set_hyper=lambda lr_scale, momentum=None: rates.append(lr_scale))


def _saved(workers=3, policy=None):
    ledger = Ledger(workers)
    ledger.apply(Decision((Grant(0, 8, PushMode.APPLY),), remove={2}, lr_scale=1.0), now=0.0)
    ledger.push(0, 8, PushMode.APPLY, 0, 0, start=0.0, end=1.0, arrival=1.0, loss=0.1)
    return {"ledger": ledger.save_state(), "policy": policy or {}}


def test_a_policy_that_takes_its_state_gets_its_rate_factor_and_members_back():
    lbbsp = LBBSP(batch_size=8)
    log, saved, rates = _log(), _saved(policy=lbbsp.save_state()), []
    log.ledger.restore_state(saved["ledger"])
    log.ledger.lr_scale = 3.0   # the phase's factor, set when the run began
    resume_policy(log, _gen(rates), saved, LBBSP(batch_size=8))
    assert log.ledger.lr_scale == 1.0 and rates == [1.0] and log.ledger.active == {0, 1}


def test_a_fresh_policy_gets_every_worker_and_the_phases_rate_factor():
    log, saved, rates = _log(), _saved(), []
    log.ledger.restore_state(saved["ledger"])
    log.ledger.lr_scale = 3.0
    resume_policy(log, _gen(rates), saved, BSP())   # BSP keeps no state: it starts afresh
    assert log.ledger.lr_scale == 3.0 and rates == [] and log.ledger.active == {0, 1, 2}
    assert log.ledger.clocks == [1, 0, 0]   # the clocks go on all the same


def test_a_state_of_another_worker_count_or_a_damaged_one_leaves_the_clocks_to_start_afresh(tmp_path):
    prefix = tmp_path / "ckpt-4"
    (tmp_path / "ckpt-4.tfsync.json").write_text(json.dumps(_saved(workers=4)))
    log = _log(workers=3)
    assert resume_from(log, {"path": str(prefix), "round": 2}) is None
    assert log.ledger.clocks == [0, 0, 0] and log.ledger.round == 2
    assert any(k == "policy_state" and "4 workers" in f["reason"] for k, f in log.events)
    (tmp_path / "ckpt-4.tfsync.json").write_text("{not json")
    assert resume_from(_log(), {"path": str(prefix)}) is None


def test_a_policy_state_that_is_not_strict_json_is_left_out_of_the_checkpoint():
    from tfsync.engine.loop import Loop

    class Diverged(BSP):
        def save_state(self):
            return {"protocol": "bsp", "version": 1, "weights": [float("inf")]}

    loop = object.__new__(Loop)
    loop.runlog, loop.policy, loop.phase = _log(2), Diverged(), None
    events = loop.runlog.events
    state = loop.save_state()
    assert state["policy"] == {} and json.dumps(state, allow_nan=False)
    assert events and events[0][1]["saved"] is False


def test_what_commands_changed_is_what_a_resumed_phase_runs_unless_the_plan_is_asked_for(tmp_path, capsys, caplog):
    """Issue 32 case 1: a switch to SSP (staleness 2, rate x1) and batch sizes set by hand
    are saved with the checkpoint; resumed, the phase runs them; `--plan` drops them."""
    from tfsync.cli import resumed_changes
    from tfsync.engine.phase import Phase
    from tfsync.engine.switching import carry_changes
    from tfsync.policy import SSP

    changed = {"until": 1.0, "protocol": "ssp", "options": {"staleness": 2}, "lr_scale": 1.0,
               "batch_sizes": [12, 8]}
    prefix = tmp_path / "ckpt-40"
    (tmp_path / "ckpt-40.tfsync.json").write_text(json.dumps({**_saved(2), "changed": changed}))
    assert resumed_changes(str(prefix), plan=True) == {}
    assert "--plan: the job file's plan, not ssp (staleness 2) at learning rate x1 and batch sizes [12, 8]" \
        in capsys.readouterr().err
    assert resumed_changes(str(prefix), plan=False) == changed
    assert "goes on with ssp (staleness 2)" in capsys.readouterr().err

    phase = Phase(LBBSP(batch_size=8), until=1.0, lr_scale=2.0)
    carry_changes(phase, changed, workers=2, max_batch=64)
    assert isinstance(phase.policy, SSP) and phase.policy.staleness == 2 and phase.lr_scale == 1.0
    assert phase.policy.sizer.per_worker == (12, 8)
    assert phase.changed == {k: v for k, v in changed.items() if k != "until"}   # kept by later checkpoints

    # a switch away from LB-BSP sizes as LB-BSP started (as a switch does), not with its sizer;
    # sizes set for another worker count are dropped, not granted to a worker that has none
    phase = Phase(LBBSP(batch_size=8), until=1.0, lr_scale=2.0)
    carry_changes(phase, changed, workers=3, max_batch=64)
    assert isinstance(phase.policy, SSP) and type(phase.policy.sizer) is BatchSizer
    assert phase.policy.sizer.batch_size == 8 and "batch_sizes" not in phase.changed

    # made in a phase that ended elsewhere (the job file's plan changed since): the plan, said
    phase = Phase(LBBSP(batch_size=8), until=0.5, lr_scale=2.0)
    with caplog.at_level("WARNING", logger="tfsync.engine.switching"):
        carry_changes(phase, changed, workers=2, max_batch=64)
    assert isinstance(phase.policy, LBBSP) and phase.lr_scale == 2.0 and phase.changed == {}
    assert "was for a phase ending at 1.0 of the workload; this plan's phase there ends at 0.5" in caplog.text
