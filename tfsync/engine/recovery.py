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
``in_flight_lost`` in all); every step whose push the engine counted is kept. Why not
restart the dead worker alone and let the ClusterCoordinator reconnect to it (it does)? In TF 2.21 the recovered worker's step
function then fails with NOT_FOUND for the BSP accumulator on the PS, while the gate
queues still work (tried, with a marker token to reconcile lost tokens); a restart from
a checkpoint taken at the loss costs a few seconds more and works for every protocol.

With elastic bounds (``min_workers``), a lost worker is not restarted while that many
workers remain: the job goes on with the others from the same checkpoint
(``scaling.after_loss``), and a ``scaled`` event says so.

A node left out of a generation (its hook did not answer: it died or lost its link) that
answers again is used again: the engine drains, checkpoints and restarts on every node.

What is here decides, from values (the dead tasks, the checkpoints and recoveries the run
log holds, the bounds): ``after_ps_loss`` and ``after_worker_loss`` return a decision, or
None where the loss cannot be recovered; the engine's loop carries it out
(``Loop.recover_ps``, ``Loop.recover_workers``) and has the run log record it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .checkpoints import newest_intact



@dataclass(frozen=True)
class PSRecovery:
    """A lost PS: every task restarts, restored from ``checkpoint`` (the newest that reads
    back; None: none does, and the run ends); ``skipped``: the newer ones that did not
    read back, (path, why) each."""

    task: tuple            # the dead PS: (job, index, exit code)
    checkpoint: dict | None
    skipped: tuple = ()

    def event(self, samples_lost: int, seconds: float) -> dict:
        """The recovery the run log records (a ``task_restarted`` event)."""
        job, index, code = self.task
        return {"task": f"{job}:{index}", "exit_code": code, "checkpoint": self.checkpoint["path"],
                "samples_lost": samples_lost, "seconds": round(seconds, 3)}


@dataclass(frozen=True)
class WorkerRecovery:
    """Lost workers only: the round is applied, a checkpoint taken, and the job goes on from
    it, with new tasks for them or (elastic bounds: ``scaling.after_loss``) without them."""

    dead: tuple            # (job, index, exit code) of each
    workers: tuple         # their numbers, sorted


def wait_for_ps_loss(cluster, wait_s: float) -> list:
    """``cluster``'s dead tasks, waiting up to ``wait_s`` for a PS among them to show (a
    control call can fail on a PS that died before its hook reports it)."""
    dead = cluster.dead_tasks() if cluster is not None else []
    deadline = time.monotonic() + wait_s
    while cluster is not None and not _ps_among(dead) and time.monotonic() < deadline:
        time.sleep(0.25)
        dead = cluster.dead_tasks()
    return dead


def _ps_among(dead) -> bool:
    return any(job == "ps" for job, _, _ in dead)


def after_ps_loss(dead: list, checkpoints: list[dict], recoveries: list[dict],
                  max_recoveries: int) -> PSRecovery | None:
    """A restart from the newest checkpoint that reads back, where a PS is among ``dead``, a
    checkpoint was taken and fewer than ``max_recoveries`` ``recoveries`` were made; else None."""
    if not _ps_among(dead) or not checkpoints or len(recoveries) >= max_recoveries:
        return None
    last, skipped = newest_intact(checkpoints, path=lambda c: c["path"])
    return PSRecovery(tuple(dead[0]), last, tuple(skipped))


def after_worker_loss(dead: list, recoveries: list[dict], max_recoveries: int) -> WorkerRecovery | None:
    """A restart without the tasks of ``dead`` where only workers died, none of them
    recovered ``max_recoveries`` times already (``recoveries``); else None."""
    if not dead or any(job != "worker" for job, _, _ in dead):
        return None
    workers = tuple(sorted(w for _, w, _ in dead))
    if any(sum(e["task"] == f"worker:{w}" for e in recoveries) >= max_recoveries for w in workers):
        return None
    return WorkerRecovery(tuple(tuple(d) for d in dead), workers)
