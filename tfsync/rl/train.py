"""Train the learned policy: pre-training on static policies, then deep Q-learning
episodes in the simulator (RLP §3.3, Algorithm 2), with checkpoints.

A checkpoint is the policy file itself (``QNetwork`` weights, NumPy ``.npz``) with the
number of episodes done in its metadata; ``resume=True`` continues from it (the replay
pool and optimizer state start afresh: the pool holds only 50 transitions).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np

from ..policy.rlp import QNetwork
from .dqn import DQNAgent, DQNConfig, discounted_returns
from .evaluate import STATIC, make_policy, run_episode
from .instances import InstanceSpec, make_instance

logger = logging.getLogger(__name__)


@dataclass
class TrainLog:
    pretrain: list = field(default_factory=list)  # one dict per (instance, teacher) episode
    episodes: list = field(default_factory=list)  # one dict per DQN episode
    pretrain_loss: float = float("nan")


def collect_demonstrations(spec: InstanceSpec, seeds, teachers=STATIC, gamma: float = 0.8,
                           progress=None, log: TrainLog | None = None):
    """Run every teacher on every instance; return (states, actions, returns, expert)
    where ``expert`` marks the samples of the fastest teacher on their instance."""
    states, actions, returns, expert = [], [], [], []
    total, done = len(seeds) * len(teachers), 0
    for seed in seeds:
        runs = []
        for name in teachers:
            res, pol, _ = run_episode(name, spec, seed, record=True)
            times = [t for _, _, t in pol.trajectory]
            runs.append((res, pol.trajectory, discounted_returns(times, res.time, gamma)))
            if log is not None:
                log.pretrain.append(res.row())
            done += 1
            if progress:
                progress(done, total, f"pre-training: {name} on instance {seed}: {res.time:,.0f} s")
        best = min(range(len(runs)), key=lambda i: (not runs[i][0].converged, runs[i][0].time))
        for i, (res, traj, g) in enumerate(runs):
            states += [s for s, _, _ in traj]
            actions += [a for _, a, _ in traj]
            returns.append(g)
            expert.append(np.full(len(traj), float(i == best)))
    return (np.asarray(states), np.asarray(actions), np.concatenate(returns), np.concatenate(expert))


def train(spec: InstanceSpec, out: str, *, pretrain_instances: int = 4, episodes: int = 20,
          cfg: DQNConfig = DQNConfig(), resume: bool = False, checkpoint_every: int = 1,
          first_seed: int = 1000, progress=None) -> tuple[QNetwork, TrainLog]:
    """Pre-train on ``pretrain_instances`` instances x every static policy, then run
    ``episodes`` Q-learning episodes on fresh instances; saves the policy to ``out``."""
    agent, log, start = DQNAgent(cfg), TrainLog(), 0
    if resume and os.path.exists(out):
        saved = QNetwork.load(out)
        agent.q.set_weights([w.astype(np.float32) for w in saved.weights])
        agent.target.set_weights(agent.q.get_weights())
        start = int(saved.meta.get("episodes", 0))
        logger.info("resuming %s after %d episodes", out, start)
    elif pretrain_instances:
        seeds = range(first_seed, first_seed + pretrain_instances)
        data = collect_demonstrations(spec, seeds, gamma=cfg.gamma, progress=progress, log=log)
        log.pretrain_loss = agent.pretrain(*data)
    meta = {"spec": spec.describe(), "dqn": cfg.__dict__ | {"hidden": list(cfg.hidden)}}
    for ep in range(start, episodes):
        seed = first_seed + pretrain_instances + ep
        inst = make_instance(spec, seed)
        pol = make_policy("rlp", spec, agent, observer=agent.observe)
        res = inst.run(pol)
        acc = res.accuracy[-1][2] if res.accuracy else 0.0
        row = {"episode": ep + 1, "seed": seed, "time": res.time, "pushes": res.pushes,
               "converged": acc >= spec.target, "td_loss": float(np.mean(agent.losses[-res.pushes:] or [np.nan])),
               **{f"share_{k}": v / max(res.pushes, 1) for k, v in pol.stats()["actions"].items()}}
        log.episodes.append(row)
        if progress:
            progress(ep + 1 - start, episodes - start,
                     f"episode {ep + 1}: {res.time:,.0f} s, none/sub/all "
                     f"{row['share_none']:.2f}/{row['share_submitter']:.2f}/{row['share_all']:.2f}")
        if (ep + 1) % checkpoint_every == 0 or ep + 1 == episodes:
            _save(agent.network(**meta, episodes=ep + 1), out)
    net = agent.network(**meta, episodes=max(episodes, start))
    _save(net, out)
    return net, log


def _save(net: QNetwork, out: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp.npz"
    net.save(tmp)
    os.replace(tmp, out)  # a crash never leaves a half-written policy file


__all__ = ["TrainLog", "collect_demonstrations", "train", "make_instance"]
