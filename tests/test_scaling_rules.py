"""What a scale may do and what it does to the plan (tfsync.engine.scaling), without
tasks: the refusals come before anything changes."""

import pytest

from tfsync.engine.phase import Phase
from tfsync.engine.scaling import Elastic, check_scale, rescale
from tfsync.policy import ASP, BSP, BatchSizer, FixedSizer
from tfsync.policy.catalogue import aggregating
from tfsync.policy.checks import InvalidCommand
from tfsync.policy.ledger import Ledger

pytestmark = pytest.mark.unit


def paper_rule(protocol, n):
    return float(n) if aggregating(protocol) else 1.0


def _checks(workers=2, restartable=True, active=None, bounds=(None, None), fits=None):
    """A scale's checks of a job running ``workers`` workers (``active``: its members; the
    real loop: test_scaling): ``check(n)`` for a scale to n."""
    elastic = Elastic(min_workers=bounds[0], max_workers=bounds[1], fits=fits)
    members = frozenset(range(workers) if active is None else active)
    return lambda n: check_scale(n, workers, elastic, restartable, members, "bsp")


def test_a_scale_is_refused_for_the_same_count_a_platforms_tasks_and_a_worker_held_out():
    with pytest.raises(ValueError, match="already runs 2 workers"):
        _checks()(2)
    with pytest.raises(ValueError, match="the platform's \\(TF_CONFIG\\)"):
        _checks(restartable=False)(3)
    with pytest.raises(ValueError, match=r"^bsp holds worker\(s\) \[1\] out"):
        _checks(active={0})(3)
    _checks()(3)


def test_a_scale_stays_within_the_jobs_bounds():
    check = _checks(3, bounds=(2, 4))
    with pytest.raises(InvalidCommand, match=r"^workers = 1: below cluster.min_workers = 2$"):
        check(1)
    with pytest.raises(InvalidCommand, match=r"^workers = 5: above cluster.max_workers = 4 \(raise it in the job file"):
        check(5)
    check(2)
    check(4)
    with pytest.raises(InvalidCommand, match="^workers = 0: a job needs at least 1 worker$"):
        _checks()(0)
    with pytest.raises(InvalidCommand, match="^workers = 1025: above 1024, the most"):
        _checks()(1025)


def test_local_keeps_each_workers_batch_and_gives_every_phase_still_to_run_the_rate_for_the_new_count():
    phases = [Phase(BSP(BatchSizer(8)), until=0.5, lr_scale=2.0), Phase(ASP(BatchSizer(8)), lr_scale=1.0),
              Phase(BSP(BatchSizer(8)), lr_scale=2.0)]
    rescale(phases, 2, 4, "local", paper_rule, max_batch=8)()
    assert [p.lr_scale for p in phases] == [4.0, 1.0, 4.0]
    assert [p.policy.sizer.batch_size for p in phases] == [8, 8, 8]
    rescale(phases, 4, 3, "local", paper_rule, max_batch=8)()
    assert [p.lr_scale for p in phases] == [3.0, 1.0, 3.0]


def test_global_keeps_the_global_batch_and_the_rate_and_refuses_what_does_not_split():
    phases = [Phase(BSP(BatchSizer(12)), lr_scale=2.0)]
    rescale(phases, 2, 3, "global", paper_rule, max_batch=12)()
    assert (phases[0].policy.sizer.batch_size, phases[0].lr_scale) == (8, 2.0)
    with pytest.raises(ValueError, match="global batch 24 does not split evenly into 5 workers"):
        rescale(phases, 3, 5, "global", paper_rule, max_batch=24)
    with pytest.raises(ValueError, match="sizes per worker; use cluster.scale = 'local'"):
        rescale([Phase(BSP(FixedSizer([4, 8])))], 2, 3, "global", paper_rule, max_batch=16)


def test_a_refusal_by_a_later_phase_changes_no_phase():
    phases = [Phase(BSP(BatchSizer(8)), until=0.5, lr_scale=2.0), Phase(ASP(BatchSizer(8)), lr_scale=1.0)]
    with pytest.raises(ValueError, match="global batch 16 does not split evenly into 3"):
        rescale(phases, 2, 3, "global", paper_rule, max_batch=16)
    with pytest.raises(ValueError, match="more than the input pipeline's 4"):
        rescale(phases, 2, 3, "local", paper_rule, max_batch=4)
    with pytest.raises(ValueError, match="cluster.scale = 'both'"):
        rescale(phases, 2, 3, "both", paper_rule, max_batch=16)
    assert [(p.lr_scale, p.policy.sizer.batch_size) for p in phases] == [(2.0, 8), (1.0, 8)]


def test_the_ledger_keeps_the_counters_and_a_new_worker_starts_level_with_the_slowest():
    ledger = Ledger(2)
    ledger.clocks, ledger.pushes, ledger.updates, ledger.samples = [5, 3], 8, 8, 64
    ledger.restore_state(ledger.save_state())
    ledger.resize(3)
    assert ledger.clocks == [5, 3, 3] and (ledger.pushes, ledger.updates, ledger.samples) == (8, 8, 64)
    assert ledger.view(0.0).members == frozenset({0, 1, 2}) and ledger.view(0.0).min_clock == 3
    from tfsync.policy.base import PushMode
    for w in (0, 2):
        ledger.granted[w] += 1
        ledger.push(w, 8, PushMode.APPLY, 0, 8, start=0.0, end=0.1, arrival=0.2, loss=1.0)
    ledger.resize(1)
    assert ledger.clocks == [6] and ledger.num_workers == 1 and ledger.active == frozenset({0})
    assert [p.worker for p in ledger.history] == [0]   # the removed workers' pushes leave the history
    assert ledger.restore_state(ledger.save_state()) is None


