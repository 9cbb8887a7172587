"""Sync-Switch's online straggler policies (Sync-Switch §IV-B2), active only before the
switch point: after it the job runs ASP, which the paper considers immune to transient
stragglers. Both wrap an inner BSP and ASP policy and a :class:`StragglerDetector`.

``bsp_samples`` is the switch point of the timing plan, in samples (e.g. 0.5 * total
samples); once the run has trained that many (ASP steps taken during a straggler count:
the switch point is a position in the workload), the policy switches to ASP for good, at
a round boundary. ``None``: never (BSP for the whole run, still straggler-aware).

Greedy: while a straggler is present run ASP; once none is left and BSP workload
remains, go back to BSP. BSP -> ASP is immediate: the round's aggregated gradients are
applied (``barrier=True``) before any ASP step reads the weights; BSP steps still running
then arrive in a closed round and are reported ``dropped`` (their gradient is discarded,
as in drop-stragglers; the push itself is never lost). ASP -> BSP drains: no new grants
until every granted ASP step has pushed, then the first BSP round starts.

Elastic: remove detected stragglers from the BSP membership (``Decision.remove``) and
restore them (``Decision.restore``) at the switch point, when they recover, or
``readmit_after_s`` after removal. A removed worker pushes nothing, so the detector
cannot see it recover; readmission after the paper's maximum transient slowdown
(§IV-B2 assumes ~100 s, the time to provision a replacement server) is how it gets
another chance; if it is still slow it is detected and removed again.

State (``save_state``): the mode (bsp, asp, drain, final), the BSP samples done, the
detector's windows and counters, the inner policies' states, the removed workers with
their removal times, and the timeline and membership records. Removal times and the
detector's window grid are coordinator times: after a restore they are shifted by the
time the job was down (tfsync.base.plainstate.Rebase), so a worker removed 80 s before a
checkpoint gets its readmission 20 s after the resume, not at once.
"""

from __future__ import annotations

import dataclasses
import logging

from ..base import plainstate
from ..policy.asp import ASP
from ..policy.base import NOTHING, ClusterView, Decision, Policy, Push, PushMode, check_resize_count
from ..policy.bsp import BSP
from ..policy.catalogue import register
from .stragglers import StragglerDetector, too_few_to_detect

logger = logging.getLogger(__name__)


