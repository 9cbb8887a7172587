"""``protocol = "auto"``: the protocol chosen for the user, from how long the workers' steps
take as they go (beyond the papers; issue 54).

It runs LB-BSP while the workers are alike (LB-BSP is then BSP: the even split,
which its guard keeps where uneven sizes do not pay). ASP is put on trial when, for
``hold_s`` seconds (default 2), a worker is ``asp_above`` times slower per sample than the
others' median (default 1.5), or keeps them waiting by that much at the smallest batch
LB-BSP gives it (the sizer's ``floor``) or at the even split LB-BSP's guard holds. LB-BSP
may balance such a worker, and ASP, waiting for no barrier, may still train more samples a
second; which one does is measured, not guessed: after ``1.25 * hold_s`` of ASP, counted
from its first step in (its first quarter left out, the switch's), its samples/s are
compared with LB-BSP's in the ``hold_s`` before the trial. A sample ASP trains is worth
less than one LB-BSP trains: its gradient was taken at weights other workers' updates
have since moved (its staleness, ``Push.pushes_during``), and that grows with the workers. ASP is kept at ``asp_gain +
staleness_cost * s`` times LB-BSP's samples/s or more, ``s`` the trial's mean staleness
(defaults 1.0 and 0.035: 1.1x at a staleness of 3, four workers; 1.25x at 7, eight).
From the 10 ms testbed with one worker at a third of the CPU: at four workers ASP's 1.34x
LB-BSP's samples/s paid (the target accuracy 1.5x sooner); at eight, where ASP trained
1.07x BSP's samples/s and never reached BSP's accuracy, trials still measured 1.4-1.5x
LB-BSP's (whose rounds there are slower than BSP's), so it is the loss watch below, not
this margin, that keeps ASP out there. Else LB-BSP comes back, saying so, and
no ASP trial starts for 10 s (doubling at each trial that did not pay; ``trials`` keeps
the verdicts). Kept, ASP is still watched for progress: should the training loss (the
mean over every push of the last second) stay ``loss_rise`` above the lowest it reached
(default 1.0: twice; counted from ``hold_s`` after the switch: the switch's own
transient, 2.1-2.7x on the testbed at four workers, sent back an ASP that then trained
well) for ``hold_s``, staleness is undoing what ASP's speed brings, and LB-BSP comes back,
with no ASP trial for four times as long as after a trial that did not pay (a divergence
says more than a speed measured at one moment). Nor may the loss stand still:
``progress_s`` (6 s) into ASP, a second's mean (from ``hold_s`` after the switch) must
have come under its mean when ASP began (or within ``HOLDS``, 2 %, of it), or LB-BSP
comes back, with the same block (a CNN ASP's staleness kept at chance on the testbed
never rose to twice its lowest: auto stayed in ASP to the end at 10 % accuracy), nor
go back: from then on, a loss ``LOSS_BACK`` (10 %) above its mean when ASP began for
another ``progress_s`` sends it back too (another seed's loss fell a little, then went
back to chance, and the check at ``progress_s`` had passed). Nor may it fall much slower
than LB-BSP's did: at ``progress_s`` ASP's loss (the mean of its last ``hold_s``) must
have gone ``FALL_SHARE`` (half) of the way to where LB-BSP's pace before the trial would
have taken it (that pace a power law ``t^-a`` fitted to its losses of the ``hold_s``
before it, from when the loss left its first plateau (below), since a loss falls fast
early and slowly later; over longer, a loss flattening towards its floor is taken to fall
on as fast as it fell early: a 6-s fit sent a linear model's paying ASP back; none asked
where LB-BSP would not have fallen ``HOLDS``), or LB-BSP comes
back, with the same block (a CNN's ASP kept its loss 2 % under where it found it for 24
s, at a test accuracy of 0.2-0.28 that LB-BSP took to 0.47). Since
that says nothing while a model sits at its first plateau, no ASP trial starts before
the loss is ``LOSS_FALL`` (10 %) below its first second's mean (the CNN, still at chance
when ASP began 7.6 s in, learned at a fraction of LB-BSP's pace and was kept). And
whatever sends ASP back, if its loss is then a quarter of ``loss_rise`` above its mean
when ASP began, the next trial waits as long (eight workers' ASP took the accuracy from
0.93 to 0.59 in two seconds, went back for the speeds alone, and was tried again 12 s
later). No trial starts that the run would end in, never judged nor undone: with fewer
samples left (``ClusterView.remaining``) than LB-BSP trains in ``progress_s + hold_s`` (a
CNN's second trial began 1.6 s before the run's end, and the run ended in it, at 0.374
test accuracy against LB-BSP's 0.414). And since a trial can send a model back to chance
(a CNN on the testbed went from 0.31 to 0.13 test accuracy and never came back within the
run), a copy of the weights
and the optimizer's state is kept on the PS when ASP begins (``undo``, default on; it
doubles the PS's memory for them): if ASP's training loss (its last ``hold_s``), as its steps
drain, is not ``HOLDS`` under its mean when ASP began, the copy is put back, ASP's updates are
undone and its pushes set aside (``Decision.undo``). At eight workers ASP
at a momentum of 0.9 diverged 3.8-16x within seconds, on the testbed and locally; at four,
a switch's transient reached 1.6x and passed (1.2x, the first default, sent back an ASP
that was training well). In ASP every worker runs the same batch, so the step times compare speeds
directly; once the slowest worker's steps are back under ``back_below`` times the median
(default 1.2) for ``hold_s``, it drains ASP's steps and goes back to LB-BSP; if that
happens before the trial's verdict, no trial starts for the block's time either (at eight
alike workers on two cores, speeds looked uneven under LB-BSP's sizes and even in ASP, and
auto went back and forth every few seconds).
Step times are each push's ``turnaround`` (from when
the step could start to its arrival), summed per worker over the last ``WINDOW_S``
(at least its last ``MIN_STEPS`` steps): what was measured, at the batch it ran, never
extrapolated to another batch (a line fitted on a worker held at one size says nothing).
A window, not an average of the last few steps: under a CPU quota a worker's steps run
at full speed until the period's quota is spent and the next waits for the period's
end, so step times are bimodal, and an exponential average of them swung by 10x (it
took a worker slowed 6x for 6 s to be seen on the testbed, and in ASP saw a worker 3x
slower as "1.2x" and went back to LB-BSP); over a second, ten of the kernel's 100 ms
periods, the sums hold the worker's speed. Switches are hot, as Sync-Switch's greedy
straggler policy's (``tfsync.switch.online``): to ASP at once (what the round aggregated is
applied first; steps of the closed round are dropped), back by a drain. ``lr_scales``:
each protocol's rate factor (the job's configuration policy: n for LB-BSP, 1 for ASP
under ``switch.lr = "linear"``). ``momentum``: the job's (None: the optimizer's momentum is
left alone); ASP runs ``asp_momentum``, by default the job's too. At eight workers ASP
entered mid-run at 0.9 can diverge (the training loss from 0.22 to 3.5 within a second,
the test accuracy from 0.93 to 0.37 on the testbed; 0.925 to 0.595 locally), asynchrony
adding a momentum of its own (Mitliagkas et al., "Asynchrony begets momentum", 2016): the
loss watch above then brings LB-BSP back. A lower momentum in ASP trains on smoothly but
slowly: at 1/n (0.25) four workers ended at 0.921 against 0.963 at 0.9, and at eight 0.125
and 0.025 ended at 0.917 and 0.914 against 0.945.

Every move is kept with its reason (``moves``: time, from, to, why, e.g. "w1 2.9x slower
than the others' median for 2 s: ASP on trial against LB-BSP's 2400 samples/s"), logged,
and in ``stats()``
(summary.json's timeline). SSP is not among its choices: it bounds staleness at a cost BSP
and ASP bracket, and no run here has shown it ahead of both.
"""