def test_a_straggler_policys_rates_follow_the_count_for_each_protocol_it_runs():
    """The straggler phase runs at BSP's rate (x n) and switches itself to ASP (x1): a
    scale rescales the phase and its per-protocol factors by each protocol's rule, and
    the rate in force is the one of the protocol it runs now."""
    from tfsync.engine.scaling import running_protocol
    from tfsync.switch.online import GreedyStragglerPolicy
    from tfsync.switch.stragglers import StragglerDetector

    policy = GreedyStragglerPolicy(StragglerDetector(1.0, 3), 150_000, lr_scales={"bsp": 2.0, "asp": 1.0})
    phase = Phase(policy, lr_scale=2.0)
    assert running_protocol(policy) == "bsp"
    rescale([phase], 2, 4, "local", paper_rule, max_batch=64)()
    assert phase.lr_scale == 4.0 and policy.lr_scales == {"bsp": 4.0, "asp": 1.0}
    policy.state = "final"   # after its switch point: ASP
    assert running_protocol(policy) == "asp" and running_protocol(BSP(BatchSizer(8))) == "bsp"
    with pytest.raises(ValueError, match="sizes per worker; use cluster.scale = 'local'"):
        rescale([phase], 4, 2, "global", paper_rule, max_batch=64)


def test_what_commands_changed_in_a_phase_follows_the_count():
    """A rate and batch sizes a command set are saved with checkpoints (``Phase.changed``)
    and given back at a resume: after a scale they are the new count's."""
    phase = Phase(BSP(BatchSizer(8)), lr_scale=2.0)
    phase.set_batch_sizes([4, 12], max_batch=16)
    phase.switched(BSP(phase.policy.sizer), "hot", 3.0, {})
    phase.changed["batch_sizes"] = [4, 12]
    rescale([phase], 2, 3, "local", paper_rule, max_batch=16)()
    assert phase.lr_scale == 4.5 and phase.changed["lr_scale"] == 4.5
    assert phase.changed["batch_sizes"] == [4, 12, 8]   # the new worker: the mean of those set


def test_a_count_that_does_not_fit_the_machine_is_refused():
    from tfsync.job.errors import ConfigError

    def fits(n):
        if n > 3:
            raise ConfigError(f"cluster.workers: {n} tasks need more memory than this machine has", "cluster.workers")

    check = _checks(fits=fits)
    check(3)
    with pytest.raises(ValueError, match="4 workers do not fit: cluster.workers: 4 tasks need more memory"):
        check(4)


class _Nodes:
    """The part of HookNodes a join uses: the hooks, added and taken back (the real ones:
    test_hook_cluster)."""

    joinable = True

    def __init__(self):
        self.hooks = ["a:1"]

    def has_hook(self, address):
        return address in self.hooks

    def add_hook(self, address):
        if address == "silent:1":
            raise ValueError(f"hook {address} does not answer from here")
        self.hooks.append(address)

    def remove_hook(self, address):
        self.hooks.remove(address)


def _join(nodes, address, workers=2, add=1, max_workers=None, scale=None):
    """``scaling.join`` on a job of ``workers`` workers run by ``nodes``; returns its answer
    and the events it recorded."""
    from tfsync.engine import scaling
    events = []
    said = scaling.join(nodes, address, workers, add, max_workers, scale or (lambda n, **detail: f"scaled to {n}"),
                        lambda kind, **f: events.append((kind, f)))
    return said, events


def test_a_join_at_the_maximum_adds_the_node_only_and_a_refused_one_leaves_no_node():
    with pytest.raises(ValueError, match=r"not run by node hooks \(cluster.hooks\)"):
        _join(object(), "b:1")
    nodes = _Nodes()
    said, events = _join(nodes, "b:1", workers=3, max_workers=3)
    assert "already runs its maximum of 3 workers (cluster.max_workers)" in said
    assert nodes.hooks == ["a:1", "b:1"]
    assert events == [("node_joined", {"node": "b:1", "workers": 3})]
    assert _join(nodes, "b:1", workers=3, max_workers=3)[0] == "hook b:1 is already one of the job's nodes"
    with pytest.raises(ValueError, match="does not answer"):   # nothing added
        _join((nodes := _Nodes()), "silent:1")
    assert nodes.hooks == ["a:1"]

    asked = []

    def refused(workers, by, node):
        asked.append((workers, by, node))
        raise ValueError("3 workers could not be started")
    with pytest.raises(ValueError, match="could not be started"):
        _join((nodes := _Nodes()), "b:1", add=4, max_workers=5, scale=refused)
    assert asked == [(5, "join", "b:1")] and nodes.hooks == ["a:1"]   # up to the maximum; taken back
    assert _join(_Nodes(), "b:1", add=1)[0] == "hook b:1 joined; scaled to 3"
