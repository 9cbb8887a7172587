"""The learned policy (RLP): the three-action framework on the simulator, the
Q-learning mechanics on a tiny MDP with a known answer, and pre-training."""

import numpy as np
import pytest

from tfsync.policy import ASP, BatchSizer
from tfsync.policy.rlp import ACTIONS, ALL, FEATURES, HISTORY, NONE, RLP, SUBMITTER, QNetwork, teacher
from tfsync.rl.instances import InstanceSpec, make_instance
from tfsync.sim.simulator import Simulator
from tfsync.sim.speeds import SpeedModel

pytestmark = pytest.mark.unit

SMALL = InstanceSpec(workers=4, hidden_layers=(0,), target=0.80, eval_every=10, eval_size=500,
                     step_time=1.0, sleep=(1.0, 4.0), straggler_p=0.5)


def straggly():
    """A fresh speed model (it holds per-worker random streams): same seed, same luck."""
    return SpeedModel(fixed=1.0, per_sample=0.0, jitter=0.2, straggle_p=0.3, straggle_mean=2.0,
                      straggle_std=0.5, seed=3)


class Always:
    def __init__(self, action):
        self.action = action

    def act(self, state):
        return self.action


def test_static_policies_in_three_action_form_keep_their_schedules():
    n = 4
    bsp = Simulator(n, straggly()).run(RLP(teacher=teacher("bsp")), pushes=400)
    clocks = [0] * n
    for p in bsp.log:  # apply-form BSP: lock-step, nobody starts round r+1 before all end r
        clocks[p.worker] += 1
        assert max(clocks) - min(clocks) <= 1
    assert bsp.stats["actions"]["all"] == 99 and bsp.stats["forced_all"] == 0  # the 400th push ends the run: no decision

    ours = Simulator(n, straggly()).run(RLP(teacher=teacher("asp")), pushes=400)
    ref = Simulator(n, straggly()).run(ASP(BatchSizer(32), depth=1), pushes=400)
    assert [(p.worker, p.arrival) for p in ours.log] == [(p.worker, p.arrival) for p in ref.log]

    ssp = Simulator(n, straggly()).run(RLP(teacher=teacher("ssp3")), pushes=400)
    clocks = [0] * n
    for p in ssp.log:  # the §3.1 rule can release a worker at gap s, never beyond s + 1
        clocks[p.worker] += 1
        assert max(clocks) - min(clocks) <= 3 + 1


def test_none_with_nothing_running_releases_everyone_instead_of_stalling():
    res = Simulator(3, SpeedModel(fixed=1.0, per_sample=0.0)).run(RLP(agent=Always(NONE)), pushes=60)
    assert res.pushes >= 60
    assert res.stats["forced_all"] == 19 and res.stats["actions"]["none"] == 59  # one decision per push but the last


def test_state_holds_the_last_ten_tuples_newest_first():
    seen = []

    class Spy:
        def act(self, state):
            seen.append(state.copy())
            return SUBMITTER

    res = Simulator(2, SpeedModel(fixed=1.0, per_sample=0.0, jitter=0.3, seed=1)).run(RLP(agent=Spy()), pushes=30)
    rows = [s.reshape(HISTORY, FEATURES) for s in seen]
    assert rows[0][0][0] == pytest.approx(1 / 1000) and not rows[0][1:].any()  # zero padding
    assert len(seen) == 29 and rows[-1][0][0] == pytest.approx(29 / 1000)  # the 30th push ends the run
    np.testing.assert_array_equal(rows[-1][1:], rows[-2][:-1])  # shifted by one push
    during = [p.pushes_during / 10 for p in res.log[:29]]
    assert max(during) > 0
    assert [r[0][3] for r in rows] == pytest.approx(during)


def test_policy_file_round_trip_and_bad_files(tmp_path):
    rng = np.random.default_rng(0)
    net = QNetwork([rng.normal(size=(40, 8)), rng.normal(size=8), rng.normal(size=(8, 3)), rng.normal(size=3)],
                   meta={"episodes": 3})
    net.save(tmp_path / "p.npz")
    back = QNetwork.load(tmp_path / "p.npz")
    s = rng.normal(size=(5, 40))
    np.testing.assert_allclose(back.q(s), net.q(s))
    assert back.meta["episodes"] == 3
    (tmp_path / "bad.npz").write_text("not a policy")
    with pytest.raises(ValueError, match="not a tfsync policy file"):
        QNetwork.load(tmp_path / "bad.npz")
    QNetwork([np.zeros((12, 3)), np.zeros(3)]).save(tmp_path / "shape.npz")
    with pytest.raises(ValueError, match="does not take 40 state features"):
        QNetwork.load(tmp_path / "shape.npz")


# -- Q-learning mechanics (tf_keras) ------------------------------------------------------

def _onehot(i):
    s = np.zeros(HISTORY * FEATURES, np.float32)
    s[i] = 1.0
    return s