from __future__ import annotations

import collections
import logging
import math
import statistics

from ..base import plainstate
from .asp import ASP
from .base import NOTHING, BatchSizer, ClusterView, Decision, Policy, Push, PushMode, check_resize_count
from .lbbsp import LBBSP
from .options import Option

logger = logging.getLogger(__name__)

MODES = ("lbbsp", "asp", "drain")
BLOCK_S = 10.0   # seconds without an ASP trial after one that did not pay (doubling)
WINDOW_S = 1.0   # the steps a worker's speed is measured over: those that arrived in the last second ...
MIN_STEPS = 2    # ... and at least its last two (a worker slower than that)
MIN_LOSSES = 8   # pushes the training loss's mean needs
LOSS_FALL = 0.1  # how far below its first second's mean the loss must be before an ASP trial
LOSS_BACK = 0.1  # how far above its mean when ASP began it may be from progress_s on, for progress_s
HOLDS = 0.02     # a loss within this of where ASP found it holds (late in training it falls slowly)
FALL_SHARE = 0.5  # ASP's loss must go at least this share of the way LB-BSP's pace before it would take it


class _Window:
    """One worker's steps of the last ``WINDOW_S`` (at least its last ``MIN_STEPS``), with
    their sums kept as steps come and go: every push reads them, so none is summed again."""

    __slots__ = ("steps", "busy", "samples")

    def __init__(self):
        self.steps: collections.deque = collections.deque()   # (arrival, batch, turnaround)
        self.busy, self.samples = 0.0, 0

    def add(self, arrival: float, batch: int, turnaround: float) -> None:
        self.steps.append((arrival, batch, turnaround))
        self.busy += turnaround
        self.samples += batch
        while len(self.steps) > MIN_STEPS and self.steps[0][0] < arrival - WINDOW_S:
            _, old_batch, old_turnaround = self.steps.popleft()
            self.busy -= old_turnaround
            self.samples -= old_batch

    @property
    def step_s(self) -> float:
        return self.busy / len(self.steps)

    @property
    def speed(self) -> float:
        return self.samples / self.busy

    @property
    def last_batch(self) -> int:
        return self.steps[-1][1]