class _StragglerAware(Policy):
    # In the catalogue, but not nameable in a [[protocol]] entry or `tfsync switch --to`:
    # they need a StragglerDetector and inner BSP / ASP policies, objects a job file cannot
    # give; its [switch] section (stragglers = greedy | elastic) selects them instead
    # (tfsync.cli.jobrun.straggler_phase).
    nameable = False

    def __init__(self, detector: StragglerDetector, bsp_samples: int | None = None, *,
                 bsp: Policy | None = None, asp: Policy | None = None, lr_scales: dict | None = None):
        self.bsp = bsp if bsp is not None else BSP()
        self.asp = asp if asp is not None else ASP()
        super().__init__(self.bsp.sizer)
        if not isinstance(detector, StragglerDetector):
            raise TypeError(f"detector {detector!r}: expected a StragglerDetector(window_s, k)")
        if bsp_samples is not None and int(bsp_samples) < 0:
            raise ValueError(f"bsp_samples = {bsp_samples!r}: must be >= 0 or None (BSP until the end)")
        self.detector = detector
        self.bsp_samples = None if bsp_samples is None else int(bsp_samples)
        self.lr_scales = dict(lr_scales or {})  # e.g. {"bsp": n, "asp": 1.0} (§IV-C)
        self.bsp_done = 0  # samples aggregated under BSP
        self.state = "bsp"
        self.timeline: list[tuple[float, str]] = []  # (time, protocol entered)
        self.switches = 0
        self.workers: int | None = None  # the cluster's size, from the views seen
        self._clock = plainstate.Rebase()

    def budget_done(self, view: ClusterView) -> bool:
        """The planned switch point is reached: ``bsp_samples`` is a position in the
        workload, so samples trained with ASP during a straggler count toward it too
        (else a run with a large BSP share ends before its ASP phase)."""
        return self.bsp_samples is not None and max(self.bsp_done, view.samples) >= self.bsp_samples

    def _enter(self, state: str, view: ClusterView) -> None:
        if state != self.state:
            self.switches += 1
            logger.debug("%s: %s -> %s at %.3f (stragglers %s, BSP samples %d)", self.name, self.state,
                         state, view.now, sorted(self.detector.stragglers), self.bsp_done)
        self.state = state
        self.timeline.append((view.now, state))

    def on_push(self, push: Push, view: ClusterView) -> Decision:
        self._see(view)
        self._observe(push)
        return self._step(view, push)

    def on_timer(self, view: ClusterView) -> Decision:
        self._see(view)
        self.detector.advance(view.now)
        return self._step(view, None)

    def finish(self, view: ClusterView) -> Decision:
        self._see(view)
        return super().finish(view)

    def _see(self, view: ClusterView) -> None:
        self.workers = view.num_workers
        shift = self._clock.seen(view.now)
        if shift:
            self._shift(shift)

    def _shift(self, seconds: float) -> None:
        """Move restored coordinator times ``seconds`` later (see the module docstring);
        records of what happened (timeline, events) keep their times."""
        self.detector.shift(seconds)

    def _step(self, view: ClusterView, push: Push | None) -> Decision:
        raise NotImplementedError

    def _observe(self, push: Push) -> None:
        self.detector.observe(push)
        if push.mode is PushMode.AGGREGATE and not push.dropped:
            self.bsp_done += push.batch_size

    def _to_asp(self, view: ClusterView, final: bool = False, **changes) -> Decision:
        self._enter("final" if final else "asp", view)
        d = self.asp.start(view)
        return Decision(d.grants, barrier=view.pending > 0, lr_scale=self.lr_scales.get("asp"), **changes)

    def _to_bsp(self, view: ClusterView) -> Decision:
        self._enter("bsp", view)
        d = self.bsp.start(view)
        return Decision(d.grants, barrier=d.barrier, lr_scale=self.lr_scales.get("bsp"))

    @property
    def running(self) -> str:
        """The protocol it runs now: "bsp", or "asp" while a straggler is seen and after the
        switch point (the rate factor in force is ``lr_scales``' for it)."""
        return "bsp" if self.state == "bsp" else "asp"

    def start(self, view: ClusterView) -> Decision:
        self._see(view)
        self.timeline.append((view.now, self.state))
        if self.state == "bsp":
            d = self.bsp.start(view)
            return Decision(d.grants, barrier=d.barrier, lr_scale=self.lr_scales.get("bsp"))
        d = self.asp.start(view)
        return Decision(d.grants, barrier=d.barrier, lr_scale=self.lr_scales.get("asp"))

    def steady_round(self, view: ClusterView) -> Decision | None:
        """BSP's steady round while it runs BSP and sees no straggler, before its switch
        point: the PS may run those rounds (tfsync.engine.pilot); a detection or the switch
        point halts them after the round in flight, and the decision is carried out then."""
        if self.state != "bsp" or self.detector.stragglers or self.budget_done(view):
            return None
        return self.bsp.steady_round(view)

    def max_batch(self, workers: int) -> int:
        return max(self.bsp.max_batch(workers), self.asp.max_batch(workers))

    def stats(self) -> dict:
        """Counts and, with times as given in the view (the engine's: epoch seconds), the
        protocol timeline and the detector's events."""
        return {"switches": self.switches, "bsp_samples_done": self.bsp_done,
                "straggler_events": len(self.detector.events),
                "states": [[round(t, 3), state] for t, state in self.timeline],
                "detected": [[round(e.time, 3), e.worker, e.kind] for e in self.detector.events]}

    # -- elastic workers -------------------------------------------------------------------
    def _prepare_resize(self, workers: int) -> plainstate.Apply:
        """The inner BSP and ASP policies resize (either may refuse), then the detector:
        workers >= ``workers`` leave its open windows, counters and straggler marks. Prior:
        a new worker is not a straggler and has no counts; the mode (BSP, ASP, drain,
        final), the BSP samples done and the records (timeline, events) go on."""
        check_resize_count(workers, f"protocol {self.name!r}")
        parts = [self.bsp._prepare_resize(workers), self.asp._prepare_resize(workers)]
        if self.sizer is not self.bsp.sizer and self.sizer is not self.asp.sizer:  # set by a command
            parts.append(self.sizer.prepare_resize(workers))

        def apply():
            for part in parts:
                part()
            self.detector.resize(workers)
            self.workers = workers
            if workers < self.detector.min_workers:   # said, not silent: the policy runs as its BSP or ASP
                logger.warning(too_few_to_detect(self.name, workers, self.detector.min_workers))
        return apply

    # -- state ----------------------------------------------------------------------------
    MODES = ("bsp", "asp", "drain", "final")

    def _save_state(self) -> dict:
        return {"workers": self.workers, "now": self._clock.now, "mode": self.state, "bsp_done": self.bsp_done,
                "switches": self.switches, "timeline": [[t, s] for t, s in self.timeline],
                "detector": self.detector.save_state(), "bsp": self.bsp.save_state(),
                "asp": self.asp.save_state()}

    def _load_state(self, state: dict, workers: int | None) -> plainstate.Apply:
        what = f"protocol {self.name!r}"
        mode = plainstate.field(state, "mode", what)
        if mode not in self.MODES:
            raise ValueError(f"{what}: the saved mode {mode!r} is none of {', '.join(self.MODES)}")
        inner = [getattr(self, k)._prepare_state(plainstate.field(state, k, what), workers) for k in ("bsp", "asp")]
        try:
            detector = self.detector.load_state(plainstate.field(state, "detector", what))
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
        try:
            now = state.get("now")
            now = None if now is None else float(now)
            values = dict(state=mode, bsp_done=int(state.get("bsp_done", 0)), switches=int(state.get("switches", 0)),
                          timeline=[(float(t), str(s)) for t, s in state.get("timeline", [])],
                          workers=state.get("workers"))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{what}: the saved counters are malformed ({e})") from None

        def apply():
            for part in inner + [detector]:
                part()
            self.__dict__.update(values)
            self._clock.owe(now)
        return apply

    def describe(self) -> dict:
        return {"name": self.name, "bsp": self.bsp.describe(), "asp": self.asp.describe(),
                "bsp_samples": self.bsp_samples, "window_s": self.detector.window_s, "k": self.detector.k}


