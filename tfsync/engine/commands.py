"""Commands a running engine obeys at step boundaries (Sync-Switch Fig. 9: the manager
decides, the coordinator-side hook acts), and the controller interface that delivers them.

A :class:`Controller` receives every push record (``record``: must be cheap, it runs on
the engine's loop), hands over pending commands (``commands``) and learns each outcome
(``result``). The manager's link (``tfsync.manager.link``) implements it over gRPC; the
engine itself knows nothing of gRPC.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import policy as policies
from ..policy.base import BatchSizer, PolicyError
from ..policy.commands import InvalidCommand, check_batch_sizes, check_switch, check_workers
from .phase import EngineError
from .scaling import join, phases_left, scale
from .switching import switch

if TYPE_CHECKING:
    from .loop import Loop

logger = logging.getLogger(__name__)

KINDS = ("switch", "batch_sizes", "checkpoint", "stop", "scale", "join")


@dataclass(frozen=True)
class Command:
    """``switch``: to ``protocol`` (with ``options``) by ``method`` ("hot" | "restart"),
    learning rate x ``lr_scale`` (None: keep). ``batch_sizes``: one per worker from the
    next grant on. ``checkpoint``: save now. ``stop``: drain, save if ``save``, end.
    ``scale``: go on with ``workers`` workers (tfsync.engine.scaling). ``join``: the node
    hook at ``hook`` joins; the job grows by ``workers`` onto it, up to its maximum."""

    id: str
    kind: str
    protocol: str = ""
    options: dict = field(default_factory=dict)
    method: str = "hot"
    lr_scale: float | None = None
    batch_sizes: tuple[int, ...] = ()
    save: bool = True
    workers: int = 0
    hook: str = ""


@dataclass(frozen=True)
class CommandResult:
    id: str
    ok: bool
    message: str
    updates: int  # the step boundary (model updates so far) at which it was carried out
    checkpoint_path: str = ""
    invalid: bool = False   # refused as given (tfsync.policy.commands.InvalidCommand), not for the job's state


class Controller:
    """No commands, records dropped: what an engine without a manager has."""

    def record(self, record: dict) -> None:
        pass

    def event(self, kind: str, detail: dict) -> None:
        """Something that happened to the run (a lost or rejoined worker, a switch, ...)."""

    def commands(self) -> list[Command]:
        return []

    def result(self, result: CommandResult) -> None:
        pass


class StopRequested(Exception):
    """A stop command: the run ends after the current step boundary."""

    def __init__(self, checkpoint_path: str = ""):
        super().__init__("stop requested")
        self.checkpoint_path = checkpoint_path


def check(cmd: Command, workers: int) -> dict:
    """Raise ValueError for a command that cannot be carried out (before touching anything):
    the checks of ``tfsync.policy.commands``, the ones the manager makes too. Returns a
    switch's options in their declared types."""
    if cmd.kind not in KINDS:
        raise ValueError(f"unknown command {cmd.kind!r}; expected one of {', '.join(KINDS)}")
    if cmd.kind == "switch":
        return check_switch(cmd.protocol, cmd.options, cmd.method, cmd.lr_scale)
    if cmd.kind == "batch_sizes":
        check_batch_sizes(cmd.batch_sizes, workers)
    if cmd.kind in ("scale", "join"):
        check_workers(cmd.workers)
    if cmd.kind == "join" and not cmd.hook:
        raise ValueError("join: the hook's address (host:port) is missing")
    return {}


def carry_out(loop: Loop, phase, cmd: Command, max_batch: int) -> tuple[str, str]:
    """Apply ``cmd`` through the engine's ``loop`` inside ``phase`` (whose policy a switch
    replaces); returns (message, checkpoint path). Raises StopRequested for ``stop``."""
    options = check(cmd, loop.workers)
    old = phase.policy
    if cmd.kind == "batch_sizes":
        phase.set_batch_sizes(cmd.batch_sizes, max_batch)
        return f"batch sizes {list(cmd.batch_sizes)} from the next grant", ""
    if cmd.kind == "checkpoint":
        loop.drain(old)
        path = loop.checkpoint("command")
        loop.apply(old.start(loop.view()))
        return f"checkpoint {path}", path
    if cmd.kind == "stop":
        loop.drain(old)
        raise StopRequested(loop.checkpoint("stop") if cmd.save else "")
    if cmd.kind == "scale":   # this phase and the plan's later ones
        return scale(loop, phases_left(loop, phase), cmd.workers, loop.elastic.rule), ""
    if cmd.kind == "join":
        return join(loop, phases_left(loop, phase), cmd.hook, cmd.workers, loop.elastic.rule), ""
    # a self-sizing protocol makes its own sizer; after one, the others size as it started
    if cmd.method == "restart" and not getattr(loop.lifecycle.current.cluster, "restartable", True):
        raise ValueError("a restart switch needs new tasks, but this cluster's are the platform's (TF_CONFIG): "
                         "switch hot")
    sizer = BatchSizer(old.sizer.batch_size) if old.self_sizing else old.sizer
    if policies.spec(cmd.protocol).self_sizing and "hi" in policies.spec(cmd.protocol).options:
        options.setdefault("hi", max_batch)  # no batch larger than the input pipeline's
    new = policies.make(cmd.protocol, sizer, **options)
    if new.max_batch(loop.workers) > max_batch:
        raise ValueError(f"{new.name} could grant batches of {new.max_batch(loop.workers)}, more than the input "
                         f"pipeline's {max_batch}; set a larger batch size in the job to allow it")
    # the rate the new protocol runs at: as asked, else the configuration policy's for it
    lr_scale = loop.lr_rule(new.name, loop.workers) if cmd.lr_scale is None else cmd.lr_scale
    target = type(phase)(new, until=phase.until, switch=cmd.method, lr_scale=lr_scale, momentum=phase.momentum)
    switch(loop, old, target, len(loop.log.timeline), by="command")
    old_stats = old.stats()
    phase.switched(new, cmd.method, target.lr_scale, options)
    loop.log.begin_phase(phase, loop.lifecycle.base_lr, stats_of_previous=old_stats)
    loop.apply(new.start(loop.view()))
    rule = "as asked" if cmd.lr_scale is not None else f"the configuration policy's for {new.name}"
    return f"switched {old.name} -> {new.name} ({cmd.method}), learning rate x{lr_scale:g} ({rule})", ""


def obey(loop: Loop, phase, cmd: Command) -> None:
    """Carry out a manager's command at this step boundary and report the outcome."""
    try:
        message, path = carry_out(loop, phase, cmd, loop.lifecycle.setup.max_batch_size)
    except StopRequested as stop:
        loop.log.recorder.event("command", id=cmd.id, command=cmd.kind, message="stopping",
                                **({"checkpoint": stop.checkpoint_path} if stop.checkpoint_path else {}))
        loop.controller.result(CommandResult(cmd.id, True, "stopping", loop.ledger.updates, stop.checkpoint_path))
        raise
    except (ValueError, PolicyError) as e:
        logger.warning("command %s (%s) refused: %s", cmd.id, cmd.kind, e)
        loop.controller.result(CommandResult(cmd.id, False, str(e), loop.ledger.updates,
                                             invalid=isinstance(e, InvalidCommand)))
        return
    except EngineError as e:   # it failed halfway (a scale whose new tasks died): the run ends with it
        loop.controller.result(CommandResult(cmd.id, False, str(e), loop.ledger.updates))
        raise
    loop.log.recorder.event("command", id=cmd.id, command=cmd.kind, message=message)
    loop.controller.result(CommandResult(cmd.id, True, message, loop.ledger.updates, path))