def test_td_target_is_double_dqn_from_the_target_network():
    from tfsync.rl.dqn import DQNAgent, DQNConfig

    agent = DQNAgent(DQNConfig(batch=4, pool=4, copy_every=1000, seed=1))
    agent.target.set_weights([w * -0.5 + 0.1 for w in agent.q.get_weights()])  # a different target net
    rng = np.random.default_rng(2)
    s, s2 = rng.normal(size=(4, 40)).astype(np.float32), rng.normal(size=(4, 40)).astype(np.float32)
    a, r = np.array([0, 1, 2, 1]), rng.normal(size=4).astype(np.float32)
    q, q2_online, q2_target = agent.values(s), agent.values(s2), agent.target(s2).numpy()
    y = r + 0.8 * q2_target[np.arange(4), q2_online.argmax(1)]  # online picks, target values
    expected = np.mean((q[np.arange(4), a] - y) ** 2)
    for i in range(4):
        agent.pool.add((s[i], a[i], r[i], s2[i], 0.0))
    loss = agent._td(s, a.astype(np.int32), r, s2, np.zeros(4, np.float32))
    assert float(loss) == pytest.approx(expected, rel=1e-4)
    wrong = np.mean((q[np.arange(4), a] - (r + 0.8 * q2_online.max(1))) ** 2)  # Algorithm 2 as printed
    assert abs(expected - wrong) > 1e-3 * expected


def test_q_learning_finds_the_known_optimum_of_a_tiny_mdp():
    """States A, B. In A: action 2 -> B with reward -1; actions 0, 1 end with -5 and -3.
    In B every action ends with -1. With gamma = 0.8: Q*(A) = (-5, -3, -1.8), Q*(B) = -1."""
    from tfsync.rl.dqn import DQNAgent, DQNConfig

    A, B = _onehot(0), _onehot(5)
    agent = DQNAgent(DQNConfig(seed=0, epsilon=0.3))
    for _ in range(600):
        a = agent.act(A)
        if a == 2:
            agent.observe(A, 2, -1.0, B)
            agent.observe(B, agent.act(B), -1.0, B, done=True)
        else:
            agent.observe(A, a, -5.0 if a == 0 else -3.0, A, done=True)
    q = agent.values(np.stack([A, B]))
    assert int(np.argmax(q[0])) == 2
    np.testing.assert_allclose(q[0], [-5, -3, -1.8], atol=0.25)
    np.testing.assert_allclose(q[1], [-1, -1, -1], atol=0.25)
    # The target network follows the online one every c = 5 training steps, and only then.
    same = lambda: all(np.array_equal(a, b) for a, b in zip(agent.q.get_weights(), agent.target.get_weights()))  # noqa: E731
    while agent.train_steps % 5:
        agent.observe(B, 0, -1.0, B, done=True)
    assert same()
    for _ in range(4):  # surprises: the online network moves, the target waits
        agent.observe(B, 0, -50.0, B, done=True)
    assert not same()
    agent.observe(B, 0, -50.0, B, done=True)
    assert same()
    # The NumPy network the engine runs gives the same values as the tf_keras one.
    both = np.stack([A, B])
    np.testing.assert_allclose(agent.network().q(both), agent.values(both), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name,agree", [("asp", 1.0), ("bsp", 0.95)])
def test_pretraining_reproduces_the_static_policy(name, agree):
    from tfsync.rl.dqn import DQNAgent, DQNConfig
    from tfsync.rl.evaluate import run_episode
    from tfsync.rl.train import collect_demonstrations

    data = collect_demonstrations(SMALL, seeds=[1, 2], teachers=(name,))
    agent = DQNAgent(DQNConfig(seed=0))
    agent.pretrain(*data, epochs=60)
    _, pol, _ = run_episode(name, SMALL, seed=7, record=True)  # an unseen instance
    states = np.stack([s for s, _, _ in pol.trajectory])
    actions = np.array([a for _, a, _ in pol.trajectory])
    greedy = agent.network().q(states).argmax(1)
    assert (greedy == actions).mean() >= agree
    assert {NONE, ALL} <= set(actions) if name == "bsp" else set(actions) == {SUBMITTER}


def test_instances_are_reproducible_and_vary():
    a, b, c = (make_instance(SMALL, s) for s in (5, 5, 6))
    assert a.stragglers == b.stragglers and a.sim.speeds.describe() == b.sim.speeds.describe()
    r1 = a.run(RLP(teacher=teacher("asp"), sizer=BatchSizer(SMALL.batch_size)))
    r2 = b.run(RLP(teacher=teacher("asp"), sizer=BatchSizer(SMALL.batch_size)))
    assert r1.time == r2.time and r1.accuracy[-1][2] >= SMALL.target
    assert c.sim.speeds.describe() != a.sim.speeds.describe()
    assert len(ACTIONS) == 3