class GreedyStragglerPolicy(_StragglerAware):
    """ASP while a straggler is present, BSP otherwise, until the BSP workload is done."""

    name = "sync_switch_greedy"

    def _step(self, view: ClusterView, push: Push | None) -> Decision:
        stragglers = self.detector.stragglers
        if self.state == "bsp":
            if self.budget_done(view) and view.in_flight == 0:
                return self._to_asp(view, final=True)  # the planned switch, at a round boundary
            if stragglers and not self.budget_done(view):
                return self._to_asp(view)
            return self.bsp.on_push(push, view) if push is not None else NOTHING
        if self.state in ("asp", "drain") and self.budget_done(view):
            self._enter("final", view)  # the switch point passed while away from BSP: ASP for good
            return self.asp.start(view)
        if self.state == "asp" and not stragglers and not self.budget_done(view):
            self._enter("drain", view)  # stop granting; BSP starts once every ASP step is in
        if self.state == "drain":
            if stragglers:  # a straggler again before the drain ended: back to ASP
                self._enter("asp", view)
                return self.asp.start(view)
            return self._to_bsp(view) if view.in_flight == 0 else NOTHING
        return self.asp.on_push(push, view) if push is not None else NOTHING


class ElasticStragglerPolicy(_StragglerAware):
    """BSP without the detected stragglers, all workers back for ASP."""

    name = "sync_switch_elastic"

    def __init__(self, detector: StragglerDetector, bsp_samples: int | None = None, *,
                 readmit_after_s: float | None = 100.0, max_removed: int | None = None, **kwargs):
        super().__init__(detector, bsp_samples, **kwargs)
        if readmit_after_s is not None and not readmit_after_s > 0:
            raise ValueError(f"readmit_after_s = {readmit_after_s!r}: must be > 0 seconds or None (never)")
        self.readmit_after_s = readmit_after_s
        self.max_removed = max_removed
        self.removed: dict[int, float] = {}  # worker -> time removed
        self.membership: list[tuple[float, str, int]] = []  # (time, "remove"|"restore", worker)

    def _step(self, view: ClusterView, push: Push | None) -> Decision:
        if self.state == "final":
            return self.asp.on_push(push, view) if push is not None else NOTHING
        if self.budget_done(view) and view.in_flight == 0:  # the planned switch: everyone back, ASP
            restore = frozenset(self.removed)
            self._log(view, "restore", restore)
            self.removed.clear()
            full = dataclasses.replace(view, active=view.members | restore)
            return self._to_asp(full, final=True, restore=restore)
        remove, restore = self._changes(view)
        if not remove and not restore:
            return self.bsp.on_push(push, view) if push is not None else NOTHING
        members = (view.members - remove) | restore
        changed = dataclasses.replace(view, active=members)
        d = self.bsp.on_push(push, changed) if push is not None else NOTHING
        if not d.grants and changed.in_flight == 0:  # e.g. the removed worker was the last one out
            d = Decision(self.bsp.grants_for(sorted(members), changed), barrier=True)
        wake = None
        if remove and self.readmit_after_s is not None:
            wake = view.now + self.readmit_after_s
        return Decision(d.grants, d.barrier, remove=remove, restore=restore, wake_at=wake)

    def steady_round(self, view: ClusterView) -> Decision | None:
        return None if self.removed else super().steady_round(view)   # (every worker in)

    def _changes(self, view: ClusterView) -> tuple[frozenset[int], frozenset[int]]:
        stragglers = self.detector.stragglers
        restore = set()
        for w, since in self.removed.items():
            # since + readmit_after_s, as wake_at was computed: now - since may round below it
            due = self.readmit_after_s is not None and view.now >= since + self.readmit_after_s
            if (w not in stragglers or due) and view.outstanding(w) == 0:  # never wait on its old step
                restore.add(w)
        for w in restore:
            del self.removed[w]
            self.detector.forget(w)
        limit = len(view.members) - 1 if self.max_removed is None else self.max_removed - len(self.removed)
        # (a worker removed already is left alone: the membership in the view lags while the
        # removal waits for the PS's round in flight, tfsync.engine.pilot)
        remove = [w for w in sorted(stragglers)
                  if w in view.members and w not in restore and w not in self.removed][:max(limit, 0)]
        for w in remove:
            self.removed[w] = view.now
        self._log(view, "remove", remove)
        self._log(view, "restore", restore)
        return frozenset(remove), frozenset(restore)

    def _shift(self, seconds: float) -> None:
        super()._shift(seconds)
        self.removed = {w: t + seconds for w, t in self.removed.items()}

    def _prepare_resize(self, workers: int) -> plainstate.Apply:
        """As the other straggler policy's; refused while it holds workers out of the BSP
        membership (a resized job starts with every worker a member, which would leave
        its removals and the membership disagreeing). Prior: a new worker is a member."""
        if self.removed:
            raise ValueError(f"protocol {self.name!r} cannot resize now: it holds worker(s) {sorted(self.removed)} "
                             "out of the membership; resize once they are members again")
        return super()._prepare_resize(workers)

    def _save_state(self) -> dict:
        return {**super()._save_state(), "removed": plainstate.str_keys(self.removed),
                "membership": [list(m) for m in self.membership]}

    def _load_state(self, state: dict, workers: int | None) -> plainstate.Apply:
        base = super()._load_state(state, workers)
        try:
            removed = plainstate.int_keys(state.get("removed", {}), float)
            membership = [(float(t), str(what), int(w)) for t, what, w in state.get("membership", [])]
        except (TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"protocol {self.name!r}: the saved removals are malformed ({e})") from None

        def apply():
            base()
            self.removed, self.membership = removed, membership
        return apply

    def _log(self, view: ClusterView, what: str, workers) -> None:
        for w in sorted(workers):
            self.membership.append((view.now, what, w))
            logger.debug("%s: %s worker %d at %.3f", self.name, what, w, view.now)

    def stats(self) -> dict:
        return {**super().stats(), "removals": sum(1 for _, what, _ in self.membership if what == "remove"),
                "membership": [[round(t, 3), what, w] for t, what, w in self.membership]}

    def describe(self) -> dict:
        return {**super().describe(), "readmit_after_s": self.readmit_after_s, "max_removed": self.max_removed}


register(GreedyStragglerPolicy)
register(ElasticStragglerPolicy)
