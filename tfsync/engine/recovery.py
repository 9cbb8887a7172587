"""Recovery from a lost parameter server (a failed PS makes ParameterServerStrategy's
schedule and join raise UnavailableError; its own remedy is restart + restore from a
checkpoint, which is what this does).

The engine replaces every task process (a PS holds variables no other task has), opens a
new generation restored from its newest checkpoint, and rolls its counters back to that
checkpoint: the steps since then are lost and trained again, so at most one checkpoint
interval of work is lost.

A lost worker: the PS still holds every applied update, so nothing completed needs to
be lost. The round's aggregate is applied, a checkpoint is taken, and the cluster
restarts from it (new tasks for every worker, the PS restored): the steps running at
that moment, on any worker, are lost (``steps_lost`` of the dead worker,
``in_flight_lost`` in all); every step whose push the engine counted is kept. Why not restart the dead worker alone and let the
ClusterCoordinator reconnect to it (it does)? In TF 2.21 the recovered worker's step
function then fails with NOT_FOUND for the BSP accumulator on the PS, while the gate
queues still work (tried, with a marker token to reconcile lost tokens); a restart from
a checkpoint taken at the loss costs a few seconds more and works for every protocol.

With elastic bounds (``min_workers``), a lost worker is not restarted while that many
workers remain: the job goes on with the others from the same checkpoint
(``scaling.shrink_after_loss``), and a ``scaled`` event says so.

A node left out of a generation (its hook did not answer: it died or lost its link) that
answers again is used again (``rejoin_nodes``): the engine drains, checkpoints and
restarts on every node.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .checkpoints import newest_intact
from .scaling import shrink_after_loss

if TYPE_CHECKING:
    from .loop import Loop

logger = logging.getLogger(__name__)


def recover_lost_ps(loop: Loop, phase, wait_s: float = 0.0) -> bool:
    """Restart the cluster and restore if a PS died and a checkpoint exists; returns
    whether training can go on. ``wait_s``: how long to wait for a dead PS to show."""
    gen = loop.lifecycle.current
    dead = gen.cluster.dead_tasks() if gen is not None else []
    deadline = time.monotonic() + wait_s
    while gen is not None and not any(job == "ps" for job, _, _ in dead) and time.monotonic() < deadline:
        time.sleep(0.25)
        dead = gen.cluster.dead_tasks()
    if not any(job == "ps" for job, _, _ in dead) or not loop.log.checkpoints \
            or len(loop.log.recoveries) >= loop.lifecycle.max_recoveries:
        return False
    t0 = time.time()
    last, skipped = newest_intact(loop.log.checkpoints, path=lambda c: c["path"])
    for path, why in skipped:
        logger.warning("checkpoint %s does not read back (%s); restoring an older one", path, why)
        loop.log.event("checkpoint_skipped", path=path, reason=why)
    if last is None:
        return False
    logger.warning("task %s:%d died; restarting the cluster from %s", dead[0][0], dead[0][1], last["path"])
    loop.lifecycle.restart(restore=last["path"])
    lost = loop.ledger.samples - last["samples"]
    loop.log.rewind(last, "ps_lost")
    event = {"task": f"{dead[0][0]}:{dead[0][1]}", "exit_code": dead[0][2], "checkpoint": last["path"],
             "samples_lost": lost, "seconds": round(time.time() - t0, 3)}
    loop.log.recoveries.append(event)
    loop.log.event("task_restarted", **event)
    loop.apply(phase.policy.start(loop.view()))
    return True


def recover_lost_workers(loop: Loop, policy, dead: list) -> bool:
    """If only workers died (no PS) among ``dead`` (the cluster's ``dead_tasks()``): finish
    the live workers' steps, apply the round, checkpoint and restart the cluster from it;
    returns whether it did."""
    if not dead or any(job != "worker" for job, _, _ in dead):
        return False
    lost_workers = sorted(w for _, w, _ in dead)
    if any(sum(e["task"] == f"worker:{w}" for e in loop.log.recoveries) >= loop.lifecycle.max_recoveries
           for w in lost_workers):
        return False
    loop.lifecycle.recovering = set(lost_workers)  # their closures' errors and deaths are expected now
    try:
        return _restart_without(loop, policy, dead, lost_workers)
    finally:
        loop.lifecycle.recovering = None


def _restart_without(loop: Loop, policy, dead, lost_workers) -> bool:
    t0, s = time.time(), loop.ledger
    loop.pilot.abandon()   # rounds the PS ran: what it applied is what was counted
    for _, w, code in dead:
        logger.warning("worker %d died (exit code %s) at step %d; restarting the cluster from its state now",
                       w, code, s.clocks[w])
        loop.log.event("worker_lost", worker=w, exit_code=code, step=s.clocks[w], granted=s.granted[w],
                     pushes=s.pushes)
    # Not waiting for the live workers' running steps: ParameterServerStrategy holds every
    # closure while it waits for the lost worker to come back. What the PS has applied and
    # the engine counted is saved; steps still running anywhere are lost with the cluster.
    lost = {w: s.granted[w] - s.clocks[w] for w in lost_workers}
    in_flight = loop.in_flight()
    loop.finish(policy)  # what the round aggregated is applied, not lost
    path = loop.checkpoint("worker_lost")
    shrunk = shrink_after_loss(loop, lost_workers, path, t0)   # elastic bounds: go on without them
    if shrunk is None:
        loop.lifecycle.restart(restore=path)
    for w in lost_workers:
        event = {"task": f"worker:{w}", "steps_lost": lost[w], "in_flight_lost": in_flight, "checkpoint": path,
                 "seconds": round(time.time() - t0, 3), **({"shrunk_to": shrunk["to"]} if shrunk else {})}
        loop.log.recoveries.append(event)
        if shrunk is None:
            loop.log.event("worker_rejoined", worker=w, steps_lost=lost[w], seconds=event["seconds"])
    if shrunk is None and not loop.draining:   # (a shrink started the policy)
        loop.apply(policy.start(loop.view()))
    return True


def rejoin_nodes(loop: Loop, policy, back: list[str]) -> None:
    """Nodes the current generation left out (``back``: their hooks, which answer again)
    are used again: drain, checkpoint, and restart on every node that answers. Nothing
    counted is lost; the restart costs a few seconds, as a restart switch does."""
    t0 = time.time()
    loop.drain(policy)
    path = loop.checkpoint("node_rejoined")
    loop.lifecycle.restart(restore=path)
    still_out = loop.lifecycle.left_out()   # a node lost again before the new generation started
    for node in back:
        if node not in still_out:
            logger.warning("node %s is back: its hook answers again; the cluster now uses it", node)
            loop.log.event("node_rejoined", node=node, checkpoint=path, seconds=round(time.time() - t0, 3))
    loop.apply(policy.start(loop.view()))
