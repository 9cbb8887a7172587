"""Elastic workers: a running job goes on with another number of workers.

A scale is a restart at a step boundary (as a restart switch is): ``n`` workers' tasks
(and the PS) start, the job drains, checkpoints, stops the old tasks and goes on with the
new ones, restored from the checkpoint. With elastic bounds, a lost worker shrinks the
job the same way (``after_loss``) instead of being restarted. Workers
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

What is here decides, from values: ``check_scale`` refuses, ``decide`` (a command, a join)
and ``after_loss`` (a lost worker under elastic bounds) return a :class:`ScaleDecision`,
and the engine's loop carries it out (``Loop.scale``, ``Loop.resize``): drain, checkpoint,
new tasks, the decision's ``resize`` of the phases, the policy started again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from ..policy.base import BatchSizer
from ..policy.checks import MAX_WORKERS, check_workers

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


def check_scale(workers: int, old: int, elastic: Elastic, restartable: bool, members: frozenset,
                policy: str) -> None:
    """Raise ValueError (one line) for a scale from ``old`` to ``workers`` workers that
    cannot be carried out, before touching anything: ``elastic``'s bounds and fit, tasks
    that are not tfsync's to restart (not ``restartable``), a worker ``policy`` holds out
    of the ``members`` now (what the plan's phases allow: ``rescale``)."""
    check_workers(workers, elastic.min_workers, elastic.max_workers)
    if workers == old:
        raise ValueError(f"the job already runs {old} workers")
    if not restartable:
        raise ValueError("a scale needs new tasks, but this cluster's are the platform's (TF_CONFIG): "
                         "change the platform's worker count instead")
    if members != frozenset(range(old)):
        out = sorted(frozenset(range(old)) - members)
        raise ValueError(f"{policy} holds worker(s) {out} out of the membership now; scale once "
                         "they are members again (one owner of membership at a time)")
    if elastic.fits is not None:   # memory and open files for that many tasks (tfsync.job.limits)
        try:
            elastic.fits(workers)
        except Exception as e:   # noqa: BLE001 - a ConfigError naming what does not fit
            raise ValueError(f"{workers} workers do not fit: {e}") from None


def phases_left(phases: list, phase) -> list:
    """``phase`` (the one running) and the plan's ``phases`` after it: what a scale changes."""
    return phases[phases.index(phase):] if phase in phases else [phase]


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


@dataclass(frozen=True)
class ScaleDecision:
    """Go on with ``workers`` workers instead of ``old``: ``resize()`` makes the phases so
    (``rescale``: their policies, rates and batches); the running phase's rate factor
    follows the count under ``rule`` (``lr_scale``); ``by`` whom ("command", "join",
    "loss") and ``detail`` go into the ``scaled`` event."""

    old: int
    workers: int
    rule: str
    resize: Callable[[], None]
    lr_rule: Callable[[str, int], float]
    by: str = "command"
    detail: dict = field(default_factory=dict)

    def lr_scale(self, now: float, policy) -> float:
        """The rate factor at the new count, from the one in force ``now`` under ``policy``
        (the protocol it runs now: ``running_protocol``)."""
        if self.rule != "local":
            return now
        running = running_protocol(policy)
        return now * (self.lr_rule(running, self.workers) / self.lr_rule(running, self.old))

    def event(self, lr_scale: float, samples: int, updates: int, checkpoint: str, seconds: dict) -> dict:
        """The ``scaled`` event the run log records: counts, checkpoint, what it cost."""
        return {"from": self.old, "to": self.workers, "by": self.by, "rule": self.rule, **self.detail,
                "samples": samples, "updates": updates, "checkpoint": checkpoint, "lr_scale": lr_scale,
                **{k: round(v, 3) for k, v in seconds.items()}}


def decide(phases, old: int, workers: int, elastic: Elastic, lr_rule, max_batch: int, by: str = "command",
           rule: str | None = None, **detail) -> ScaleDecision:
    """The scale of ``phases`` (the one running and those still to run) from ``old`` to
    ``workers`` workers under ``rule`` (default ``elastic``'s); ValueError, having changed
    nothing, where ``rescale`` refuses. ``by`` and ``detail`` go into the ``scaled`` event."""
    rule = elastic.rule if rule is None else rule
    resize = rescale(phases, old, workers, rule, lr_rule, max_batch)
    return ScaleDecision(old, workers, rule, resize, lr_rule, by, dict(detail))


def after_loss(phases, old: int, lost: list[int], elastic: Elastic, lr_rule, max_batch: int) -> ScaleDecision | None:
    """Workers ``lost`` (their tasks died): go on without them where the job has elastic
    bounds (``min_workers``) that allow it, instead of restarting their tasks. The
    survivors take the numbers 0..n-1 (their per-worker state kept by position, relearnt
    where it was a lost worker's). None where the job restarts the lost tasks as before
    (no bounds, too few left, a plan that cannot go on with fewer: said in a warning)."""
    workers = old - len(lost)
    if elastic.min_workers is None or workers < elastic.min_workers:
        return None
    try:
        return decide(phases, old, workers, elastic, lr_rule, max_batch, by="loss", lost=sorted(lost))
    except ValueError as e:
        logger.warning("the job cannot go on with %d workers (%s): the lost tasks are restarted", workers, e)
        return None


def scaled_line(event: dict, policy) -> str:
    """What a scale did and cost, in a line (a command's answer); ``policy``: the one
    running at the new count."""
    detector = getattr(policy, "detector", None)   # a straggler policy's
    workers = event["to"]
    off = (f"; straggler detection is off below {detector.min_workers} workers"
           if detector is not None and workers < detector.min_workers else "")
    return (f"scaled {event['from']} -> {workers} workers in {event['seconds']:.1f} s (learning rate "
            f"x{event['lr_scale']:g}, {event['rule']}){off}")


def join(nodes, address: str, workers: int, add: int, max_workers: int | None, scale: Callable[..., str],
         event: Callable[..., None]) -> str:
    """The node hook at ``address`` joins the running job (``tfsync hook --join``): it
    becomes one of ``nodes`` (the lifecycle's cluster factory) and the job grows from
    ``workers`` by ``add`` workers, up to ``max_workers``, by ``scale(target, by="join",
    node=address)``, whose new generation places tasks on it (round-robin over the nodes,
    the joined one last). At the maximum the node is only added (said by ``event``): the
    job's next restart places tasks on it; a hook that is a node already (it restarted)
    is told so. ValueError, with nothing changed, where the job does not run on node hooks,
    the hook does not answer or refuses the job's token, or the scale is refused."""
    if not getattr(nodes, "joinable", False):
        raise ValueError("this job's tasks are not run by node hooks (cluster.hooks): a hook cannot join it")
    if nodes.has_hook(address):   # a joined hook that restarted and announces itself again
        return f"hook {address} is already one of the job's nodes"
    target = min(workers + add, max_workers or MAX_WORKERS)
    nodes.add_hook(address)
    if target == workers:
        event("node_joined", node=address, workers=workers)
        return (f"hook {address} joined; the job already runs its maximum of {workers} workers "
                "(cluster.max_workers): its next restart places tasks there too")
    try:
        done = scale(target, by="join", node=address)
    except ValueError:
        nodes.remove_hook(address)
        raise
    return f"hook {address} joined; {done}"
