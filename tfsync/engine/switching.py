"""Between phases: drain, switch hot (same tasks) or by restart (checkpoint, new tasks,
restore), set the phase's rate factor and momentum, and hand what the old policy learned
to a new one of its kind (state saved beside checkpoints: tfsync.engine.checkpoints)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .. import policy as policies
from ..policy.base import BatchSizer, Decision
from .checkpoints import load_state

if TYPE_CHECKING:
    from .loop import Loop

logger = logging.getLogger(__name__)


def switch(loop: Loop, old, phase, index: int, carry: bool = True, by: str = "plan") -> None:
    """Drain ``old``, switch to ``phase``; with ``carry``, a policy of the same protocol
    takes over what ``old`` learned (``hand_over``). Records a switch event with timings
    and ``by`` whom: the job's "plan" or a "command"."""
    t0 = time.time()
    loop.drain(old)
    t_drained = time.time()
    parts = {}
    if phase.switch == "restart":
        path = loop.checkpoint("switch")
        parts["save_s"] = time.time() - t_drained
        lifecycle = loop.lifecycle
        cluster, lifecycle.next_cluster = lifecycle.next_cluster or lifecycle.launch(), None
        t = time.time()
        loop.stop_generation()
        parts["stop_old_s"] = time.time() - t
        t = time.time()
        parts.update(loop.lifecycle.open(cluster, restore=path))
        parts["start_new_s"] = time.time() - t
    if carry and phase.policy is not old:
        hand_over(loop.log, old.save_state(), phase.policy, "switch")
    set_config(loop.ledger, loop.lifecycle.current, phase)
    t1 = time.time()
    event = {"index": index, "from": old.name, "to": phase.policy.name, "method": phase.switch, "by": by,
             "samples": loop.ledger.samples, "updates": loop.ledger.updates,
             "drain_s": round(t_drained - t0, 4), "switch_s": round(t1 - t_drained, 4),
             "overhead_s": round(t1 - t0, 4), **{k: round(v, 4) for k, v in parts.items()}}
    loop.log.switched(event)
    logger.info("switched %s -> %s by %s in %.3f s", old.name, phase.policy.name, phase.switch, t1 - t0)


def set_config(ledger, gen, phase) -> None:
    """The phase's rate factor and momentum (Sync-Switch §IV-C), from now on: in the ledger
    and on generation ``gen``."""
    ledger.lr_scale = phase.lr_scale
    momentum = phase.momentum(0) if callable(phase.momentum) else phase.momentum
    if momentum is not None:
        ledger.momentum = momentum
    gen.set_hyper(lr_scale=phase.lr_scale, momentum=momentum)


def hand_over(log, state: dict, policy, why: str) -> bool:
    """Give ``policy`` (fresh, before its start) a saved policy state of the same protocol;
    a state that does not fit it is refused, said in an event of run log ``log``, and the
    policy starts afresh. Returns whether it took the state."""
    if not state or state.get("protocol") != policy.name:
        return False
    try:
        policy.restore_state(state, workers=log.ledger.num_workers)
    except ValueError as e:
        logger.warning("%s: %s starts afresh: %s", why, policy.name, e)
        log.event("policy_state", protocol=policy.name, restored=False, why=why, reason=str(e))
        return False
    log.event("policy_state", protocol=policy.name, restored=True, why=why)
    return True


def resume_from(log, resume: dict) -> dict | None:
    """Continue run log ``log`` from an earlier run's checkpoint event ``resume``: the
    counters, and where the checkpoint has the state beside it (and the same number of
    workers), the clocks too. Returns that saved state (its policy part is handed over
    when the phase it was taken in begins: ``resume_policy``), or None."""
    log.ledger.round = int(resume.get("round", 0))
    log.rewind(resume, "resume")
    log.recorder.event("resume", **resume)
    try:
        saved = load_state(resume["path"])
        if saved is None:
            return None
        log.ledger.restore_state(saved["ledger"])
    except (KeyError, TypeError, ValueError) as e:   # another worker count, a damaged file: the counters go on
        logger.warning("resume: the clocks start afresh: %s", e)
        log.event("policy_state", restored=False, why="resume", reason=f"ledger: {e}")
        return None
    return saved


def resume_policy(log, gen, saved: dict, policy) -> None:
    """The resumed phase's policy takes its saved state; with it, the rate factor (set on
    generation ``gen``) and the membership it had (a straggler policy in ASP, a worker it
    had removed). Without it (refused, another protocol) the policy starts afresh: every
    worker a member, the phase's rate factor."""
    ledger = log.ledger
    if hand_over(log, saved["policy"], policy, "resume"):
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