class _Loss:
    """The mean training loss over every worker's pushes of the last ``WINDOW_S``, and at
    least its last ``MIN_LOSSES`` (a model of a few steps a second had no mean, and then
    no loss watch), kept as pushes come and go (a push without a loss, as the simulator's
    without a model, is left out)."""

    __slots__ = ("points", "total")

    def __init__(self):
        self.points: collections.deque = collections.deque()   # (arrival, loss)
        self.total = 0.0

    def add(self, arrival: float, loss: float) -> None:
        self.points.append((arrival, loss))
        self.total += loss
        while len(self.points) > MIN_LOSSES and self.points[0][0] < arrival - WINDOW_S:
            self.total -= self.points.popleft()[1]

    @property
    def mean(self) -> float | None:
        """None before ``MIN_LOSSES`` pushes."""
        return self.total / len(self.points) if len(self.points) >= MIN_LOSSES else None


class AutoPolicy(Policy):
    name = "auto"
    self_sizing = True
    aggregating = True   # it starts with LB-BSP: the configuration policy's rate for BSP
    options = (Option("asp_above", float, lo=1, help="how many times slower than the others' median a worker "
                                                       "is (per sample) before ASP is tried"),
               Option("back_below", float, lo=1, help="slowest step / median step (in ASP, batches even) under "
                                                        "which LB-BSP runs again"),
               Option("hold_s", float, lo=0, help="seconds a condition must hold before a move"),
               Option("asp_gain", float, lo=1, help="samples/s ASP must bring over LB-BSP's, as a factor, "
                                                      "to be kept after its trial, at no staleness"),
               Option("staleness_cost", float, lo=0, help="what the factor grows by per update of ASP's mean "
                                                            "staleness"),
               Option("loss_rise", float, lo=0, help="how far above its lowest (a fraction) the training loss "
                                                       "in ASP may stay for hold_s before LB-BSP comes back"),
               Option("progress_s", float, lo=0, help="seconds in which ASP's training loss must come under its "
                                                        "mean when ASP began, nor then stay 10 % above it as long, "
                                                        "or LB-BSP comes back"),
               Option("asp_momentum", float, lo=0, hi=0.999, help="the momentum ASP runs (default: the job's)"),
               Option("undo", bool, help="keep a copy of the weights (on the PS) when ASP begins and put it back "
                                         "if ASP leaves the training loss higher than it found it"))

    def __init__(self, batch_size: int = 32, asp_above: float = 1.5, back_below: float = 1.2,
                 hold_s: float = 2.0, asp_gain: float = 1.0, staleness_cost: float = 0.035,
                 loss_rise: float = 1.0, progress_s: float = 6.0, asp_momentum: float | None = None,
                 undo: bool = True, momentum: float | None = None,
                 lr_scales: dict | None = None,
                 lbbsp: LBBSP | None = None, asp: Policy | None = None, seed: int | None = None):
        self.lbbsp = lbbsp if lbbsp is not None else LBBSP(batch_size)
        self.asp = asp if asp is not None else ASP(BatchSizer(batch_size))
        super().__init__(self.lbbsp.sizer, seed)
        self.asp_above = float(asp_above)
        self.back_below = float(back_below)
        self.steps: dict[int, _Window] = {}   # each worker's recent steps
        if not 1.0 <= self.back_below <= self.asp_above:
            raise ValueError(f"auto: back_below = {back_below} must be in [1, asp_above = {self.asp_above:g}] "
                             "(else it would switch back and forth)")
        self.hold_s = float(hold_s)
        self.lr_scales = dict(lr_scales or {})
        self.momentum = momentum
        self.asp_momentum = asp_momentum
        self.state = "lbbsp"
        self.moves: list[dict] = []
        self._since: float | None = None   # when the condition for the next move began to hold
        self._lapsed: float | None = None  # when it last stopped holding (forgiven for hold_s / 4)
        self.workers: int | None = None
        self.asp_gain = float(asp_gain)
        self.staleness_cost = float(staleness_cost)
        self.loss_rise = float(loss_rise)
        self.loss = _Loss()
        self.first_loss: float | None = None    # the training loss's first second's mean
        self.progress_s = float(progress_s)
        self.undo = self.keeps_weights = bool(undo)
        self.asp_since: float | None = None      # when ASP began (its first step in, on a trial)
        self.start_loss: float | None = None     # the loss's mean then
        self.lowest_loss: float | None = None    # its lowest since, from a hold_s after the switch
        self.back_since: float | None = None     # since when it has been LOSS_BACK above its mean then
        self.began_at: float | None = None       # the first push's arrival (time's origin for the loss's fall)
        self.fell_at: float | None = None        # when the loss's mean first came LOSS_FALL under first_loss
        self.lbbsp_losses: collections.deque = collections.deque()   # (arrival, loss) under LB-BSP since then
        self.asp_losses: collections.deque = collections.deque()     # ... of ASP's last hold_s
        self.pace: tuple[float, float] | None = None   # LB-BSP's loss before the trial (loss_pace)
        # (arrival, batch, staleness)
        self.arrivals: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=8192)
        self.trial: dict | None = None     # ASP on trial: since when, LB-BSP's samples/s before it
        self.trials: list[dict] = []       # every trial's verdict
        self.blocked_until = -math.inf     # no ASP trial before then (after one that did not pay)
        self.next_block = BLOCK_S

    # -- what it watches ------------------------------------------------------------------
    def _observe(self, push: Push) -> None:
        if push.batch_size > 0 and not push.dropped:
            self.arrivals.append((push.arrival, push.batch_size, push.pushes_during))
            if self.began_at is None:
                self.began_at = push.arrival
            if math.isfinite(push.loss):
                self.loss.add(push.arrival, push.loss)
                if self.fell_at is None:
                    self._plateau(push.arrival)
                self._track(push.arrival, push.loss)
        t = push.turnaround
        if t > 0 and push.batch_size > 0:
            self.steps.setdefault(push.worker, _Window()).add(push.arrival, push.batch_size, t)

    def _plateau(self, now: float) -> None:
        """The training loss's first second's mean (``first_loss``, once its mean covers
        ``WINDOW_S`` from the first push), then when its mean first came ``LOSS_FALL``
        under it (``fell_at``): taken on every push (it was taken only when a lagging
        worker asked, so the "first" mean was the one at that moment, and a trial waited
        for the loss to fall 10 % from there)."""
        mean = self.loss.mean
        if mean is None:
            return
        if self.first_loss is None:
            if now - self.began_at >= WINDOW_S:
                self.first_loss = mean
        elif mean <= (1 - LOSS_FALL) * self.first_loss:
            self.fell_at = now

    def _track(self, now: float, loss: float) -> None:
        """Keep LB-BSP's training losses of the last ``hold_s`` from ``fell_at`` on (the
        pace ASP is held to), and ASP's of the last ``hold_s`` (its level, drain included)."""
        if self.state == "lbbsp":
            self.asp_losses.clear()
            if self.fell_at is None:
                return
            track = self.lbbsp_losses
        else:
            self.lbbsp_losses.clear()
            track = self.asp_losses
        track.append((now, loss))
        while track[0][0] < now - self.hold_s:
            track.popleft()

    def loss_pace(self) -> tuple[float, float] | None:
        """How LB-BSP's training loss fell over the losses ``_track`` kept: ``(a, c)`` of a
        power law ``loss = exp(c) * t^-a`` fitted to its losses by least squares (in logs),
        ``t`` counted from the first push. A loss falls fast early and slowly later, so a
        fall per second measured before ASP's trial would ask more of ASP than LB-BSP
        itself would have done after it; along such a curve ``a`` stays. None for fewer
        than ``MIN_LOSSES`` losses, less than ``WINDOW_S`` apart, or a loss not above 0."""
        points = [(t - self.began_at, v) for t, v in self.lbbsp_losses]
        if len(points) < MIN_LOSSES or points[-1][0] - points[0][0] < WINDOW_S or \
                min(t for t, _ in points) <= 0 or min(v for _, v in points) <= 0:
            return None
        xs, ys = [math.log(t) for t, _ in points], [math.log(v) for _, v in points]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        a = -sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        return a, my + a * mx

    def _paced(self, t: float) -> float:
        """The loss LB-BSP's pace before the trial gives at coordinator time ``t``."""
        a, c = self.pace
        return math.exp(c - a * math.log(t - self.began_at))

    def asp_level(self) -> float | None:
        """The mean training loss of ASP's pushes in the last ``hold_s`` (None: none)."""
        losses = [v for _, v in self.asp_losses]
        return statistics.fmean(losses) if losses else None

    def _measured(self, view: ClusterView) -> dict[int, tuple[float, float]] | None:
        """Each member's (mean step time, samples per second of its steps) over the window;
        None until every member has been seen (or with fewer than two)."""
        members = sorted(view.members)
        if len(members) < 2 or any(w not in self.steps for w in members):
            return None
        return {w: (self.steps[w].step_s, self.steps[w].speed) for w in members}

    def slowest(self, view: ClusterView) -> tuple[int, float] | None:
        """(worker, its step time over the median of the others') of the slowest member;
        None until every member has been seen."""
        measured = self._measured(view)
        if measured is None:
            return None
        w = max(measured, key=lambda k: measured[k][0])   # against the others' median (of two: the other's)
        return w, measured[w][0] / statistics.median(v[0] for k, v in measured.items() if k != w)

    def spread(self, view: ClusterView) -> tuple[int, float] | None:
        """(worker, the others' median speed over its speed) of the slowest member by
        samples per second of its steps; None until every member has been seen."""
        measured = self._measured(view)
        if measured is None:
            return None
        w = min(measured, key=lambda k: measured[k][1])
        return w, statistics.median(v[1] for k, v in measured.items() if k != w) / measured[w][1]

    def rate(self, since: float) -> tuple[float, float] | None:
        """(samples per second, mean staleness) of the pushes that arrived from ``since``
        on (None: too few)."""
        points = [p for p in self.arrivals if p[0] >= since]
        if len(points) < 4 or points[-1][0] <= points[0][0]:
            return None
        return (sum(b for _, b, _ in points[1:]) / (points[-1][0] - points[0][0]),
                sum(s for _, _, s in points) / len(points))

    def _beyond_lbbsp(self, worker: int) -> str | None:
        """Why LB-BSP can do no more for ``worker``: it runs LB-BSP's smallest batch (it
        cannot be given less), or LB-BSP's guard holds the even split (its sizes were
        tried, and their rounds were not measured faster than the even split's); None if
        neither."""
        sizer = self.lbbsp.sizer
        last = self.steps[worker].last_batch if worker in self.steps else sizer.batch_size
        if last <= max(1, math.ceil(sizer.floor * sizer.batch_size)):
            return "at the smallest batch LB-BSP gives it"
        if sizer.guard is not None and sizer.guard.hold > 0:
            return "at the even split, LB-BSP's sizes not measured faster"
        return None

    def _held(self, condition: bool, view: ClusterView) -> bool:
        """Whether ``condition`` has held for ``hold_s``, lapses shorter than a quarter of
        it forgiven: a step's time is noisy (a CPU quota stops it at the period's end), and
        a lapse of one push used to start the wait again, so that a worker three times
        slower took most of a minute to be seen."""
        if not condition:
            if self._since is not None and self._lapsed is None:
                self._lapsed = view.now
            if self._lapsed is not None and view.now - self._lapsed > self.hold_s / 4:
                self._since = self._lapsed = None
            return False
        self._lapsed = None
        if self._since is None:
            self._since = view.now
        return view.now - self._since >= self.hold_s

    def _move(self, to: str, view: ClusterView, why: str) -> None:
        logger.info("auto: %s -> %s at %.1f s: %s", self.state, to, view.now, why)
        self.moves.append({"time": round(view.now, 3), "from": self.state, "to": to, "why": why})
        self.state, self._since, self._lapsed = to, None, None
        if to != "drain":   # the other protocol's batches: its step times are not these
            self.steps.clear()

    # -- decisions ------------------------------------------------------------------------
    def hyper(self, mode: str) -> dict:
        """The rate factor and momentum ``mode`` runs with (Decision fields; None: unchanged)."""
        momentum = self.momentum
        if mode == "asp" and self.asp_momentum is not None and momentum is not None:
            momentum = self.asp_momentum
        return {"lr_scale": self.lr_scales.get(mode), "momentum": momentum}

    def start(self, view: ClusterView) -> Decision:
        self.workers = view.num_workers
        mode = "asp" if self.state == "asp" else "lbbsp"
        d = (self.asp if mode == "asp" else self.lbbsp).start(view)
        return Decision(d.grants, barrier=d.barrier, **self.hyper(mode))

    def on_push(self, push: Push, view: ClusterView) -> Decision:
        self.workers = view.num_workers
        self._observe(push)
        if self.state == "lbbsp":
            d = self.lbbsp.on_push(push, view)
        else:
            self.lbbsp.sizer.observe(push, view)   # its predictions stay current for the way back
        slow = self.slowest(view)
        w, ratio = slow if slow else (None, 1.0)
        if self.state == "lbbsp":
            return self._from_lbbsp(w, ratio, view) or d
        if self.state == "asp":
            if self.trial is not None and "first" not in self.trial and push.mode is PushMode.APPLY:
                # ASP's first step in: the trial's clock, and the loss watch's (which saw none of ASP's before)
                self.trial["first"] = self.asp_since = push.arrival
                self.lowest_loss = self.back_since = None
            back, (rising, stalled) = self._trial_verdict(view), self._loss_in_asp(view)
            recovered = ratio < self.back_below
            if back is None and stalled is None and not self._held(recovered or rising is not None, view):
                return self.asp.on_push(push, view)
            by_loss = stalled or (rising if back is None and not recovered else None)
            worse = None if by_loss else self._left_worse()
            if by_loss is not None:   # (the loss says more than a speed measured at one moment)
                self.trial = None
                self._block(view.now, 4)
                back = by_loss + ": back to LB-BSP once ASP's steps are in"
            elif back is None and self.trial is not None:   # before the trial's verdict: a flap
                self.trial = None
                self._block(view.now, 4 if worse else 1)
                back = (f"the slowest worker's steps (w{w}) {ratio:.1f}x the median at ASP's even batches within "
                        "its trial: what looked slow under LB-BSP was its sizes or noise, not a worker; back to "
                        "LB-BSP once ASP's steps are in")
            elif worse is not None:
                self._block(view.now, 4)
            back = back or (f"the slowest worker's steps (w{w}) {ratio:.1f}x the median for {self.hold_s:g} s: "
                            "back to LB-BSP once ASP's steps are in")
            if worse is not None:
                back += f"; {worse}"
            if view.now < self.blocked_until:
                back += f", no trial for {self.blocked_until - view.now:.0f} s"
            self._move("drain", view, back)
        if view.in_flight:
            return NOTHING
        undo = self._undo_asp()
        if undo:
            self.loss = _Loss()   # (ASP's losses were of weights no longer there)
        self._move("lbbsp", view, "ASP's steps drained" + (f"; {undo}" if undo else ""))
        d = self.lbbsp.start(view)
        return Decision(d.grants, barrier=d.barrier, undo=undo is not None, **self.hyper("lbbsp"))

    def _from_lbbsp(self, w: int | None, ratio: float, view: ClusterView) -> Decision | None:
        """ASP on trial, when a worker keeps the others waiting at the smallest batch LB-BSP
        gives it (or at the even split its guard holds), or is ``asp_above`` times slower
        per sample than the others' median (LB-BSP may balance it; whether ASP trains more
        samples a second is measured, not guessed); None: LB-BSP goes on."""
        where = self._beyond_lbbsp(w) if w is not None else None
        spread = self.spread(view)
        slower_w, slower = spread if spread else (None, 1.0)
        beyond = ratio >= self.asp_above and where is not None
        uneven = slower >= self.asp_above
        if not self._held((beyond or uneven) and view.now >= self.blocked_until and self._loss_fell(), view):
            return None
        measured = self.rate(view.now - self.hold_s)
        lbbsp_rate = measured[0] if measured else None
        if view.remaining is not None and lbbsp_rate and view.remaining < lbbsp_rate * (self.progress_s + self.hold_s):
            self._since = None   # a trial the run would end in, never judged nor undone (waited for again)
            return None
        if beyond:
            why = f"w{w}'s steps {ratio:.1f}x the median {where}, for {self.hold_s:g} s: more than LB-BSP can balance"
        else:
            why = f"w{slower_w} {slower:.1f}x slower than the others' median for {self.hold_s:g} s"
        why += f": ASP on trial against LB-BSP's {lbbsp_rate or 0:.0f} samples/s"
        self.trial = {"since": view.now, "lbbsp_rate": lbbsp_rate}
        self.start_loss, self.lowest_loss, self.asp_since, self.back_since = self.loss.mean, None, view.now, None
        self.pace = self.loss_pace()
        self._move("asp", view, why)
        a = self.asp.start(view)
        return Decision(a.grants, barrier=view.pending > 0, keep_weights=self.undo, **self.hyper("asp"))

    def _trial_verdict(self, view: ClusterView) -> str | None:
        """After ``hold_s`` of ASP on trial (its first quarter left out: the switch), its
        samples/s against LB-BSP's before it: kept at ``asp_gain`` times or more; else why
        LB-BSP comes back (and no trial for a doubling time). The trial's time counts from
        ASP's first step in: a switch on the testbed took up to 3 s to bring it (the copy
        of the weights kept, the first grants), and a verdict 2.5 s after the switch
        measured LB-BSP's last pushes as ASP's (89 samples/s against LB-BSP's 803)."""
        t = self.trial
        if t is None or "first" not in t or view.now - t["first"] < 1.25 * self.hold_s:
            return None
        self.trial = None
        measured = self.rate(t["first"] + 0.25 * self.hold_s)
        if not t["lbbsp_rate"] or not measured:
            return None
        asp_rate, staleness = measured
        gain, needed = asp_rate / t["lbbsp_rate"], self.asp_gain + self.staleness_cost * staleness
        kept = gain >= needed
        self.trials.append({"time": round(view.now, 3), "asp_rate": round(asp_rate, 1),
                            "lbbsp_rate": round(t["lbbsp_rate"], 1), "staleness": round(staleness, 2),
                            "needed": round(needed, 3), "kept": kept})
        if kept:
            self.next_block = BLOCK_S
            return None
        self._block(view.now)
        return (f"ASP trained {gain:.2f}x LB-BSP's samples/s ({asp_rate:.0f} against {t['lbbsp_rate']:.0f}), under "
                f"the {needed:.2f}x its staleness of {staleness:.1f} updates asks: back to LB-BSP once ASP's steps "
                "are in")

    def _block(self, now: float, times: float = 1) -> None:
        """No ASP trial for the next ``times x next_block`` seconds; ``next_block`` then doubles."""
        self.blocked_until, self.next_block = now + times * self.next_block, 2 * self.next_block

    def _loss_fell(self) -> bool:
        """Whether the training loss's mean has been ``LOSS_FALL`` below its first second's
        (True where no loss is reported): ASP is judged by whether its loss falls, which says
        nothing while a model sits at its first plateau (a CNN at chance for its first
        seconds went to ASP there, learned at a fraction of BSP's pace and was kept)."""
        return self.fell_at is not None or self.loss.mean is None

    def _loss_in_asp(self, view: ClusterView) -> tuple[str | None, str | None]:
        """(why ASP loses ground, why it makes none), from the training loss's mean once ASP
        has run ``hold_s`` (a window of its pushes alone: the switch's transient, up to
        2.7x on the testbed at four workers, is left out): ``loss_rise`` above the lowest
        it reached since; ``progress_s`` into ASP, never under its mean when ASP began (or
        within ``HOLDS`` of it), or, from then on, ``LOSS_BACK`` above it for another
        ``progress_s`` (a regression as lasting as the progress ASP had to show, not the
        noise of a second's mean: on a linear model's real pushes it rose 47 % above for
        2 s). None for each while it is not so, or no loss is reported. A model ASP's
        staleness sends back to chance (a CNN at four workers) never rose to twice its
        lowest: it never fell, or (another seed) fell a little first, then went back to
        chance, 0.28 to 0.10 test accuracy, and stayed in ASP to the end. And once, at
        ``progress_s``: ASP's loss (its mean over its last ``hold_s``) under ``FALL_SHARE``
        of the way to where LB-BSP's pace before the trial (``loss_pace``) would have taken
        it (a third seed's held 2 % under where ASP found it, at a test accuracy LB-BSP was
        leaving behind)."""
        if self.asp_since is None:   # (ASP resumed from a saved state: watched from now)
            self.asp_since = view.now
        if self.trial is not None and "first" not in self.trial:   # (LB-BSP's last steps, not ASP's)
            return None, None
        if view.now < self.asp_since + self.hold_s:
            return None, None
        mean = self.loss.mean
        if mean is not None and (self.lowest_loss is None or mean < self.lowest_loss):
            self.lowest_loss = mean
        rising = stalled = None
        start, best = self.start_loss, self.lowest_loss
        judged = start is not None and view.now >= self.asp_since + self.progress_s
        if mean is not None and mean > self.lowest_loss * (1 + self.loss_rise):
            rising = (f"the training loss in ASP {mean:.3g}, {mean / self.lowest_loss:.2f}x the lowest it reached "
                      f"({self.lowest_loss:.3g}), for {self.hold_s:g} s: staleness undoes what ASP's speed brings")
        back = judged and mean is not None and mean > (1 + LOSS_BACK) * start
        self.back_since = (view.now if self.back_since is None else self.back_since) if back else None
        if judged and (best is None or best > (1 + HOLDS) * start):
            stalled = (f"the training loss in ASP not under {start:.3g}, its mean when ASP began, in "
                       f"{self.progress_s:g} s ({'none measured' if best is None else f'{best:.3g} at best'}): "
                       "staleness undoes what ASP's speed brings")
        elif judged and self.pace is not None:   # once, at progress_s
            level, then = self.asp_level(), view.now - self.hold_s / 2   # (the middle of its window)
            began, paced = self._paced(self.asp_since), self._paced(then)
            if level is not None and began - paced >= HOLDS * began and began - level < FALL_SHARE * (began - paced):
                stalled = (f"the training loss in ASP {level:.3g} over its last {self.hold_s:g} s, under "
                           f"{FALL_SHARE:g} of the way from {began:.3g} to the {paced:.3g} LB-BSP's pace before it "
                           f"(as t^-{self.pace[0]:.2g}) reaches: staleness undoes what ASP's speed brings")
            self.pace = None
        if stalled is None and back and view.now - self.back_since >= self.progress_s:
            stalled = (f"the training loss in ASP {mean:.3g}, {mean / start:.2f}x its mean when ASP began "
                       f"({start:.3g}), above it for {self.progress_s:g} s: staleness undoes what ASP's speed "
                       "brings")
        return rising, stalled

    def _left_worse(self) -> str | None:
        """On leaving ASP: why it is to be tried less (the training loss's mean above its
        mean when ASP began, by more than ``loss_rise`` / 4); None if not (or no loss)."""
        mean, start = self.loss.mean, self.start_loss
        if mean is None or start is None or mean <= start * (1 + self.loss_rise / 4):
            return None
        return f"the training loss {mean / start:.2f}x its mean when ASP began ({mean:.3g} against {start:.3g})"

    def _undo_asp(self) -> str | None:
        """Why ASP's updates are undone, as it drains (``undo``): its training loss did not
        end ``HOLDS`` under its mean when ASP began, so the weights kept then are put back;
        None if it did (or no loss). A CNN that ASP sent back to chance on the testbed never
        regained LB-BSP's accuracy within the run; another's ASP ended with its training
        loss 1 % above where it began, its test accuracy at chance (0.10 from 0.24) and,
        not undone then, 0.27 at the end against LB-BSP's 0.43: a training loss that held
        says nothing of weights the kept ones are not known to beat."""
        mean, start = self.asp_level(), self.start_loss
        if not self.undo or mean is None or start is None or mean <= start * (1 - HOLDS):
            return None
        return (f"ASP's updates undone: its training loss ended at {mean:.3g} (its last {self.hold_s:g} s), not "
                f"{HOLDS:.0%} under its {start:.3g} when ASP began (the weights kept then are put back)")

    def steady_round(self, view: ClusterView) -> Decision | None:
        """LB-BSP's steady rounds (the PS may run them) while no move is in the making."""
        if self.state != "lbbsp" or self._since is not None:
            return None
        return self.lbbsp.steady_round(view)

    def patience(self, view: ClusterView) -> float:
        return self.asp.patience(view) if self.state == "asp" else 0.0

    def max_batch(self, workers: int) -> int:
        return max(self.lbbsp.max_batch(workers), self.asp.max_batch(workers))

    def stats(self) -> dict:
        return {"moves": list(self.moves), "trials": list(self.trials), "lbbsp": self.lbbsp.stats()}

    def describe(self) -> dict:
        return {"name": self.name, "asp_above": self.asp_above, "back_below": self.back_below,
                "hold_s": self.hold_s, "asp_gain": self.asp_gain, "staleness_cost": self.staleness_cost,
                "loss_rise": self.loss_rise, "progress_s": self.progress_s, "asp_momentum": self.asp_momentum,
                "undo": self.undo, "momentum": self.momentum,
                "lbbsp": self.lbbsp.describe(),
                "asp": self.asp.describe()}

    # -- elastic workers and state ---------------------------------------------------------
    def _prepare_resize(self, workers: int) -> plainstate.Apply:
        """LB-BSP's and ASP's resizes (either may refuse); the mode and the moves go on."""
        check_resize_count(workers, "protocol 'auto'")
        parts = [self.lbbsp._prepare_resize(workers), self.asp._prepare_resize(workers)]

        def apply():
            for part in parts:
                part()
            self.workers, self._since = workers, None
        return apply

    def _save_state(self) -> dict:
        return {"workers": self.workers, "mode": self.state, "moves": self.moves, "trials": self.trials,
                "blocked_until": self.blocked_until if math.isfinite(self.blocked_until) else None,
                "next_block": self.next_block, "first_loss": self.first_loss,
                "lbbsp": self.lbbsp.save_state(), "asp": self.asp.save_state()}

    def _load_state(self, state: dict, workers: int | None) -> plainstate.Apply:
        what = "protocol 'auto'"
        mode = plainstate.field(state, "mode", what)
        if mode not in MODES:
            raise ValueError(f"{what}: the saved mode {mode!r} is none of {', '.join(MODES)}")
        inner = [getattr(self, k)._prepare_state(plainstate.field(state, k, what), workers) for k in ("lbbsp", "asp")]
        moves = state.get("moves", [])
        if not isinstance(moves, list) or not all(isinstance(m, dict) for m in moves):
            raise ValueError(f"{what}: the saved moves are malformed")

        def apply():
            for part in inner:
                part()
            # a drain is not resumed: the restored run starts its protocol afresh
            self.state, self.moves, self._since = ("lbbsp" if mode == "drain" else mode), list(moves), None
            self.workers = state.get("workers")
            self.trials = list(state.get("trials", []))   # (none saved before 2026-11-29)
            blocked = state.get("blocked_until")
            self.blocked_until = -math.inf if blocked is None else float(blocked)
            self.next_block = float(state.get("next_block", BLOCK_S))
            first = state.get("first_loss")   # (none saved before 2026-11-30: measured again)
            self.first_loss = None if first is None else float(first)
            self.trial = None   # a trial in progress is not resumed: the restored run measures afresh
        return apply

