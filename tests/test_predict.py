"""Speed predictors (LB-BSP §3.2.1, §4.2, Table 3). The learned ones train real tiny
tf_keras models, inline (threads=0) except where the background trainer is the subject."""

import logging
import math

import numpy as np
import pytest

from tfsync import predict as P
from tfsync.predict import nets

pytestmark = pytest.mark.unit


def rising(n, seed=0, noise=0.2):
    return 10.0 + np.arange(n) + np.random.default_rng(seed).normal(0.0, noise, n)


@pytest.fixture(scope="module")
def inline():
    return P.NarxTrainer(threads=0)


def feed(p, series, cpu=None, mem=None):
    for k, v in enumerate(series):
        p.update(v, None if cpu is None else cpu[k], None if mem is None else mem[k])
    return p


def test_last_value_and_ema_on_a_rising_series():
    s = rising(40)
    assert feed(P.LastValue(), s).predict() == s[-1]
    ema = feed(P.EMA(), s)
    ref = s[0]
    for v in s[1:]:
        ref = 0.2 * v + 0.8 * ref
    assert ema.predict() == pytest.approx(ref)
    assert ema.predict() < s[-1] - 2  # lags a trend by about slope * (1 - a) / a = 4


def test_predict_before_update_and_bad_observations_are_clear_errors():
    with pytest.raises(P.NoObservation, match="call update"):
        P.EMA().predict()
    with pytest.raises(ValueError, match="finite number >= 0"):
        P.EMA().update(float("nan"))
    with pytest.raises(ValueError, match="alpha must be in"):
        P.EMA(alpha=0)


def test_get_by_name_dict_and_unknown_names_or_options():
    assert isinstance(P.get("ema"), P.EMA)
    assert P.get({"name": "ema", "alpha": 0.5}).alpha == 0.5
    assert P.get("narx", warmup=10).warmup == 10  # options of the shared base class
    with pytest.raises(ValueError, match="valid: arima, ema, last, lstm, narx, rnn"):
        P.get("prophet")
    with pytest.raises(ValueError, match="no option 'beta'"):
        P.get("ema", beta=1)
    make = P.factory("ema", alpha=0.3)
    assert make() is not make() and make().alpha == 0.3


def test_arima_follows_a_trend():
    s = rising(60)
    p = feed(P.ARIMAPredictor(), s)
    assert p.fits >= 5 and p.failures == 0
    assert s[-1] < p.predict() < s[-1] + 3


def test_arima_falls_back_to_the_previous_forecast_when_a_fit_fails(monkeypatch, caplog):
    s = rising(33)
    p = feed(P.ARIMAPredictor(refit_every=10, min_obs=12), s[:22])  # fits at 12 and 22
    assert p.fits == 2
    feed(p, s[22:31])  # carried forward; the next refit is due at 32
    before = p.predict()

    def boom(self, data, start):
        raise np.linalg.LinAlgError("singular matrix")

    monkeypatch.setattr(P.ARIMAPredictor, "_fit", boom)
    with caplog.at_level(logging.WARNING, logger="tfsync.predict.arima"):
        p.update(s[31])
    assert p.failures == 1 and p.predict() == before
    assert "fit on 32 observations failed (LinAlgError: singular matrix); keeping the previous" in caplog.text
    p.update(s[32])  # the previous model carries on
    assert math.isfinite(p.predict()) and p.predict() != before


def test_arima_uses_ema_before_its_first_fit_and_if_that_fails(monkeypatch):
    monkeypatch.setattr(P.ARIMAPredictor, "_fit", lambda self, d, s: (_ for _ in ()).throw(ValueError("x")))
    p = feed(P.ARIMAPredictor(min_obs=12), rising(15))
    ema = feed(P.EMA(), rising(15))
    assert p.failures == 1 and p.predict() == pytest.approx(ema.predict())


@pytest.mark.parametrize("kind", ["narx", "rnn", "lstm"])
def test_learned_predictors_follow_a_trend_after_training(kind, inline):
    s = rising(60, seed=1)
    p = P.get(kind, warmup=60, trainer=inline)
    feed(p, s[:59])
    assert not p.using_model and p.predict() == pytest.approx(p.ema.predict())  # EMA before warmup
    p.update(s[59])  # the 60th observation trains (inline)
    assert p.fits == 1 and p.using_model
    assert s[-1] < p.predict() < s[-1] + 3


def test_missing_resource_readings_repeat_the_last_one():
    p = P.NARX()
    for cpu in (40.0, None, None, 80.0):
        p.update(10.0, cpu, None)
    assert p._c == [0.4, 0.4, 0.4, 0.8] and p._m == [0.0] * 4


