"""Between phases: drain, switch hot (same tasks) or by restart (checkpoint, new tasks,
restore), set the phase's rate factor and momentum, and hand what the old policy learned
to a new one of its kind (state saved beside checkpoints: tfsync.engine.checkpoints).

The engine's loop carries a switch out (``Loop.switch``); what is here works on the values
it is given: the ledger and generation a phase's rate is set on (``set_config``), the run
log a policy's state is handed over through (``hand_over``, ``resume_*``), a phase as the
commands of an earlier run left it (``carry_changes``)."""

from __future__ import annotations

import logging
import time

from .. import policy as policies
from ..policy.base import BatchSizer, Decision
from .checkpoints import load_state

logger = logging.getLogger(__name__)


def switch_event(index: int, old: str, phase, by: str, ledger, seconds: dict) -> dict:
    """The ``switch`` event the run log records: from policy ``old`` to ``phase``'s (the
    ``index``-th phase begun), ``by`` whom (the job's "plan" or a "command"), the counts of
    ``ledger`` then, and the ``seconds`` its parts took (``drain_s``, ``switch_s``,
    ``overhead_s``, and a restart's ``save_s``, ``stop_old_s``, ...)."""
    head = {"index": index, "from": old, "to": phase.policy.name, "method": phase.switch, "by": by,
            "samples": ledger.samples, "updates": ledger.updates}
    return {**head, **{k: round(v, 4) for k, v in seconds.items()}}


def set_config(ledger, gen, phase) -> None:
    """The phase's rate factor and momentum (Sync-Switch §IV-C), from now on: in the ledger
    and on generation ``gen``."""
    ledger.lr_scale = phase.lr_scale
    momentum = phase.momentum(0) if callable(phase.momentum) else phase.momentum
    if momentum is not None:
        ledger.momentum = momentum
    gen.set_hyper(lr_scale=phase.lr_scale, momentum=momentum)


def hand_over(runlog, state: dict, policy, why: str) -> bool:
    """Give ``policy`` (fresh, before its start) a saved policy state of the same protocol;
    a state that does not fit it is refused, said in an event of ``runlog``, and the
    policy starts afresh. Returns whether it took the state."""
    if not state or state.get("protocol") != policy.name:
        return False
    try:
        policy.restore_state(state, workers=runlog.ledger.num_workers)
    except ValueError as e:
        logger.warning("%s: %s starts afresh: %s", why, policy.name, e)
        runlog.event("policy_state", protocol=policy.name, restored=False, why=why, reason=str(e))
        return False
    runlog.event("policy_state", protocol=policy.name, restored=True, why=why)
    return True


def resume_from(runlog, resume: dict) -> dict | None:
    """Continue ``runlog`` from an earlier run's checkpoint event ``resume``: the
    counters, and where the checkpoint has the state beside it (and the same number of
    workers), the clocks too. Returns that saved state (its policy part is handed over
    when the phase it was taken in begins: ``resume_policy``), or None."""
    runlog.ledger.round = int(resume.get("round", 0))
    runlog.rewind(resume, "resume")
    runlog.recorder.event("resume", **resume)
    try:
        saved = load_state(resume["path"])
        if saved is None:
            return None
        runlog.ledger.restore_state(saved["ledger"])
    except (KeyError, TypeError, ValueError) as e:   # another worker count, a damaged file: the counters go on
        logger.warning("resume: the clocks start afresh: %s", e)
        runlog.event("policy_state", restored=False, why="resume", reason=f"ledger: {e}")
        return None
    return saved


def resume_policy(runlog, gen, saved: dict, policy) -> None:
    """The resumed phase's policy takes its saved state; with it, the rate factor (set on
    generation ``gen``) and the membership it had (a straggler policy in ASP, a worker it
    had removed). Without it (refused, another protocol) the policy starts afresh: every
    worker a member, the phase's rate factor."""
    ledger = runlog.ledger
    if hand_over(runlog, saved["policy"], policy, "resume"):
        ledger.lr_scale = float(saved["ledger"]["lr_scale"])
        gen.set_hyper(lr_scale=ledger.lr_scale, momentum=ledger.momentum)
    else:
        ledger.apply(Decision(restore=frozenset(range(ledger.num_workers)) - ledger.active), time.time())


def carry_changes(phase, changed: dict, workers: int, max_batch: int) -> None:
    """``phase`` as the commands of an earlier run left it (``Phase.changed``, saved with
    its checkpoint): the protocol a switch chose, with its options and rate factor, and
    batch sizes set by hand (not for another worker count, nor above ``max_batch``, the
    input pipeline's largest); the plan's later phases follow as planned. Not when they
    were made in a phase that ended elsewhere (the job file's plan changed since): a
    warning says so, and the plan applies."""
    if changed.get("until") != phase.until:
        logger.warning("resume: what commands changed (%s) was for a phase ending at %s of the workload; this "
                       "plan's phase there ends at %g (the job file's plan changed): the plan applies",
                       ", ".join(k for k in changed if k != "until"), changed.get("until"), phase.until)
        return
    sizes = changed.get("batch_sizes")
    if sizes is not None and len(sizes) != workers:
        logger.warning("resume: batch sizes %s were set for %d workers, not %d: the plan's sizes apply",
                       sizes, len(sizes), workers)
        sizes = None
    if "protocol" in changed:
        old = phase.policy
        # a self-sizing protocol's sizer is its own; after one, the others size as it started (as a switch does)
        sizer = BatchSizer(old.sizer.batch_size) if old.self_sizing else old.sizer
        new = policies.make(changed["protocol"], sizer, **changed.get("options", {}))
        phase.switched(new, phase.switch, float(changed["lr_scale"]), changed.get("options", {}))
    if sizes is not None and not phase.policy.self_sizing:
        try:
            phase.set_batch_sizes(sizes, max_batch)
        except ValueError as e:
            logger.warning("resume: batch sizes %s not set again: %s; the plan's sizes apply", sizes, e)
