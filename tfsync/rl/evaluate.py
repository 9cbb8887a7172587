"""Run policies on simulated instances and measure their time to the target accuracy
(RLP §4: "each instance 30 times with different random seeds"). TF-free."""

from __future__ import annotations

import multiprocessing
import os
import time as _time
from dataclasses import asdict, dataclass

from ..policy.base import BatchSizer
from ..policy.rlp import RLP, QNetwork, static_names, teacher
from .instances import InstanceSpec, make_instance

# The paper's baselines and pre-training teachers: the catalogue's protocols with a
# three-action form (BSP, ASP, SSP), SSP with s = 2, 5 and 8 (RLP §4).
STATIC = static_names(staleness=(2, 5, 8))


@dataclass
class EpisodeResult:
    policy: str
    seed: int
    workers: int
    hidden_layers: int
    stragglers: int
    time: float  # simulated seconds to the target, or to max_time when not reached
    converged: bool
    pushes: int
    accuracy: float
    none_share: float  # share of decisions that kept idle workers idle
    wall_s: float

    def row(self) -> dict:
        return asdict(self)


def make_policy(name: str, spec: InstanceSpec, model: QNetwork | None = None, **kw) -> RLP:
    """A static policy by name (``STATIC``), or ``"rlp"`` with a trained ``model``."""
    sizer = BatchSizer(spec.batch_size)
    if name == "rlp":
        if model is None:
            raise ValueError("policy 'rlp' needs a trained model")
        return RLP(agent=model, sizer=sizer, **kw)
    return RLP(teacher=teacher(name), sizer=sizer, **kw)


def run_episode(name: str, spec: InstanceSpec, seed: int, model: QNetwork | None = None,
                **policy_kw) -> tuple[EpisodeResult, RLP, object]:
    inst = make_instance(spec, seed)
    pol = make_policy(name, spec, model, **policy_kw)
    t0 = _time.perf_counter()
    res = inst.run(pol)
    acc = res.accuracy[-1][2] if res.accuracy else 0.0
    decisions = max(sum(pol.counts), 1)
    out = EpisodeResult(name, seed, spec.workers, len(inst.hidden), len(inst.stragglers), res.time,
                        acc >= spec.target, res.pushes, acc, pol.counts[0] / decisions,
                        _time.perf_counter() - t0)
    return out, pol, res


def sequential_updates(spec: InstanceSpec, seed: int) -> int:
    """Updates plain sequential SGD needs to reach the target on instance ``seed`` (the
    same model, data and batch size; one worker, so no staleness). A policy can save
    only the difference between this and its own update count: with ASP's push rate it
    bounds how fast any policy of the three-action space can be."""
    from ..sim.simulator import Simulator
    from ..sim.speeds import SpeedModel

    inst = make_instance(spec, seed)
    sim = Simulator(1, SpeedModel(fixed=1.0, per_sample=0.0), model=inst.sim.model, lr=spec.lr,
                    eval_every=spec.eval_every, record=False)
    res = sim.run(make_policy("asp", spec), accuracy=spec.target, time=spec.max_time)
    return res.updates


def _job(args) -> dict:
    name, spec, seed, model_path = args
    if name == "sequential":
        return {"policy": name, "seed": seed, "updates": sequential_updates(spec, seed)}
    model = QNetwork.load(model_path) if model_path else None
    return run_episode(name, spec, seed, model)[0].row()


def evaluate(policies, spec: InstanceSpec, seeds, model_path: str | None = None,
             processes: int = 1, progress=None) -> list[dict]:
    """One row per (policy, seed); ``progress(done, total)`` after each episode."""
    jobs = [(p, spec, s, model_path if p == "rlp" else None) for s in seeds for p in policies]
    rows = []
    if processes > 1:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(processes, initializer=os.nice, initargs=(5,)) as pool:
            for row in pool.imap(_job, jobs):
                rows.append(row)
                if progress:
                    progress(len(rows), len(jobs))
    else:
        for job in jobs:
            rows.append(_job(job))
            if progress:
                progress(len(rows), len(jobs))
    return rows
