"""The switch-point binary search (Sync-Switch Algorithm 1) on synthetic accuracy curves."""

import math

import numpy as np
import pytest

from tfsync.base.curves import convergence_index, converged_accuracy
from tfsync.switch.search import SearchSettings, binary_search
from tfsync.switch.trials import JobStoreTrials, JsonTrials, MemoryTrials, TrialKey, TrialResult, job_signature

pytestmark = pytest.mark.unit

HIGH, DROP, KNEE = 0.92, 0.03, 0.3
# M = 4 from [0, 1]: 0.5 accept, 0.25 reject, 0.375 accept, 0.3125 accept -> 0.3125, the
# smallest point of the 1/16 grid at or above the knee.
EXPECTED = 0.3125


def knee_trial(sigma=0.0, sim=0, calls=None):
    """Accuracy HIGH for fractions >= KNEE, HIGH - DROP below, plus N(0, sigma) noise;
    time grows with the BSP fraction (BSP is 5x slower than ASP)."""

    def run_trial(fraction, seed):
        if calls is not None:
            calls.append((fraction, seed))
        rng = np.random.default_rng([sim, seed, int(round(fraction * 2 ** 20))])
        acc = (HIGH if fraction >= KNEE else HIGH - DROP) + rng.normal(0.0, sigma)
        return TrialResult(float(acc), 100.0 * (1.0 + 4.0 * fraction))

    return run_trial


def phi(x):
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def test_converged_accuracy():
    curve = [0.1, 0.5, 0.8, 0.9, 0.9100, 0.9105, 0.9102, 0.9108, 0.9101, 0.95]
    assert convergence_index(curve) == 8
    assert converged_accuracy(curve) == 0.9101
    assert converged_accuracy([(i, v) for i, v in enumerate(curve)]) == 0.9101
    assert converged_accuracy([0.1, 0.7, 0.3, 0.6, 0.2, 0.5]) == 0.5  # never converged: the last
    assert converged_accuracy(curve, tol=0.0005) == 0.95
    with pytest.raises(ValueError, match="empty curve"):
        converged_accuracy([])


def test_noise_free_search_finds_the_grid_point_above_the_knee():
    result = binary_search(knee_trial(), "sig", SearchSettings(target=HIGH, settings=4, runs=2, ends=False))
    assert result.fraction == EXPECTED
    assert [(s.fraction, s.accepted) for s in result.settings] == [(0.5, True), (0.25, False), (0.375, True),
                                                                   (0.3125, True)]
    assert result.trials_run == 8 and result.time == pytest.approx(sum(
        2 * 100.0 * (1 + 4 * f) for f in (0.5, 0.25, 0.375, 0.3125)))


def test_success_rate_under_noise_matches_the_analytic_probability():
    sigma, beta, runs, sims = 0.01, 0.01, 3, 200
    # Success needs each of the 4 decisions right: 3 accepts (mean >= A - beta) and 1
    # reject (mean < A - beta); the mean of R runs has sd sigma / sqrt(R).
    p_accept = phi(beta * math.sqrt(runs) / sigma)
    p_reject = phi((DROP - beta) * math.sqrt(runs) / sigma)
    p = p_accept ** 3 * p_reject  # ~0.88
    hits = sum(binary_search(knee_trial(sigma, sim), "sig",
                             SearchSettings(beta=beta, settings=4, runs=runs, target=HIGH)).fraction == EXPECTED
               for sim in range(sims))
    rate = hits / sims
    sd = math.sqrt(p * (1 - p) / sims)
    assert abs(rate - p) <= 4 * sd, (rate, p)
    assert rate >= 0.75


def test_target_is_measured_from_r_bsp_runs_when_not_given():
    calls = []
    result = binary_search(knee_trial(0.01, calls=calls), "sig", SearchSettings(settings=2, runs=3, seed=10, ends=False))
    assert calls[:3] == [(1.0, 10), (1.0, 11), (1.0, 12)]
    assert len(result.bsp) == 3 and result.target == pytest.approx(np.mean(result.bsp))
    assert [c[1] for c in calls[3:]] == [10, 11, 12] * 2  # run r of every setting: seed + r


