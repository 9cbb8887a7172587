"""The one interface every synchronization protocol implements.

This is the unified framework of the RLP paper (Algorithm 1), extended with batch sizes and
with the choice of what the server does with a push:

- the server receives a push from worker ``W_s`` (a :class:`Push`);
- ``W_s`` joins the idle set ``I``;
- the policy answers with a :class:`Decision`: which workers may start their next step
  (set ``A``, as :class:`Grant` objects carrying each one's batch size and push mode),
  and whether the gradients aggregated so far are applied now (a *barrier*).

A grant is a permit for one step. Policies that let workers run ahead (ASP, SSP) may
grant steps to workers that are still running; the engine queues them first-in,
first-out, so the worker starts its next step without a round trip to the coordinator.
The cluster state a policy sees is a :class:`ClusterView`.

Semantics the engine and simulator both keep:
- AGGREGATE pushes of one round are combined as the batch-size-weighted *mean*
  g = sum(|B_i| g_i) / sum(|B_i|) (LB-BSP §3.4, eq. 8) and applied at the barrier.
- An AGGREGATE grant carries the round current when it is granted; a push whose round
  was closed by a barrier before it arrived is reported ``dropped`` (drop-stragglers,
  ElasticBSP §VI ref. [17]). Do not queue AGGREGATE grants across a barrier.
- A protocol switch drains every worker, applies what is aggregated, then calls the new
  policy's ``start``.
- SSP staleness follows FluentPS Table III: s = 0 is lock-step.

Nothing here imports TensorFlow: the engine and the simulator drive the same objects.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import random
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..base import plainstate
from ..base.exits import TfsyncError

logger = logging.getLogger(__name__)


class PushMode(enum.Enum):
    """What the server does with the gradient of a granted step."""

    APPLY = "apply"  # applied on arrival (ASP, SSP, PSSP, ...)
    AGGREGATE = "aggregate"  # batch-size-weighted sum, applied at the next barrier (BSP)


@dataclass(frozen=True)
class Grant:
    """Worker ``worker`` may run one more step on ``batch_size`` examples."""

    worker: int
    batch_size: int
    mode: PushMode = PushMode.APPLY


# a learning-rate factor from a switch command: BSP's n x eta up to a thousand workers; a
# larger one only makes training diverge (a factor of 1e6 turned the loss to NaN)
MAX_LR_SCALE = 1000.0


@dataclass(frozen=True)
class Decision:
    """A policy's answer after a push (or at start).

    ``barrier``: apply the aggregated gradients of the current round now, before any
    step granted here reads the weights, and open the next round.
    ``remove`` / ``restore``: workers leaving / rejoining the membership (Sync-Switch's
    elastic policy, Sync-Switch §IV-B2); a removed worker gets no grants.
    ``lr_scale``: multiplier on the base learning rate for every update from now on,
    sticky (None: unchanged); n for BSP and 1 for ASP (Sync-Switch §IV-C), 1/N in FluentPS.
    ``momentum``: the optimizer's momentum for every update from now on, sticky (None:
    unchanged); an optimizer whose momentum is fixed at build keeps its own.
    ``wake_at``: call ``Policy.on_timer`` at this coordinator time even if nothing is
    pushed (wall-clock rules such as straggler windows).
    ``keep_weights``: keep a copy of the weights and the optimizer's state (on the PS,
    beside them) once this decision's round is applied, before its grants run; it
    replaces the copy kept before. ``undo``: put that copy back, with nothing in flight
    and no round open, before this decision's grants: every update since is undone, the
    counters go back to where they were then, and the pushes since are set aside as a
    rewind sets them aside (auto's failed ASP trial). Without a copy (none was kept, or
    the cluster restarted since) the engine says so and undoes nothing.
    """

    grants: tuple[Grant, ...] = ()
    barrier: bool = False
    remove: frozenset[int] = frozenset()
    restore: frozenset[int] = frozenset()
    lr_scale: float | None = None
    momentum: float | None = None
    wake_at: float | None = None
    keep_weights: bool = False
    undo: bool = False

    def __post_init__(self):  # accept any iterables; store immutable ones
        object.__setattr__(self, "grants", tuple(self.grants))
        object.__setattr__(self, "remove", frozenset(self.remove))
        object.__setattr__(self, "restore", frozenset(self.restore))


NOTHING = Decision()


@dataclass(frozen=True)
class Push:
    """What the server saw: one finished step of one worker.

    Worker clock: ``start`` (its gate opened) and ``end`` (its gradient was computed).
    On the engine (tfsync.engine.step) the weights come with the token, so ``end -
    start`` is the compute of LB-BSP §3.1's t = t_p + t_m, and the pull rides on the
    call that pushes the step before; in the simulator, ``end`` is the push's arrival.
    ``turnaround`` below holds all of it. Coordinator clock: ``granted_at``,
    ``ready_at`` (when the step could start: granted, and the worker's previous push in;
    0: unknown; where the server opened the step's round itself, the arrival less the time
    the server measured from that release to the push: tfsync.engine.pilot) and
    ``arrival``. Never subtract times across the two clocks.
    ``turnaround``: ``arrival - ready_at`` where known, else ``compute_time``: the time the
    step cost the round, including a late start (a worker paused or preempted before its
    gate opened, a slow link), which ``end - start`` misses.
    ``loss`` is the worker's minibatch loss at the weights it read (a proxy of L(w)).
    ``version``: model updates applied when the step read the weights;
    ``pushes_during``: updates applied by other workers while the step ran (RLP
    §3.2 l_n; the staleness of this push).
    """

    worker: int
    step: int  # this worker's step count, 1-based (its "clock" after this push)
    batch_size: int
    start: float
    end: float
    arrival: float
    loss: float
    mode: PushMode = PushMode.APPLY
    round: int = 0  # aggregation round the step was granted in
    dropped: bool = False  # AGGREGATE push whose round had closed when it arrived
    version: int = 0
    pushes_during: int = 0
    granted_at: float = 0.0
    ready_at: float = 0.0

    @property
    def compute_time(self) -> float:
        return max(self.end - self.start, 0.0)

    @property
    def turnaround(self) -> float:
        return max(self.arrival - self.ready_at, 0.0) if self.ready_at > 0 else self.compute_time

    @property
    def samples_per_s(self) -> float:
        return self.batch_size / self.compute_time if self.end > self.start else 0.0


@dataclass(frozen=True)
class ClusterView:
    """The server's view of the cluster, passed to every policy call.

    ``clocks[w]``: steps worker w has pushed. ``granted[w]``: steps granted to w so far
    (so ``granted[w] - clocks[w]`` steps are running or queued). A worker is idle when
    the two are equal. ``round``: the current aggregation round (incremented at every
    barrier); ``pending_workers`` / ``pending_samples``: what the current round has
    aggregated. ``pushes``: all pushes so far (RLP's n); ``updates``: model updates
    applied (a round under BSP, a push under ASP); ``samples``: examples pushed.
    ``now``: coordinator time in seconds. ``active``: the members (None = all).
    ``resources``: latest CPU/memory sample per worker, where a monitor provides them.
    ``history``: recent pushes, newest last (a live sequence: read it, never change it).
    ``remaining``: samples left before the run (or its phase) ends, where the driver knows
    (None: unknown).
    """

    num_workers: int
    clocks: tuple[int, ...]
    granted: tuple[int, ...]
    round: int = 0
    pending_workers: tuple[int, ...] = ()
    pending_samples: int = 0
    pushes: int = 0
    updates: int = 0
    samples: int = 0
    now: float = 0.0
    active: frozenset[int] | None = None
    resources: Mapping[int, object] = field(default_factory=dict, repr=False, compare=False)
    history: Sequence[Push] = field(default=(), repr=False, compare=False)
    remaining: int | None = None

    @property
    def pending(self) -> int:
        return len(self.pending_workers)

    # Derived values are computed once per view. A driver that tracks them incrementally
    # (the simulator, with 1000s of workers) passes them in through ``known``.
    @functools.cached_property
    def members(self) -> frozenset[int]:
        return self.active if self.active is not None else frozenset(range(self.num_workers))

    @functools.cached_property
    def idle(self) -> frozenset[int]:
        return frozenset(w for w in self.members if self.granted[w] == self.clocks[w])

    @functools.cached_property
    def in_flight(self) -> int:
        """Steps granted to members and not yet pushed (running or queued)."""
        return sum(self.granted[w] - self.clocks[w] for w in self.members)

    @functools.cached_property
    def min_clock(self) -> int:
        return min(self.clocks[w] for w in self.members)

    def outstanding(self, worker: int) -> int:
        return self.granted[worker] - self.clocks[worker]

    def known(self, **values) -> "ClusterView":
        """Seed derived values (``members``, ``idle``, ``in_flight``, ``min_clock``) that
        the caller already knows; returns the view."""
        self.__dict__.update(values)
        return self


class BatchSizer:
    """Chooses each worker's batch size. The default gives every worker the same size."""

    def __init__(self, batch_size: int = 32):
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.batch_size = int(batch_size)

    def size(self, worker: int, view: ClusterView) -> int:
        return self.batch_size

    def observe(self, push: Push, view: ClusterView) -> None:
        """Called after every push; adaptive sizers (LB-BSP) learn here."""

    def sizes(self, view: ClusterView) -> dict[int, int]:
        return {w: self.size(w, view) for w in sorted(view.members)}

    def predicted(self, worker: int) -> float | None:
        """The speed (samples/s) this sizer last predicted for ``worker``, for the record
        (LB-BSP); None for a sizer that predicts nothing."""
        return None

    def max_batch(self, workers: int) -> int:
        """The largest batch size this sizer may grant to one of ``workers`` workers (the
        engine's input pipeline holds that many examples per step)."""
        return self.batch_size

    # -- elastic workers ------------------------------------------------------------------
    def resize(self, workers: int) -> None:
        """The job now has ``workers`` workers (0..workers-1): what this sizer keeps per
        worker follows (see ``prepare_resize``); ValueError, changing nothing, where it cannot."""
        self.prepare_resize(workers)()

    def prepare_resize(self, workers: int) -> plainstate.Apply:
        """Check a resize to ``workers``; return what carries it out, changing nothing
        before (a wrapper checks all its parts first). One size for every worker: a new
        worker gets ``batch_size``; nothing else changes."""
        check_resize_count(workers, type(self).__name__)
        return lambda: None

    def describe(self) -> dict:
        return {"name": type(self).__name__, "batch_size": self.batch_size}


def check_resize_count(workers, what: str) -> int:
    """``workers`` as an int; ValueError (one line naming ``what``) unless a whole number >= 1."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"{what} cannot resize to {workers!r} workers: expected a whole number >= 1")
    return workers


class Policy:
    """Base class: safe defaults for every hook. Subclasses override ``on_push``.

    ``name`` is what logs and metrics call the protocol. A policy keeps its own state
    between calls; ``start`` is called once before the first step (and again after a
    switch to it) and must grant the first steps.

    The class attributes after ``name`` are what the protocol catalogue
    (``tfsync.policy.catalogue``) reads once the class is registered.
    """

    name = "policy"
    options: tuple = ()  # Options (tfsync.policy.options) a job file may set
    aggregating = False  # an update averages the members' gradients (BSP): lr x n at a switch
    self_sizing = False  # makes its own sizer from a batch_size argument (no sizer argument)
    keeps_weights = False  # may ask for Decision.keep_weights: the engine makes the copy when a generation opens
    nameable = True  # job files and `tfsync switch --to` may name it
    three_action = None  # its form in RLP's three-action space, if any (tfsync.policy.actions)

    def __init__(self, sizer: BatchSizer | None = None, seed: int | None = None):
        self.sizer = sizer if sizer is not None else BatchSizer()
        self.rng = random.Random(seed)  # the same seed gives the same draws in sim and engine

    # -- events -------------------------------------------------------------------------
    def start(self, view: ClusterView) -> Decision:
        """Begin (or resume after a switch): by default every idle member runs."""
        return Decision(self.grants_for(sorted(view.idle), view))

    def on_push(self, push: Push, view: ClusterView) -> Decision:
        raise NotImplementedError

    def on_worker_lost(self, worker: int, view: ClusterView) -> Decision:
        """A worker died or was removed; its running step is lost. Default: nothing."""
        return NOTHING

    def on_timer(self, view: ClusterView) -> Decision:
        """A ``wake_at`` time has come. Default: nothing."""
        return NOTHING

    def patience(self, view: ClusterView) -> float:
        """Seconds the records of finished steps may wait before this policy hears of them,
        so that the engine takes them in batches (0, the default: at once; a policy that
        decides at each push needs them so). Asked every quarter of a second or so."""
        return 0.0

    def finish(self, view: ClusterView) -> Decision:
        """Training ends: apply whatever is still aggregated."""
        return Decision(barrier=view.pending > 0)

    def steady_round(self, view: ClusterView) -> Decision | None:
        """The decision this policy makes at the end of every round from now on, if it is
        always the same but for batch sizes (a barrier and every member again, in the same
        modes: BSP, LB-BSP), so the server may close and open rounds without asking (the
        engine's PS-run rounds). The policy still sees every push; sizes its round-end
        decisions change reach the server and take effect a round or more later. None (the
        default): it decides at each push."""
        return None

    def set_batch_sizes(self, sizes, max_batch: int) -> None:
        """Grant ``sizes`` (one per worker) from the next grant on, a command's batch sizes;
        ValueError if this policy sizes its own batches or one is above ``max_batch``, the
        input pipeline's largest."""
        from .sizing import FixedSizer  # sizing builds on this module

        if self.self_sizing:
            raise ValueError(f"{self.name} sizes its own batches (from predicted speeds); switch to another "
                             "protocol first to set batch sizes by hand")
        if max(sizes) > max_batch:
            raise ValueError(f"batch size {max(sizes)} exceeds the input pipeline's {max_batch}; set a larger "
                             "batch size in the job to allow it")
        self.sizer = FixedSizer(sizes)

    # -- helpers ------------------------------------------------------------------------
    mode = PushMode.APPLY

    def grants_for(self, workers, view: ClusterView) -> tuple[Grant, ...]:
        """One grant per entry of ``workers`` (repeat a worker to grant several steps);
        the sizer is asked once per decision, so joint rules (sum = X) hold."""
        workers = list(workers)
        if not workers:
            return ()
        sizer = type(self.sizer)
        if sizer.sizes is BatchSizer.sizes and sizer.size is BatchSizer.size:  # one size for all
            return tuple(Grant(w, self.sizer.batch_size, self.mode) for w in workers)
        sizes = self.sizer.sizes(view)
        return tuple(Grant(w, sizes[w], self.mode) for w in workers)

    def max_batch(self, workers: int) -> int:
        """The largest batch size this policy may grant (its sizer's)."""
        return self.sizer.max_batch(workers)

    def predicted_speed(self, worker: int) -> float | None:
        """The speed its sizer predicted for ``worker``'s current step (None: no prediction)."""
        return self.sizer.predicted(worker)

    def stats(self) -> dict:
        """Counters the policy keeps (e.g. FluentPS's delayed pull requests), for summaries."""
        return {}

    # -- elastic workers ------------------------------------------------------------------
    def resize(self, workers: int) -> None:
        """The job now has ``workers`` workers (numbered 0..workers-1), before the policy's
        next start(): per-worker state of workers >= workers is dropped; new workers start
        from a stated prior (each override's docstring says which). ``save_state`` then
        carries the new count. ValueError, with a one-line reason naming the policy and
        changing nothing, where the policy cannot go on with that many workers."""
        self._prepare_resize(workers)()

    def check_resize(self, workers: int) -> None:
        """ValueError (one line) where ``resize(workers)`` would refuse; changes nothing."""
        self._prepare_resize(workers)

    def _prepare_resize(self, workers: int) -> plainstate.Apply:
        """Check a resize; return what carries it out, changing nothing before (wrappers
        check their inner policies first). Default: the sizer's (a new worker gets what
        the sizer gives it; a policy that keeps nothing per worker needs no more)."""
        return self.sizer.prepare_resize(check_resize_count(workers, f"protocol {self.name!r}"))

    # -- state kept across restarts -------------------------------------------------------
    state_version = 1  # the format of save_state's dict; raise it when the format changes

    def save_state(self) -> dict:
        """What this policy learned or counted that later decisions depend on, to write
        beside a checkpoint (its options are not in it: they come from the job file again).

        A dict of JSON's types only (ints, floats, strings, None, lists, dicts with string
        keys; arrays as nested lists, never pickle: run directories may be shared, so
        loading must never execute code), with ``"protocol"`` (this policy's name) and a
        format ``"version"``; ``{}`` for a policy that keeps none. Subclasses implement
        ``_save_state`` and ``_load_state``."""
        body = self._save_state()
        return {} if body is None else {**plainstate.header("protocol", self.name, self.state_version), **body}

    def restore_state(self, state: dict, *, workers: int | None = None) -> None:
        """Take back what ``save_state`` gave, on a fresh policy built with the job's
        options, before its ``start`` (which, as after a switch, rebuilds what depends on
        the live cluster: clocks, rounds, membership are the driver's). ``{}`` is always
        accepted. Raises ValueError, with a one-line reason and restoring nothing, when the
        state does not fit this policy: another protocol, another format version, another
        worker count (``workers``: the job's, checked where the state is per worker),
        another predictor kind or network shape; a non-empty state for a policy that keeps
        none."""
        self._prepare_state(state, workers)()

    def _prepare_state(self, state: dict, workers: int | None = None) -> plainstate.Apply:
        """Check ``state`` and return what applies it (wrappers check their parts first)."""
        if not state:
            return lambda: None
        if type(self)._save_state is Policy._save_state:
            raise ValueError(f"protocol {self.name!r} keeps no state, but a state of protocol "
                             f"{state.get('protocol') if isinstance(state, Mapping) else state!r} was given")
        return self._load_state(plainstate.check(state, "protocol", self.name, self.state_version,
                                                 what=f"protocol {self.name!r}", workers=workers), workers)

    def _save_state(self) -> dict | None:
        """The state's body (beside the header); None: this policy keeps no state."""
        return None

    def _load_state(self, state: dict, workers: int | None) -> plainstate.Apply:
        """Check a state whose header fits; return what applies it, changing nothing before."""
        raise NotImplementedError

    def describe(self) -> dict:
        """Plain-data description for logs and summary.json."""
        return {"name": self.name, "sizer": self.sizer.describe()}


class PolicyError(TfsyncError, RuntimeError):
    """A policy returned a decision the cluster cannot carry out (a bug in the policy)."""


def validate_decision(decision: Decision, members: frozenset[int]) -> None:
    """Raise PolicyError if a decision names non-members or bad batch sizes.

    ``members`` is the membership after the decision's remove/restore."""
    for g in decision.grants:
        if g.worker not in members:
            raise PolicyError(
                f"policy granted a step to worker {g.worker}, which is not a member "
                f"(members: {sorted(members)})"
            )
        if int(g.batch_size) < 1:
            raise PolicyError(f"policy granted batch size {g.batch_size} to worker {g.worker}; must be >= 1")
    if decision.momentum is not None and not 0.0 <= decision.momentum < 1.0:
        raise PolicyError(f"policy set momentum={decision.momentum}; must be in [0, 1)")
    if decision.lr_scale is not None and not (decision.lr_scale > 0 and math.isfinite(decision.lr_scale)):
        raise PolicyError(f"policy set lr_scale={decision.lr_scale}; must be a finite number > 0")
