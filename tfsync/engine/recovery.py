"""Recovery from a lost parameter server (DESIGN.md: a failed PS makes the strategy raise
UnavailableError; the remedy is restart + restore from checkpoint).

The engine replaces every task process (a PS holds variables no other task has), opens a
new generation restored from its newest checkpoint, and rolls its counters back to that
checkpoint: the steps since then are lost and trained again, so at most one checkpoint
interval of work is lost. A lost worker is not handled here (the job fails with a
one-line error that names the task).
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)


def recover_lost_ps(engine, phase) -> bool:
    """Restart the cluster and restore if a PS died and a checkpoint exists; returns
    whether training can go on."""
    gen = engine._gen
    dead = gen.cluster.dead_tasks() if gen is not None else []
    if not any(job == "ps" for job, _, _ in dead) or not engine.checkpoints \
            or len(engine.recovery_log) >= engine.max_recoveries:
        return False
    t0, last = time.time(), engine.checkpoints[-1]
    logger.warning("task %s:%d died; restarting the cluster from %s", dead[0][0], dead[0][1], last["path"])
    engine._close_generation(kill=True)
    engine._open_generation(engine._launch(), restore=last["path"])
    s = engine.state
    lost = s.samples - last["samples"]
    s.samples, s.updates, s.pushes = last["samples"], last["updates"], last["pushes"]
    s.granted = list(s.clocks)  # nothing runs in the new generation
    s.pending_workers, s.pending_samples = [], 0
    engine._last_ckpt_updates = s.updates
    engine._gen.set_hyper(learning_rate=engine.base_lr * engine._lr_scale)
    event = {"task": f"{dead[0][0]}:{dead[0][1]}", "exit_code": dead[0][2], "checkpoint": last["path"],
             "samples_lost": lost, "seconds": round(time.time() - t0, 3)}
    engine.recovery_log.append(event)
    engine.recorder.event("task_restarted", **event)
    engine._apply(phase.policy.start(engine.view()))
    return True