@pytest.mark.parametrize("accept", ["at_least", "interval"])
def test_the_accumulator_reset_matters(accept):
    fixed = binary_search(knee_trial(), "sig", SearchSettings(target=HIGH, accept=accept))
    flawed = binary_search(knee_trial(), "sig", SearchSettings(target=HIGH, accept=accept, paper_accumulation=True))
    assert fixed.fraction == EXPECTED
    # The printed algorithm's alpha' / R doubles from the second setting on: every later
    # setting is accepted (at_least) or rejected (interval), whatever its accuracy.
    assert flawed.fraction != EXPECTED
    assert flawed.settings[1].score == pytest.approx(HIGH + HIGH - DROP)


def test_interval_rule_rejects_a_switch_point_much_better_than_the_target():
    better = lambda f, seed: TrialResult(0.95, 1.0)  # noqa: E731
    assert binary_search(better, "s", SearchSettings(target=0.9, settings=2, accept="interval")).fraction == 1.0
    assert binary_search(better, "s", SearchSettings(target=0.9, settings=2)).fraction == 0.25


@pytest.mark.parametrize("kind", ["memory", "json"])
def test_an_interrupted_search_resumes_with_only_the_missing_trials(kind, tmp_path):
    settings = SearchSettings(settings=4, runs=3, ends=False)  # 3 BSP + 12 candidate trials
    make_store = (lambda: JsonTrials(tmp_path / "trials.json")) if kind == "json" else None
    memory = MemoryTrials()
    store = make_store() if make_store else memory

    class Boom(RuntimeError):
        pass

    first_calls = []
    inner = knee_trial(0.005, calls=first_calls)

    def failing(fraction, seed):
        if len(first_calls) == 7:
            raise Boom("worker lost")
        return inner(fraction, seed)

    with pytest.raises(Boom):
        binary_search(failing, "sig", settings, store)
    assert len(first_calls) == 7
    second_calls, events = [], []
    store = make_store() if make_store else memory  # a fresh process reads the same file
    resumed = binary_search(knee_trial(0.005, calls=second_calls), "sig", settings, store, progress=events.append)
    reference = binary_search(knee_trial(0.005), "sig", settings)
    assert (resumed.fraction, resumed.settings, resumed.target) == (reference.fraction, reference.settings,
                                                                    reference.target)
    assert not set(first_calls) & set(second_calls)  # nothing asked twice
    assert resumed.trials_reused == 7 and resumed.trials_run == 15 - 7 == len(second_calls)
    assert [e["reused"] for e in events] == [True] * 7 + [False] * 8


def test_job_signature_is_stable_and_discriminating():
    a = job_signature("resnet32", "cifar10", 8, {"lr": 0.1, "batch": 128})
    assert a == job_signature("resnet32", "cifar10", 8, {"batch": 128, "lr": 0.1})
    assert a != job_signature("resnet32", "cifar10", 16, {"lr": 0.1, "batch": 128})
    assert a == "4e3054a3407de96b"  # changing the hash would orphan every stored search


def test_job_store_adapter_round_trips_through_the_manager_store(tmp_path):
    from tfsync.manager.store import Store

    with Store(tmp_path / "jobs.db") as db:
        sig = job_signature("mlp", "mnist", 4)
        job = db.create_job("j1", sig, {"model": "mlp"})
        trials = JobStoreTrials(db, job.id)
        key = TrialKey(sig, 0.25, 1)
        assert trials.get(key) is None
        trials.put(key, TrialResult(0.91, 12.5, {"curve": [0.5, 0.91]}))
        later = db.create_job("j2", sig, {"model": "mlp"})  # the job recurs: earlier trials are found
        again = JobStoreTrials(db, later.id)
        assert again.get(key) == TrialResult(0.91, 12.5)
        assert again.get(TrialKey(sig, 0.25, 0)) is None and again.get(TrialKey("other", 0.25, 1)) is None
        assert [r.kind for r in db.runs(job.id)] == ["trial"]


