"""Deep Q-learning of the synchronization policy (RLP §3.3, Algorithm 2), in tf_keras.

The network is the paper's: two hidden layers of 64 and 32 LeakyReLU units, one Q-value
per action. Hyper-parameters default to §4: replay pool N = 50, mini-batch 32, target
copy every c = 5 training iterations, gamma = 0.8, epsilon = 0.1, learning rate 0.01
(Adam; the paper does not name its optimizer).

Algorithm 2 as printed trains Q with targets from Q itself and picks actions with the
target network Q*: the roles are swapped. Here, as in DQN and the double DQN the paper
cites (Van Hasselt et al. 2016): actions come from the online network, and the target
is r + gamma * Q*(S', argmax_a Q(S', a)).

Pre-training (§3.3) regresses Q(S, a) on the return that followed in episodes of static
policies. The paper regresses on the undiscounted time left, which is not what Q
estimates under gamma = 0.8; here the return is discounted with the same gamma, so the
pre-trained values are the ones Q-learning continues from. A large-margin term (DQfD,
Hester et al. 2018) makes the actions of the instance's fastest static policy the
greedy ones, so pre-training starts the agent from the best known policy.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import numpy as np

from ..policy.rlp import ACTIONS, FEATURES, HISTORY, QNetwork

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DQNConfig:
    hidden: tuple[int, ...] = (64, 32)
    leaky_alpha: float = 0.3  # tf_keras LeakyReLU default
    pool: int = 50  # N
    batch: int = 32  # |B|
    copy_every: int = 5  # c
    gamma: float = 0.8
    epsilon: float = 0.1
    lr: float = 0.01
    margin: float = 0.8  # DQfD margin l(a_E, a) for a != a_E
    margin_weight: float = 1.0
    seed: int = 0


# Beyond the paper: its pool of 50 transitions, a target copied every 5 steps and Adam
# at 0.01 make Q-values chase the latest few pushes (our measured action shares stay
# near one third each after 40 episodes). "stable" keeps the network, gamma and epsilon
# and uses DQN's usual remedies: a large pool, a slow target, a smaller step size.
PRESETS = {"paper": DQNConfig(), "stable": DQNConfig(pool=5000, copy_every=200, lr=0.001)}


def build_qnet(cfg: DQNConfig, inputs: int = HISTORY * FEATURES):
    import tf_keras as keras

    layers = [keras.Input((inputs,))]
    for units in cfg.hidden:
        layers += [keras.layers.Dense(units), keras.layers.LeakyReLU(cfg.leaky_alpha)]
    layers.append(keras.layers.Dense(len(ACTIONS)))
    return keras.Sequential(layers)


class ReplayPool:
    """The last ``size`` transitions (S, a, r, S'); ``sample`` draws without replacement."""

    def __init__(self, size: int, rng: random.Random):
        self.size, self.rng, self.items, self.next = size, rng, [], 0

    def add(self, item) -> None:
        if len(self.items) < self.size:
            self.items.append(item)
        else:
            self.items[self.next] = item
        self.next = (self.next + 1) % self.size

    def sample(self, k: int) -> list:
        return self.rng.sample(self.items, min(k, len(self.items)))

    def __len__(self) -> int:
        return len(self.items)


class DQNAgent:
    """Online network Q, target network Q*, replay pool. Use ``act`` as the RLP agent
    and ``observe`` as its observer; ``greedy=True`` switches exploration off."""

    def __init__(self, cfg: DQNConfig = DQNConfig()):
        import tensorflow as tf
        import tf_keras as keras

        self.cfg, self.tf = cfg, tf
        tf.random.set_seed(cfg.seed)
        self.rng = random.Random(cfg.seed)
        self.q, self.target = build_qnet(cfg), build_qnet(cfg)
        self.target.set_weights(self.q.get_weights())
        self.opt = keras.optimizers.Adam(cfg.lr)
        self.pool = ReplayPool(cfg.pool, self.rng)
        self.greedy = False
        self.train_steps = 0
        self.losses: list[float] = []
        self._td = tf.function(self._td_step, reduce_retracing=True)
        self._fit = tf.function(self._fit_step, reduce_retracing=True)
        self._qf = tf.function(lambda s: self.q(s, training=False))

    # -- acting ------------------------------------------------------------------------
    def values(self, states: np.ndarray) -> np.ndarray:
        return self._qf(self.tf.constant(np.asarray(states, np.float32))).numpy()

    def act(self, state: np.ndarray) -> int:
        if not self.greedy and self.rng.random() < self.cfg.epsilon:
            return self.rng.randrange(len(ACTIONS))
        return int(np.argmax(self.values(state[None])[0]))

    # -- learning (Algorithm 2, lines 5-8) ----------------------------------------------
    def observe(self, s, a, r, s2, done: bool = False) -> None:
        self.pool.add((s, a, r, s2, float(done)))
        batch = self.pool.sample(self.cfg.batch)
        s, a, r, s2, d = (np.asarray(x, np.float32) for x in zip(*batch))
        loss = self._td(s, a.astype(np.int32), r, s2, d)
        self.losses.append(float(loss))
        self.train_steps += 1
        if self.train_steps % self.cfg.copy_every == 0:
            self.target.set_weights(self.q.get_weights())

    def _td_step(self, s, a, r, s2, done):
        tf = self.tf
        best = tf.argmax(self.q(s2, training=False), axis=1, output_type=tf.int32)  # online picks
        q_next = tf.gather(self.target(s2, training=False), best, axis=1, batch_dims=1)  # target values
        y = tf.stop_gradient(r + self.cfg.gamma * (1.0 - done) * q_next)
        with tf.GradientTape() as tape:
            q = tf.gather(self.q(s, training=True), a, axis=1, batch_dims=1)
            loss = tf.reduce_mean(tf.square(q - y))
        self.opt.apply_gradients(zip(tape.gradient(loss, self.q.trainable_variables),
                                     self.q.trainable_variables))
        return loss

    # -- pre-training (§3.3) ---------------------------------------------------------------
    def _fit_step(self, s, a, g, expert):
        tf = self.tf
        with tf.GradientTape() as tape:
            q_all = self.q(s, training=True)
            q = tf.gather(q_all, a, axis=1, batch_dims=1)
            margins = self.cfg.margin * (1.0 - tf.one_hot(a, len(ACTIONS)))
            large_margin = tf.reduce_max(q_all + margins, axis=1) - q  # DQfD J_E
            loss = tf.reduce_mean(tf.square(q - g)) + self.cfg.margin_weight * tf.reduce_mean(expert * large_margin)
        self.opt.apply_gradients(zip(tape.gradient(loss, self.q.trainable_variables),
                                     self.q.trainable_variables))
        return loss

    def pretrain(self, states, actions, returns, expert, epochs: int = 20, batch: int = 256) -> float:
        """Fit Q(S, a) to the returns (and the margin on ``expert`` samples)."""
        n = len(states)
        s, a = np.asarray(states, np.float32), np.asarray(actions, np.int32)
        g, e = np.asarray(returns, np.float32), np.asarray(expert, np.float32)
        order = np.random.default_rng(self.cfg.seed)
        loss = float("nan")
        for _ in range(epochs):
            idx = order.permutation(n)
            for i in range(0, n, batch):
                j = idx[i:i + batch]
                loss = float(self._fit(s[j], a[j], g[j], e[j]))
        self.target.set_weights(self.q.get_weights())
        return loss

    def network(self, **meta) -> QNetwork:
        """The greedy policy as a TF-free network (Algorithm 2 returns Q*; the online Q
        is the better-trained copy and the one our actions came from)."""
        return QNetwork(self.q.get_weights(), self.cfg.leaky_alpha, meta)


def discounted_returns(times: list[float], end: float, gamma: float) -> np.ndarray:
    """G_n = sum_k gamma^k r_{n+k+1} with r = -dt between consecutive decisions (the
    last decision's reward runs to ``end``). gamma = 1 gives the paper's -(time left)."""
    out = np.zeros(len(times))
    g = 0.0
    for i in range(len(times) - 1, -1, -1):
        nxt = times[i + 1] if i + 1 < len(times) else end
        g = -(nxt - times[i]) + gamma * g
        out[i] = g
    return out
