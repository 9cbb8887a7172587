"""Elastic workers: a running job goes on with another number of workers.

A scale is a restart at a step boundary (as a restart switch is): ``n`` workers' tasks
(and the PS) start, the job drains, checkpoints, stops the old tasks and goes on with the
new ones, restored from the checkpoint. With elastic bounds, a lost worker shrinks the
job the same way (``shrink_after_loss``) instead of being restarted. Workers
keep their numbers 0..n-1: a shrink drops the highest-numbered ones, a grow adds new ones.
What counts per worker follows: the ledger's clocks (a new worker starts level with the
slowest, ``Ledger.resize``) and the running policy's state (``Policy.resize``: LB-BSP's
predictors, SSP's clocks, sizes set by hand; what a new worker starts from is each
policy's stated prior). The counters (samples, updates, pushes, round) are the job's and
go on: nothing counted is lost.

The learning rate and batch across a scale (``rule``, the job file's ``cluster.scale``):
"local" keeps each worker's batch and gives every phase, this one and those the plan has
still to run, the configuration policy's rate for the new count (x n for a protocol that
averages n workers' gradients: BSP and LB-BSP run n/m times the global batch at n/m
times the rate); "global" keeps the global batch (each worker's batch becomes the old
global batch / n, which must divide evenly) and the rate. Momentum is not rescaled (a
momentum rule that depends on n, ``switch.momentum = "inverse_n"`` or a ramp, keeps the
job file's n).

A scale by command starts the new tasks while the old ones still train (as a planned
restart switch does): a count the machine or the hooks cannot start is refused with
nothing changed; what fails after the old tasks stopped ends the run in one line, with
everything counted in the checkpoint the scale took (``tfsync resume``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..policy.base import BatchSizer
from ..policy.commands import MAX_WORKERS, check_workers
from .phase import EngineError

if TYPE_CHECKING:
    from .loop import Loop

logger = logging.getLogger(__name__)

RULES = ("local", "global")


@dataclass
class Elastic:
    """How the worker count may change: ``rule``, the rate and batch across a change (one
    of RULES); the bounds a scale keeps to (with ``min_workers``, a lost worker shrinks
    the job while that many remain); ``fits(n)`` raises where n workers do not fit the
    machine."""

    rule: str = "local"
    min_workers: int | None = None
    max_workers: int | None = None
    fits: Callable[[int], None] | None = None


def check_scale(loop: Loop, workers: int) -> None:
    """Raise ValueError (one line) for a scale of the running job that cannot be carried
    out, before touching anything (what the plan's phases allow: ``rescale``)."""
    old = loop.workers
    check_workers(workers, loop.elastic.min_workers, loop.elastic.max_workers)
    if workers == old:
        raise ValueError(f"the job already runs {old} workers")
    if not getattr(loop.lifecycle.current.cluster, "restartable", True):
        raise ValueError("a scale needs new tasks, but this cluster's are the platform's (TF_CONFIG): "
                         "change the platform's worker count instead")
    if loop.ledger.active != frozenset(range(old)):
        out = sorted(frozenset(range(old)) - loop.ledger.active)
        raise ValueError(f"{loop.policy.name} holds worker(s) {out} out of the membership now; scale once "
                         "they are members again (one owner of membership at a time)")
    if loop.elastic.fits is not None:   # memory and open files for that many tasks (tfsync.job.limits)
        try:
            loop.elastic.fits(workers)
        except Exception as e:   # noqa: BLE001 - a ConfigError naming what does not fit
            raise ValueError(f"{workers} workers do not fit: {e}") from None


def phases_left(loop: Loop, phase) -> list:
    """``phase`` (the one running) and the plan's phases after it: what a scale changes."""
    return loop.phases[loop.phases.index(phase):] if phase in loop.phases else [phase]


def running_protocol(policy) -> str:
    """The protocol ``policy`` runs now: a straggler policy's BSP or ASP, else its own."""
    return getattr(policy, "running", policy.name)


def rescale(phases, old: int, workers: int, rule: str, lr_rule, max_batch: int):
    """Check that ``phases`` (the one running and those still to run) can go on with
    ``workers`` workers instead of ``old`` under ``rule``; return what makes them so,
    having changed nothing: their policies resized and, under "local", each rate factor
    times ``lr_rule(protocol, workers) / lr_rule(protocol, old)`` (a straggler policy's
    for each protocol it runs), under "global" each worker's batch the old global batch /
    ``workers``; what commands changed in a phase (``Phase.changed``: its rate, batch sizes)
    follows, so a resume finds it at the new count. ValueError (one line) where a phase
    cannot: a batch above ``max_batch`` (the input pipeline's largest), a global batch that
    does not split evenly, a policy that cannot resize."""
    if rule not in RULES:
        raise ValueError(f"cluster.scale = {rule!r}: must be one of {', '.join(RULES)}")
    sizes = []   # (a count under 1: each policy's check_resize refuses it)
    for phase in phases:
        policy = phase.policy
        if rule == "global":
            if policy.self_sizing or type(policy.sizer) is not BatchSizer or hasattr(policy, "lr_scales"):
                raise ValueError(f"cluster.scale = 'global' keeps one global batch, but {policy.name} of this "
                                 "plan sizes per worker; use cluster.scale = 'local'")
            total = policy.sizer.batch_size * old
            if total % workers:
                raise ValueError(f"cluster.scale = 'global': the global batch {total} does not split evenly "
                                 f"into {workers} workers")
            sizes.append(total // workers)
        else:
            sizes.append(None)
        batch = sizes[-1] or policy.max_batch(workers)
        if batch > max_batch:
            raise ValueError(f"{policy.name} would grant batches of {batch} on {workers} workers, more than the "
                             f"input pipeline's {max_batch}")
        policy.check_resize(workers)

    def factor(protocol: str) -> float:   # the configuration policy's rate for the new count
        return lr_rule(protocol, workers) / lr_rule(protocol, old)

    def apply():
        for phase, size in zip(phases, sizes):
            policy = phase.policy
            policy.resize(workers)
            if size is not None:
                policy.sizer = BatchSizer(size)
                continue
            inner = getattr(policy, "lr_scales", None)   # a straggler policy: the phase runs at BSP's rate
            phase.lr_scale *= factor("bsp" if inner is not None else policy.name)
            for protocol in inner or ():
                inner[protocol] *= factor(protocol)
            if "lr_scale" in phase.changed:
                phase.changed["lr_scale"] = phase.lr_scale
            if "batch_sizes" in phase.changed and hasattr(policy.sizer, "per_worker"):
                phase.changed["batch_sizes"] = list(policy.sizer.per_worker)
    return apply


def scale(loop: Loop, phases, workers: int, rule: str = "local", by: str = "command", **detail) -> str:
    """Go on with ``workers`` workers (``phases``: the current phase and those still to
    run); returns what was done and what it cost, in a line. ValueError, having changed
    nothing, where ``check_scale`` or ``rescale`` refuses or the new tasks cannot start;
    EngineError where it fails after the old tasks stopped. ``by`` and ``detail`` go into
    the ``scaled`` event."""
    check_scale(loop, workers)
    resized = rescale(phases, loop.workers, workers, rule, loop.lr_rule, loop.lifecycle.setup.max_batch_size)
    t0 = time.time()
    try:
        cluster = loop.lifecycle.launch(workers)   # the new tasks start while the old ones train
    except Exception as e:   # noqa: BLE001 - e.g. the hooks' task ports are fewer than the tasks
        raise ValueError(f"{workers} workers could not be started: {e}") from None
    path = None
    try:
        loop.drain(loop.policy)
        path = loop.checkpoint("scale")
        event = relaunch(loop, phases, workers, resized, path, t0, by=by, cluster=cluster, rule=rule, **detail)
    except Exception as e:
        cluster.stop()
        where = f"; everything counted is in {path}: `tfsync resume`" if path else ""
        raise EngineError(f"the scale to {workers} workers failed: {e}{where}") from e
    detector = getattr(loop.policy, "detector", None)   # a straggler policy's
    off = (f"; straggler detection is off below {detector.min_workers} workers"
           if detector is not None and workers < detector.min_workers else "")
    return (f"scaled {event['from']} -> {workers} workers in {event['seconds']:.1f} s (learning rate "
            f"x{event['lr_scale']:g}, {rule}){off}")


def join(loop: Loop, phases, address: str, add: int, rule: str = "local") -> str:
    """The node hook at ``address`` joins the running job (``tfsync hook --join``): it
    becomes one of the job's nodes and the job grows by ``add`` workers, up to its
    ``max_workers``, by a scale whose new generation places tasks on it (round-robin over
    the nodes, the joined one last). At the maximum the node is only added: the job's next
    restart places tasks on it; a hook that is a node already (it restarted) is told so.
    ValueError, with nothing changed, where the job does not run on node hooks, the hook
    does not answer or refuses the job's token, or the scale is refused."""
    nodes = loop.lifecycle.cluster_factory
    if not getattr(nodes, "joinable", False):
        raise ValueError("this job's tasks are not run by node hooks (cluster.hooks): a hook cannot join it")
    if nodes.has_hook(address):   # a joined hook that restarted and announces itself again
        return f"hook {address} is already one of the job's nodes"
    target = min(loop.workers + add, loop.elastic.max_workers or MAX_WORKERS)
    nodes.add_hook(address)
    if target == loop.workers:
        loop.log.event("node_joined", node=address, workers=loop.workers)
        return (f"hook {address} joined; the job already runs its maximum of {loop.workers} workers "
                "(cluster.max_workers): its next restart places tasks there too")
    try:
        done = scale(loop, phases, target, rule, by="join", node=address)
    except ValueError:
        nodes.remove_hook(address)
        raise
    return f"hook {address} joined; {done}"


def shrink_after_loss(loop: Loop, lost: list[int], path: str, t0: float) -> dict | None:
    """Workers ``lost`` (their tasks died; the job drained and checkpointed at ``path``):
    go on without them where the job has elastic bounds (``min_workers``) that allow it,
    instead of restarting their tasks. The survivors take the numbers 0..n-1 (their
    per-worker state kept by position, relearnt where it was a lost worker's). Returns the
    ``scaled`` event, or None where the job restarts the lost tasks as before (no bounds,
    too few left, a plan that cannot go on with fewer: said in a warning)."""
    workers = loop.workers - len(lost)
    if loop.elastic.min_workers is None or workers < loop.elastic.min_workers:
        return None
    phases = phases_left(loop, loop.phase)
    try:
        resized = rescale(phases, loop.workers, workers, loop.elastic.rule, loop.lr_rule,
                          loop.lifecycle.setup.max_batch_size)
    except ValueError as e:
        logger.warning("the job cannot go on with %d workers (%s): the lost tasks are restarted", workers, e)
        return None
    return relaunch(loop, phases, workers, resized, path, t0, by="loss", rule=loop.elastic.rule,
                    lost=sorted(lost))


def relaunch(loop: Loop, phases, workers: int, resized, path: str, t0: float, by: str, cluster=None,
             rule: str = "local", **detail) -> dict:
    """Stop the drained job's tasks, make ``workers`` the count (ledger, ``resized``: the
    phases' policies, rates and batches), open ``cluster`` (or new tasks) restored from
    ``path`` and start the policy; returns the ``scaled`` event it records."""
    old, policy, t_saved = loop.workers, loop.policy, time.time()
    running = running_protocol(policy)
    rate = loop.ledger.lr_scale * (loop.lr_rule(running, workers) / loop.lr_rule(running, old)
                                   if rule == "local" else 1.0)
    lifecycle = loop.lifecycle
    if lifecycle.next_cluster is not None:   # started ahead for a restart switch: the old count
        lifecycle.next_cluster.stop()
        lifecycle.next_cluster = None
    loop.stop_generation()
    loop.ledger.forget_grants()   # (after a loss: the steps the killed tasks held)
    lifecycle.workers = workers
    loop.ledger.resize(workers)
    resized()
    t_stopped = time.time()
    opened = lifecycle.open(cluster or lifecycle.launch(wait=True), restore=path)   # its parts' seconds
    loop.ledger.lr_scale = rate
    loop.lifecycle.current.set_hyper(lr_scale=rate)
    t1 = time.time()
    event = {"from": old, "to": workers, "by": by, "rule": rule, **detail, "samples": loop.ledger.samples,
             "updates": loop.ledger.updates, "checkpoint": path, "lr_scale": rate,
             "drain_save_s": round(t_saved - t0, 3), "restart_s": round(t1 - t_stopped, 3),
             **{k: round(v, 3) for k, v in opened.items()}, "seconds": round(t1 - t0, 3)}
    loop.log.scaled(event)
    if not loop.draining and (loop.phase_end is None or loop.ledger.samples < loop.phase_end):
        loop.apply(policy.start(loop.view()))
    logger.info("scaled %d -> %d workers (%s) in %.1f s", old, workers, by, t1 - t0)
    return event
