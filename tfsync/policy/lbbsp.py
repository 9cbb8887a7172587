"""LB-BSP: BSP whose per-worker batch sizes equalise the workers' iteration
times, with the batch-size-weighted mean of eq. 8 at the barrier (the engine and the
simulator already aggregate AGGREGATE pushes that way) and the round total kept at
X = n * batch_size, so every round processes as many samples as BSP (§3.4).

``LBBSPSizer`` keeps one speed predictor per worker (``tfsync.predict``; EMA by default,
NARX as in the paper), fed by every push: speed = batch / the push's ``turnaround`` (from
when it could start to its arrival: a worker paused or preempted before its gate opened
is slow there, where ``end - start`` on the worker missed it and a paused worker got the
larger share), with CPU and
memory from ``view.resources[w]`` where a monitor provides them (the last reading at push
time; what the engine and the simulator put there: tfsync.sim.monitor). Sizes come from the CPU
rule (§3.2, proportional to predicted speeds) or, given per-worker GPU profiles, from
the GPU rule (§3.3, a linear program; communication time as an EMA of the part of an
iteration the profile does not explain). A ``Hysteresis`` keeps sizes that are not
worth changing (tfsync.batching.hysteresis).

``model="affine"`` (the default, beyond the paper, CPU rule only; ``"proportional"`` is
the paper's): a worker's step time is a + b * x, not x / v. Part of a step does not shrink with the batch (a pull and push over a slow
link; per-step overheads, which a slow CPU slows too), so under x / v a smaller batch
saves less than predicted and the sizes reach equal times only over many rounds, or
stop short of them inside the hysteresis. A least-squares line over each worker's last
steps (``tfsync.batching.stepfit``) says which share of a step is fixed; the predictor
learns and predicts the worker's speed at the configured batch size B (each step's time
scaled along that line, so a batch LB-BSP changed does not look like the worker changing
speed; NARX's resource inputs and trends act on this level), and ``affine_rule``
equalises the lines. Until a worker's batches have differed (the first round's equal
split) its share is 0: the proportional rule.

``guard`` (beyond the paper, default on): sizes that leave the even split are a trial,
kept only while the rounds they bring are measured faster than the even split's, and
checked again from time to time (``tfsync.batching.guard``); where a model of a step's time is wrong (a CPU quota's cliff,
noise between alike workers), LB-BSP then runs BSP's even split instead of slower rounds.
Its measurements start again after a restart or a resize.

``hi``: the largest batch a worker is given; by default, with the CPU rule, twice the even
one (``HI_SHARE``). Every step's input holds that many rows, of which the step takes the
first ``batch``: the input pipeline's work grows with ``hi``, not with the batch run. With
no cap, 8 workers of 64 read 505 rows a step for the 64 they trained, and on the 8-worker
testbed at 0.33 CPU a worker LB-BSP ran 1.35x BSP's time per update even at the even
split; at twice the even batch, 0.97x. Twice covers the common cases (one worker a third
as fast among four: the others take 1.22x); a worker faster than that is capped, and the
guard judges what the capped sizes bring. Set ``hi`` for more.

``floor`` (beyond the paper, default 0.25): no worker's batch below that share of the even
split. Under t = x / v, a worker whose batch got small measures itself slow (the step's
fixed part no longer hidden by samples) and is sized smaller still: a trap a transient
slowdown, or noise, puts it in for good. See ``_floors``.

Modes (§4, Fig. 7): ``blocking=True`` sizes round r+1 at the barrier of round r from
that round's observations (the paper's CPU clusters). ``blocking=False`` grants sizes
computed one round earlier, so the barrier never waits for prediction: round r+1 uses
the predictions made after round r-1 (the paper's GPU clusters). With
``background=True`` the rule itself (the linear program, for GPU profiles) runs in one
background thread on a snapshot of the predictions (one plan in the making at a time);
a plan not ready at a barrier is not waited for: the previous one is granted again
(``late_plans`` counts these). Without it the lagged plan is computed on the
coordinator right after the grants, which keeps the simulator deterministic.

Off the barrier's critical path (beyond the paper, issue 19): a worker's next speed is
predicted when its own push is observed, while the others still compute, and kept; the
barrier only runs the rule on the kept predictions. A worker's prediction depends only on
its own observations, so it is the one the barrier would compute, except that a NARX fit
finishing in between takes effect at that worker's next push. At 96 workers the barrier
then costs the rule alone, not 96 predictions (experiments/bench_sizing_overhead.py).

State (``save_state``): each worker's predictor (what it learned, ``tfsync.predict``), the
predictions kept from the last pushes, the communication-time EMAs, the sizes granted and
the plan for the next round (non-blocking), and the hysteresis and late-plan counters; a
plan still being made in the background is not waited for (the restored sizer makes the
next one). Timings of this process (``stats()``) start again.

``stats()``: time per sizing decision and per observation (predictor update and the
next prediction), and ``share``, the fraction of wall time since the first push spent in both (meaningful on
a real cluster; in the simulator the policy is most of the work).
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from typing import Mapping, Sequence

from ..base import plainstate
from ..batching import GpuProfile, Hysteresis, affine_rule, cpu_rule, gpu_rule, predicted_times
from ..batching.apportion import bounds
from ..batching.guard import EvenGuard
from ..batching.stepfit import StepFit
from ..predict import EMA, REGISTRY as PREDICTORS, factory
from .base import BatchSizer, ClusterView, Decision, Grant, Push, check_resize_count
from .bsp import BSP
from .options import Option

logger = logging.getLogger(__name__)


def resource_reading(r) -> tuple[float | None, float | None]:
    """(cpu %, memory %) from a resources entry: a mapping or an object with ``cpu`` /
    ``mem`` (or the hook's ``cpu_percent`` / ``memory_percent``); None where absent."""
    if r is None:
        return None, None
    get = r.get if isinstance(r, Mapping) else (lambda k, d=None: getattr(r, k, d))
    cpu = get("cpu", None)
    mem = get("mem", None)
    cpu = get("cpu_percent", None) if cpu is None else cpu
    mem = get("memory_percent", None) if mem is None else mem
    return (None if cpu is None else float(cpu)), (None if mem is None else float(mem))


def _plain(spec):
    """A JSON-safe description of a predictor spec (objects such as a trainer by type name)."""
    if isinstance(spec, (str, int, float, bool)) or spec is None:
        return spec
    if isinstance(spec, dict):
        return {str(k): _plain(v) for k, v in spec.items()}
    return getattr(spec, "__name__", type(spec).__name__)


MODELS = ("proportional", "affine")
HI_SHARE = 2   # the CPU rule's largest batch by default, times the even one (see ``hi`` above)


class LBBSPSizer(BatchSizer):
    """Per-worker batch sizes from predicted speeds (see the module docstring)."""

    def __init__(self, batch_size: int = 32, predictor="ema", *, profiles=None, blocking: bool = True,
                 background: bool = False, lo: int | Sequence[int] = 1, hi=None,
                 min_gain: float = 0.05, max_change: float = 0.5, comm_alpha: float = 0.2,
                 model: str | None = None, floor: float = 0.25, guard: bool = True):
        super().__init__(batch_size)
        self.guard = EvenGuard(batch_size) if guard else None
        model = model or ("affine" if profiles is None else "proportional")   # (GPU profiles: the GPU rule)
        if not 0.0 <= floor <= 1.0:
            raise ValueError(f"LB-BSP floor {floor!r}: give a share of a worker's speed-proportional batch in [0, 1]")
        self.floor = float(floor)
        if model not in MODELS:
            raise ValueError(f"LB-BSP model {model!r}: give one of {', '.join(MODELS)}")
        if model == "affine" and profiles is not None:
            raise ValueError("LB-BSP model 'affine' is for the CPU rule; with GPU profiles the rule has its own "
                             "communication term: drop one")
        self.model = model
        self.fits: dict[int, StepFit] = {}   # affine: each worker's recent (batch, time) line
        self.make_predictor = factory(predictor)
        self.predictor_spec = _plain(predictor)
        self.profiles = self._profiles(profiles)
        self.blocking, self.background = bool(blocking), bool(background)
        if hi is None and profiles is None:
            hi = HI_SHARE * batch_size
        self.lo, self.hi = lo, hi
        self._bounds_given = (lo, hi)   # per-worker lists as configured: a resize takes its first n
        self.hysteresis = Hysteresis(min_gain, max_change)
        self.comm_alpha = comm_alpha
        self.predictors: dict = {}
        self.comm: dict[int, EMA] = {}
        self.current: dict[int, int] | None = None  # the sizes last granted
        self.last_speeds: dict[int, float] = {}  # the predictions they were chosen from
        self._next: dict[int, float] = {}  # each worker's prediction, made at its own push
        self._plan: dict[int, int] | None = None  # non-blocking: sizes for the next round
        self._future: concurrent.futures.Future | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._t0: float | None = None
        self._decide_s: list[float] = []
        self._observe_s = self._observe_max = 0.0
        self._observes = self.late = 0
        self.workers: int | None = None  # the cluster's size, from the views seen

    @staticmethod
    def _profiles(profiles) -> dict[int, GpuProfile] | None:
        if profiles is None:
            return None
        items = profiles.items() if isinstance(profiles, Mapping) else enumerate(profiles)
        out = {}
        for w, p in items:
            out[int(w)] = p if isinstance(p, GpuProfile) else GpuProfile(**p)
        return out

    # -- observations -------------------------------------------------------------------
    def observe(self, push: Push, view: ClusterView) -> None:
        t0 = time.perf_counter()
        self._t0 = t0 if self._t0 is None else self._t0
        t = push.turnaround
        self.workers = view.num_workers
        if self.guard is not None and not push.dropped:
            self.guard.observe(push.round, push.batch_size, t, len(view.members))
        if t > 0 and push.batch_size > 0:
            cpu, mem = resource_reading(view.resources.get(push.worker) if view.resources else None)
            p = self.predictors.get(push.worker)
            if p is None:
                p = self.predictors[push.worker] = self.make_predictor()
            p.update(self._speed(push.worker, push.batch_size, t), cpu, mem)
            v = p.predict()
            if math.isfinite(v) and v > 0:
                self._next[push.worker] = v
            else:
                self._next.pop(push.worker, None)
            if self.profiles is not None and push.worker in self.profiles:
                unexplained = t - self.profiles[push.worker].time(push.batch_size)
                self.comm.setdefault(push.worker, EMA(self.comm_alpha)).update(max(unexplained, 0.0))
        dt = time.perf_counter() - t0
        self._observe_s += dt
        self._observe_max = max(self._observe_max, dt)
        self._observes += 1

    def _speed(self, worker: int, batch: int, t: float) -> float:
        """The speed the predictor learns from: batch / t; under the affine model, at the
        configured batch size B whatever the batch was (t scaled by the worker's line), so
        that a batch LB-BSP changed is not mistaken for the worker changing speed."""
        if self.model != "affine":
            return batch / t
        fit = self.fits.setdefault(worker, StepFit())
        fit.add(batch, t)
        f = fit.fixed_share(batch)
        return self.batch_size / (t * (f + (1.0 - f) * self.batch_size / batch))

    def predictions(self, workers: Sequence[int]) -> dict[int, float]:
        """Predicted speed per worker (made at its last push); one never observed gets the
        mean of the others."""
        known = {w: self._next[w] for w in workers if w in self._next}
        if not known:
            return {}
        mean = sum(known.values()) / len(known)
        return {w: known.get(w, mean) for w in workers}

    # -- sizing -------------------------------------------------------------------------
    def _rule(self, workers: list[int], speeds: dict[int, float], comm: dict[int, float],
              shapes: dict[int, float], current: dict[int, int] | None) -> dict[int, int]:
        """The sizes for ``workers`` from a snapshot (pure: safe in a background thread)."""
        total = self.batch_size * len(workers)
        if self.profiles is None and not speeds:  # nothing observed yet: BSP's equal split
            return {w: self.batch_size for w in workers}
        if self.profiles is not None:
            missing = [w for w in workers if w not in self.profiles]
            if missing:
                raise ValueError(f"LB-BSP has GPU profiles for workers {sorted(self.profiles)} but not "
                                 f"for {missing}; profile every worker or drop profiles")
            prof = [self.profiles[w] for w in workers]
            c = [comm.get(w, 0.0) for w in workers]
            proposed = dict(zip(workers, gpu_rule(prof, total, c)))

            def times(sizes):
                return dict(zip(workers, predicted_times(prof, [sizes[w] for w in workers], c)))
        elif self.model == "affine":  # t_i(x) = a_i + b_i x from the speed at B and the fixed share there
            lo = self._floors(workers, total)
            line = {}
            for w in workers:
                f, t = shapes.get(w, 0.0), self.batch_size / speeds[w]
                line[w] = (f * t, (1.0 - f) * t / self.batch_size)
            proposed = dict(zip(workers, affine_rule([line[w][0] for w in workers], [line[w][1] for w in workers],
                                                     total, lo, self.hi)))

            def times(sizes):
                return {w: line[w][0] + line[w][1] * sizes[w] for w in workers}
        else:
            lo = self._floors(workers, total)
            proposed = dict(zip(workers, cpu_rule([speeds[w] for w in workers], total, lo, self.hi)))

            def times(sizes):  # LB-BSP §3.2: t_i = x_i / v_i
                return {w: sizes[w] / speeds[w] for w in workers}
        return self.hysteresis.choose(current, proposed, times)

    def _floors(self, workers: list[int], total: int) -> list[int]:
        """Each worker's smallest batch: ``lo``, and at least ``floor`` of the even split
        (beyond the paper). Without it a worker whose batch got small stays small: a step's
        fixed part (the pull and push, per-step overheads) makes a small batch look slow
        per sample, so the speed it measures sizes it smaller still (issue 54: sizes
        [91, 1, 4] long after a slowdown ended). At a quarter of the even split the fixed
        part no longer hides the worker's speed, and it climbs back within rounds once it is
        fast again; a worker more than 1 / floor times slower than the others is then held
        at the floor (leaving it out is ElasticBSP's)."""
        given = bounds(len(workers), total, self.lo, self.hi)[0]
        want = [max(g, math.ceil(self.floor * self.batch_size)) for g in given]
        return want if sum(want) <= total else given

    def _snapshot(self, workers):
        self.last_speeds = self.predictions(workers)
        shapes = {w: self.fits[w].fixed_share(self.batch_size) for w in workers if w in self.fits}
        return self.last_speeds, {w: e.predict() for w, e in self.comm.items() if e.count}, shapes

    def predicted(self, worker: int) -> float | None:
        """The speed the sizes now granted were chosen from."""
        return self.last_speeds.get(worker)

    def sizes(self, view: ClusterView) -> dict[int, int]:
        t0 = time.perf_counter()
        self._t0 = t0 if self._t0 is None else self._t0
        workers = sorted(view.members)
        self.workers = view.num_workers
        if self.blocking:
            sizes = self._rule(workers, *self._snapshot(workers), self.current)
        else:
            sizes = self._take_plan(workers)
            snapshot = self._snapshot(workers)
            if self.background:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tfsync-lbbsp")
                if self._future is None:  # one plan in the making at a time; it lands when done
                    self._future = self._pool.submit(self._rule, workers, *snapshot, sizes)
            else:
                self._plan = self._rule(workers, *snapshot, sizes)
        if self.guard is not None:
            sizes = self.guard.allow(self.current, sizes)
        self.current = sizes
        self._decide_s.append(time.perf_counter() - t0)
        logger.debug("LB-BSP sizes %s (total %d)", sizes, sum(sizes.values()))
        return sizes

    def _take_plan(self, workers: list[int]) -> dict[int, int]:
        """Non-blocking: the plan made one round ago, never waited for."""
        if self._future is not None:
            if self._future.done():
                self._plan, self._future = self._future.result(), None
            else:
                self.late += 1
        plan = self._plan
        if plan is None or set(plan) != set(workers):  # first round or new members: equal split
            return {w: self.batch_size for w in workers} if plan is None or self.current is None \
                else self._rule(workers, *self._snapshot(workers), None)
        return dict(plan)

    # -- elastic workers ------------------------------------------------------------------
    def prepare_resize(self, workers: int) -> plainstate.Apply:
        """Workers >= ``workers`` lose their predictors, predictions, step lines and
        communication EMAs; the sizes granted and the next round's plan are made again for
        the new count (the round total X = batch_size * workers). Prior: a new worker has
        no predictor until its first push and is sized at the mean of the kept workers'
        predictions (as ``predictions`` sizes any worker not yet observed); with nothing
        observed, every worker gets batch_size. Refused where the new workers have no GPU
        profile, or per-worker ``lo`` / ``hi`` bounds do not cover (or cannot split X
        among) the new count."""
        what = f"protocol 'lbbsp' cannot resize to {workers!r} workers"
        check_resize_count(workers, "protocol 'lbbsp'")
        if self.profiles is not None:
            missing = [w for w in range(workers) if w not in self.profiles]
            if missing:
                raise ValueError(f"{what}: it has GPU profiles for workers {sorted(self.profiles)}, not for "
                                 f"{missing}; profile every worker or drop profiles")
        lo, hi = (b if b is None or isinstance(b, (int, float)) else list(b)[:workers] for b in self._bounds_given)
        try:  # per-worker bounds for every worker, and X splits within them
            bounds(workers, self.batch_size * workers, lo, hi)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
        kept = (lambda d: {w: v for w, v in d.items() if w < workers})
        values = dict(predictors=kept(self.predictors), _next=kept(self._next), fits=kept(self.fits),
                      comm=kept(self.comm), last_speeds=kept(self.last_speeds), current=None, _plan=None,
                      _future=None, workers=workers, lo=lo, hi=hi)

        def apply():
            self.__dict__.update(values)  # a plan still in the making (background) is for the old count
            if self.guard is not None:
                self.guard.reset()
            if not self.blocking and self._next:  # the next round's plan, from the predictions kept
                everyone = list(range(workers))
                self._plan = self._rule(everyone, *self._snapshot(everyone), None)
        return apply

    # -- state --------------------------------------------------------------------------
    def save_state(self) -> dict:
        """The sizer's part of LB-BSP's state (see the module docstring)."""
        plan = self._plan
        if self._future is not None and self._future.done() and self._future.exception() is None:
            plan = self._future.result()  # what the next barrier would take
        sizes = (lambda d: None if d is None else plainstate.str_keys(d, int))
        return {"workers": self.workers, "predictor": self.predictor_spec,
                "predictors": plainstate.str_keys(self.predictors, lambda p: p.save_state()),
                "next": plainstate.str_keys(self._next, float),
                "comm": plainstate.str_keys(self.comm, lambda e: e.save_state()),
                "current": sizes(self.current), "plan": sizes(plan),
                "fits": plainstate.str_keys(self.fits, lambda f: f.save_state()),
                "last_speeds": plainstate.str_keys(self.last_speeds, float),
                "late": self.late, "moves": self.hysteresis.moves, "holds": self.hysteresis.holds,
                **({"guard": self.guard.save_state()} if self.guard is not None else {})}

    def load_state(self, state: dict) -> plainstate.Apply:
        """Check ``save_state``'s dict; return what applies it, changing nothing before. A
        predictor of another kind is refused by the first worker's saved predictor."""
        what = "protocol 'lbbsp'"
        try:
            predictors = {}
            for w, saved in plainstate.int_keys(plainstate.field(state, "predictors", what)).items():
                if saved:  # {}: a predictor that keeps nothing starts afresh
                    p = predictors[w] = self.make_predictor()
                    p.restore_state(saved)
            comm = {}
            for w, saved in plainstate.int_keys(state.get("comm", {})).items():
                comm[w] = EMA(self.comm_alpha)
                comm[w].restore_state(saved)
            fits = {}
            for w, saved in plainstate.int_keys(state.get("fits", {})).items():
                fits[w] = StepFit()
                fits[w].restore_state(saved)
            sizes = (lambda d: None if d is None else plainstate.int_keys(d, int))
            values = dict(predictors=predictors, comm=comm, fits=fits, current=sizes(state.get("current")),
                          _plan=sizes(state.get("plan")), _next=plainstate.int_keys(state.get("next", {}), float),
                          last_speeds=plainstate.int_keys(state.get("last_speeds", {}), float),
                          late=int(state.get("late", 0)), workers=state.get("workers"))
            counters = int(state.get("moves", 0)), int(state.get("holds", 0))
            guard = None
            if self.guard is not None and isinstance(state.get("guard"), dict):   # (none saved before 2026-11-29)
                guard = self.guard.fresh()
                guard.load_state(state["guard"])
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
        except (TypeError, AttributeError) as e:
            raise ValueError(f"{what}: the saved sizer state is malformed ({e})") from None

        def apply():
            self.__dict__.update(values)
            self.hysteresis.moves, self.hysteresis.holds = counters
            if guard is not None:
                self.guard = guard
        return apply

    # -- reporting ----------------------------------------------------------------------
    def stats(self) -> dict:
        d = self._decide_s
        wall = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        spent = sum(d) + self._observe_s
        return {"decisions": len(d), "sizing_ms_mean": 1e3 * sum(d) / len(d) if d else 0.0,
                "sizing_ms_max": 1e3 * max(d) if d else 0.0,
                "observe_ms_mean": 1e3 * self._observe_s / self._observes if self._observes else 0.0,
                "observe_ms_max": 1e3 * self._observe_max, "share": spent / wall if wall > 0 else 0.0,
                "late_plans": self.late, "moves": self.hysteresis.moves, "holds": self.hysteresis.holds,
                "sizes": dict(self.current) if self.current else {},
                **({"guard_checks": list(self.guard.checks)} if self.guard is not None else {})}

    def settle(self, timeout: float = 10.0) -> None:
        """Wait for the plan being made in the background (tests, shutdown)."""
        if self._future is not None:
            try:
                self._future.result(timeout)
            except concurrent.futures.TimeoutError:
                raise TimeoutError(f"LB-BSP's background sizing took over {timeout} s; raise the "
                                   "timeout or use background=False") from None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def max_batch(self, workers: int) -> int:
        """``hi`` (by default twice the even batch with the CPU rule), else X = n *
        batch_size less 1 for each other worker."""
        if isinstance(self.hi, int):
            return self.hi
        return max(self.hi) if self.hi else self.batch_size * workers - (workers - 1)

    def describe(self) -> dict:
        return {"name": "LBBSPSizer", "batch_size": self.batch_size, "predictor": self.predictor_spec,
                "rule": "gpu" if self.profiles is not None else "cpu", "model": self.model, "blocking": self.blocking,
                "background": self.background, "lo": self.lo, "hi": self.hi,
                "hysteresis": self.hysteresis.describe(),
                "guard": self.guard.describe() if self.guard is not None else None}


class LBBSP(BSP):
    """BSP with LB-BSP's batch sizes; options as :class:`LBBSPSizer`'s."""

    name = "lbbsp"
    self_sizing = True
    three_action = None  # per-worker batch sizes have no form in RLP's action space
    options = (Option("predictor", str, choices=lambda: tuple(PREDICTORS), help="worker-speed predictor"),
               Option("blocking", bool, help="sizes from this round (true) or the previous one"),
               Option("background", bool, help="the sizing rule in a background thread"),
               Option("lo", int, lo=1, help="smallest batch size"),
               Option("hi", int, lo=1, help="largest batch size (default twice batch_size: every step's input "
                                            "holds this many rows)"),
               Option("min_gain", float, lo=0, help="predicted gain below which sizes are kept"),
               Option("max_change", float, lo=0, help="relative change above which sizes always move"),
               Option("comm_alpha", float, lo=0, hi=1, lo_open=True,
                      help="EMA weight of the communication time"),
               Option("model", str, choices=MODELS,
                      help="step time as batch / speed (the paper) or affine: a fixed part plus batch / speed"),
               Option("floor", float, lo=0, hi=1, help="smallest batch as a share of the even split"),
               Option("guard", bool, help="keep sizes only while their rounds are measured no slower than the "
                                          "even split's"))

    def __init__(self, batch_size: int = 32, predictor="ema", profiles=None, blocking: bool = True,
                 background: bool = False, lo=1, hi=None, min_gain: float = 0.05,
                 max_change: float = 0.5, comm_alpha: float = 0.2, model: str | None = None, floor: float = 0.25,
                 guard: bool = True, sizer: LBBSPSizer | None = None, seed: int | None = None):
        if sizer is None:
            sizer = LBBSPSizer(batch_size, predictor, profiles=profiles, blocking=blocking,
                               background=background, lo=lo, hi=hi, min_gain=min_gain,
                               max_change=max_change, comm_alpha=comm_alpha, model=model, floor=floor, guard=guard)
        elif not isinstance(sizer, LBBSPSizer):
            raise ValueError(f"LBBSP needs an LBBSPSizer, got {type(sizer).__name__}; pass "
                             "LB-BSP's options instead of a sizer")
        super().__init__(sizer, seed)

    def on_push(self, push: Push, view: ClusterView):
        self.sizer.observe(push, view)
        return super().on_push(push, view)

    def steady_round(self, view: ClusterView) -> Decision | None:
        """Every member again, at the sizes granted last (a round's end changes only the
        sizes, which a server running the rounds takes from the next one it opens)."""
        current = self.sizer.current
        if type(self) is not LBBSP or current is None or set(current) != set(view.members):
            return None
        return Decision(tuple(Grant(w, current[w], self.mode) for w in sorted(view.members)), barrier=True)

    def stats(self) -> dict:
        return self.sizer.stats()

    def _save_state(self) -> dict:
        sizer = self.sizer.save_state()
        return {"workers": sizer.pop("workers"), "sizer": sizer}

    def _load_state(self, state: dict, workers: int | None) -> plainstate.Apply:
        return self.sizer.load_state({**plainstate.field(state, "sizer", "protocol 'lbbsp'"),
                                      "workers": state.get("workers")})
