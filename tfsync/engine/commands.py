"""Commands a running engine obeys at step boundaries (Sync-Switch Fig. 9: the manager
decides, the coordinator-side hook acts), and the controller interface that delivers them.

A :class:`Controller` receives every push record (``record``: must be cheap, it runs on
the engine's loop), hands over pending commands (``commands``) and learns each outcome
(``result``). The manager's link (``tfsync.manager.link``) implements it over gRPC; the
engine itself knows nothing of gRPC.

What is here decides: ``check`` refuses a command that cannot be carried out, and
``plan_switch`` makes the policy and phase a switch goes to (a :class:`SwitchPlan`); the
engine's loop carries out every command (``Loop.obey``) and reports the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .. import policy as policies
from ..policy.base import BatchSizer, Policy
from ..policy.checks import check_batch_sizes, check_switch, check_workers
from .phase import Phase


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
    invalid: bool = False   # refused as given (tfsync.policy.checks.InvalidCommand), not for the job's state


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
    the checks of ``tfsync.policy.checks``, the ones the manager makes too. Returns a
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


@dataclass(frozen=True)
class SwitchPlan:
    """A switch command, decided: the phase to switch to (``target``: the new policy, the
    method, the rate factor) and the options the new policy took."""

    target: Phase
    options: dict
    asked_rate: bool   # the rate factor as the command asked (else the configuration policy's)

    def message(self, old: str) -> str:
        """The command's answer, once carried out, from the policy called ``old``."""
        new, t = self.target.policy.name, self.target
        rule = "as asked" if self.asked_rate else f"the configuration policy's for {new}"
        return f"switched {old} -> {new} ({t.switch}), learning rate x{t.lr_scale:g} ({rule})"


def plan_switch(cmd: Command, options: dict, phase: Phase, workers: int, max_batch: int,
                lr_rule: Callable[[str, int], float], restartable: bool = True) -> SwitchPlan:
    """What the switch command ``cmd`` (its ``options`` as ``check`` returned them) makes of
    ``phase`` on ``workers`` workers: the new policy (no batch above ``max_batch``, the
    input pipeline's largest; after a self-sizing protocol, the others size as it
    started) at the rate the command asks, else ``lr_rule(protocol, workers)``. ValueError
    where it cannot be carried out: a restart on tasks that are not tfsync's to restart
    (not ``restartable``), batches too large."""
    if cmd.method == "restart" and not restartable:
        raise ValueError("a restart switch needs new tasks, but this cluster's are the platform's (TF_CONFIG): "
                         "switch hot")
    old: Policy = phase.policy
    # a self-sizing protocol makes its own sizer; after one, the others size as it started
    sizer = BatchSizer(old.sizer.batch_size) if old.self_sizing else old.sizer
    if policies.spec(cmd.protocol).self_sizing and "hi" in policies.spec(cmd.protocol).options:
        options.setdefault("hi", max_batch)  # no batch larger than the input pipeline's
    new = policies.make(cmd.protocol, sizer, **options)
    if new.max_batch(workers) > max_batch:
        raise ValueError(f"{new.name} could grant batches of {new.max_batch(workers)}, more than the input "
                         f"pipeline's {max_batch}; set a larger batch size in the job to allow it")
    # the rate the new protocol runs at: as asked, else the configuration policy's for it
    lr_scale = lr_rule(new.name, workers) if cmd.lr_scale is None else cmd.lr_scale
    target = type(phase)(new, until=phase.until, switch=cmd.method, lr_scale=lr_scale, momentum=phase.momentum)
    return SwitchPlan(target, options, cmd.lr_scale is not None)