def test_numpy_inference_matches_keras(inline):
    x8 = np.random.default_rng(0).normal(size=(5, 8))
    x2 = np.random.default_rng(1).normal(size=(5, 2, 1))
    for kind, x in (("narx", x8), ("rnn", x2), ("lstm", x2)):
        model = nets.build(kind, x.shape[1], 3, seed=2)
        ours = nets.forward(kind, [np.array(w) for w in model.get_weights()], x)
        np.testing.assert_allclose(ours, model.predict(x.astype(np.float32), verbose=0)[:, 0], atol=1e-5)
    assert nets.build("narx", 8, 2).count_params() == 21  # the paper's "about 20"


def cpu_driven(n, seed):
    """Speed of step k+1 is set by the CPU reading that came with step k."""
    rng = np.random.default_rng(seed)
    cpu = np.repeat(rng.uniform(10, 90, n // 8 + 1), 8)[:n]
    speed = np.r_[50.0, 100.0 * (1 - cpu[:-1] / 100.0) + rng.normal(0, 1, n - 1)]
    return speed, cpu


@pytest.mark.parametrize("fit", ["lbfgs", "adam"])
def test_narx_beats_ema_when_cpu_drives_the_speed(inline, fit):
    speed, cpu = cpu_driven(160, seed=1)
    narx, ema = P.NARX(warmup=80, trainer=inline, fit=fit), P.EMA()
    err = {"narx": [], "ema": []}
    for k in range(len(speed)):
        if k >= 80:
            err["narx"].append(narx.predict() - speed[k])
            err["ema"].append(ema.predict() - speed[k])
        narx.update(speed[k], cpu[k], 50.0)
        ema.update(speed[k])
    rmse = {k: float(np.sqrt(np.mean(np.square(e)))) for k, e in err.items()}
    assert narx.using_model
    assert rmse["narx"] < 0.6 * rmse["ema"], rmse


def test_narx_lbfgs_fit_lands_at_least_as_low_as_the_papers_adam_fit():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 8))
    truth = [rng.normal(size=(8, 2)), rng.normal(size=2), rng.normal(size=(2, 1)), rng.normal(size=1)]
    y = nets.forward("narx", truth, x) + rng.normal(0, 0.05, 400)
    weights, _, loss = nets.fit_lbfgs("narx", nets.glorot(8, 2, seed=0), x, y)
    assert loss == pytest.approx(float(np.mean((nets.forward("narx", weights, x) - y) ** 2)))
    assert loss < 0.05 ** 2 * 1.5  # the noise floor: a wrong gradient stops far above it
    model = nets.build("narx", 8, 2, seed=0)
    _, _, adam_loss = nets.fit(model, x, y, min_epochs=30, seed=0)
    assert loss <= adam_loss * 1.01, (loss, adam_loss)


def test_narx_fits_by_lbfgs_by_default_and_only_narx_can():
    assert P.NARX().fit == "lbfgs" and P.RNNPredictor().fit == "adam"
    with pytest.raises(ValueError, match="fit must be one of adam"):
        P.RNNPredictor(fit="lbfgs")


def test_reused_weights_are_used_at_once_and_other_kinds_are_refused(inline):
    speed, cpu = cpu_driven(100, seed=2)
    first = feed(P.NARX(warmup=90, trainer=inline), speed, cpu, [50.0] * 100)
    reused = P.NARX(weights=first.weights, trainer=inline, min_train=1000, window=1000)
    feed(reused, speed[:5] * 2, cpu[:5], [50.0] * 5)  # a worker twice as fast
    assert reused.using_model and reused.fits == 0
    assert reused.predict() != pytest.approx(reused.ema.predict())
    with pytest.raises(ValueError, match="weights are of a 'narx' model, expected 'rnn'"):
        P.RNNPredictor(weights=first.weights)


def test_background_trainer_trains_in_its_thread_and_waits_with_a_timeout():
    trainer = P.NarxTrainer(threads=1, epochs=40)
    try:
        ps = [P.NARX(warmup=32, trainer=trainer, seed=i) for i in range(2)]
        for p in ps:
            feed(p, rising(32, seed=3))
        trainer.wait(timeout=60)
        assert [p.fits for p in ps] == [1, 1] and trainer.fits == 2
        assert all(p.using_model for p in ps)
    finally:
        trainer.close()
    with pytest.raises(RuntimeError, match="closed"):
        trainer.request(ps[0])


def test_narx_plain_output_equals_the_numpy_forward_pass():
    """NARX predicts in plain floats with the standardisation folded into its first layer
    (NumPy's per-call cost dominated sizing at 96 workers); same numbers as nets.forward."""
    from tfsync.predict import learned, nets
    rng = np.random.default_rng(1)
    weights = [rng.normal(size=(8, 2)), rng.normal(size=2), rng.normal(size=(2, 1)), rng.normal(size=1)]
    state = {"weights": weights, "x_mean": rng.normal(size=8), "x_std": rng.uniform(0.5, 2.0, size=8)}
    for _ in range(3):
        row = list(rng.normal(size=8))
        expected = nets.forward("narx", weights, ((np.array(row) - state["x_mean"]) / state["x_std"])[None])[0]
        assert learned._narx_output(state, row) == pytest.approx(expected, abs=1e-12)