def test_config_signature_ignores_what_a_search_varies():
    """Same recurring job: other names, paths, seed, protocol list, switch point and
    straggler options; another job: other model, data, cluster size or hyper-parameters."""
    from tfsync.job.config import JobConfig
    from tfsync.switch.trials import config_signature
    base = JobConfig.from_dict({"cluster": {"workers": 3}})
    sig = config_signature(base.to_dict())
    same = JobConfig.from_dict({"job": {"name": "other", "seed": 7, "run_dir": "x"}, "cluster": {"workers": 3},
                                "data": {"path": "/elsewhere.npz"}, "protocol": [{"name": "asp"}],
                                "train": {"eval_every": 50, "checkpoint_every": 10, "metrics": ["mae"]},
                                "switch": {"point": "job", "method": "restart"},
                                "inject": [{"worker": 1}]})
    assert config_signature(same.to_dict()) == sig
    for other in ({"cluster": {"workers": 2}}, {"cluster": {"workers": 3}, "model": {"name": "mlp"}},
                  {"cluster": {"workers": 3}, "data": {"name": "cifar10"}},
                  {"cluster": {"workers": 3}, "train": {"learning_rate": 0.02}},
                  {"cluster": {"workers": 3}, "switch": {"momentum": "zero"}}):
        assert config_signature(JobConfig.from_dict(other).to_dict()) != sig, other
    # a user's model and data: their functions and arguments tell jobs apart
    user = {"cluster": {"workers": 3}, "model": {"fn": "m.py:build", "args": {"units": 8}},
            "data": {"fn": "m.py:data"}, "train": {"loss": "mse"}}
    sigs = {config_signature(JobConfig.from_dict(u).to_dict()) for u in (
        user, {**user, "model": {"fn": "m.py:build", "args": {"units": 9}}}, {**user, "model": {"fn": "m.py:other"}},
        {**user, "data": {"fn": "m.py:data", "args": {"n": 5}}})}
    assert len(sigs) == 4 and sig not in sigs


def test_a_trial_scores_its_accuracy_or_else_minus_log_of_its_converged_test_loss():
    import math

    from tfsync.cli.search import trial_score

    assert trial_score({"converged_accuracy": 0.9, "test_loss": 0.3}) == (0.9, "accuracy")
    evals = [{"loss": v} for v in (2.0, 1.0, 0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.3)]
    score, metric = trial_score({"converged_accuracy": None, "evals": evals, "test_loss": 0.3})
    assert metric == "neg_log_loss" and score == pytest.approx(-math.log(0.4))  # converged, not the last
    assert trial_score({"converged_accuracy": None, "evals": [], "test_loss": 2.0})[0] == pytest.approx(-math.log(2))
    with pytest.raises(ValueError, match="reports neither"):
        trial_score({"converged_accuracy": None, "evals": [], "test_loss": None})
    with pytest.raises(ValueError, match=r"test loss is -0.5 \(not > 0\)"):
        trial_score({"converged_accuracy": None, "test_loss": -0.5})


def plans(acc_of, time_of):
    """A trial whose accuracy and training time follow its BSP share."""
    return lambda fraction, seed: TrialResult(acc_of(fraction), time_of(fraction))


def test_the_search_answers_asp_only_when_asp_alone_is_acceptable_and_fastest():
    run = plans(lambda f: 0.9, lambda f: 100.0 + 50.0 * f)   # staleness costs nothing here
    result = binary_search(run, "s", SearchSettings(settings=2, runs=1))
    assert (result.fraction, result.searched) == (0.0, 0.25)   # Algorithm 1 alone would switch at 0.25
    assert result.times == {0.0: 100.0, 0.25: 112.5, 1.0: 150.0}
    assert (result.settings[-1].fraction, result.settings[-1].accepted) == (0.0, True)
    assert binary_search(run, "s", SearchSettings(settings=2, runs=1, ends=False)).fraction == 0.25


def test_the_search_answers_bsp_only_when_the_switch_costs_more_than_it_saves():
    # BSP as fast as ASP per sample, and the switch's restart costs 30 s: BSP alone wins
    run = plans(lambda f: 0.9 if f >= 0.3 else 0.85, lambda f: 100.0 + (30.0 if 0 < f < 1 else 0.0))
    result = binary_search(run, "s", SearchSettings(settings=3, runs=2))
    assert result.searched == 0.375 and result.fraction == 1.0
    assert result.times == {0.375: 130.0, 1.0: 100.0}   # ASP only was not acceptable: no candidate


def test_with_a_given_target_bsp_only_is_no_candidate_unless_nothing_else_was_acceptable():
    run = plans(lambda f: 0.9 if f >= 0.3 else 0.85, lambda f: 100.0 + 100.0 * f)
    result = binary_search(run, "s", SearchSettings(target=0.9, settings=2, runs=1))
    assert (result.fraction, result.times) == (0.5, {0.5: 150.0})   # no BSP runs were made to time it
    never = binary_search(plans(lambda f: 0.5, lambda f: 1.0), "s", SearchSettings(target=0.9, settings=2, runs=1))
    assert (never.fraction, never.times) == (1.0, {})
