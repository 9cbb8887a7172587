"""Run a job file's training on the local cluster: JobConfig -> engine phases -> summary."""

from __future__ import annotations

import functools
import logging
import os

from . import policy as policies
from .config import JobConfig
from .policy.sizing import FixedSizer
from .switch.configuration import AGGREGATING, ConfigPolicy

logger = logging.getLogger(__name__)


def build_phases(cfg: JobConfig, num_train: int):
    """Engine phases for the job's protocol list, with the configuration policy applied."""
    from .engine.trainer import Phase

    n, B = cfg.cluster.workers, cfg.train.batch_size
    conf = ConfigPolicy(lr=cfg.switch.lr, batch=cfg.switch.batch, momentum=cfg.switch.momentum)
    phases, prev = [], None
    for p in cfg.protocol:
        after_switch = prev in AGGREGATING and p.name not in AGGREGATING
        hyper = conf.hyper(p.name, n, B, cfg.train.momentum, after_switch=after_switch)
        momentum = hyper.momentum
        if after_switch and conf.momentum.startswith("ramp"):  # per epoch after the switch (Fig. 8b)
            momentum = functools.partial(conf.momentum_after, cfg.train.momentum, n)
        if p.name == "lbbsp":  # sizes its own batches: X = n * B split by predicted speed
            policy = policies.get(p.name, batch_size=hyper.batch_size, **p.options())
        else:
            sizer = FixedSizer(p.batch_sizes) if p.batch_sizes else policies.BatchSizer(hyper.batch_size)
            policy = policies.get(p.name, sizer=sizer, **p.options())
        phases.append(Phase(policy, until=p.until,
                            switch=cfg.switch.method, lr_scale=hyper.lr_scale, momentum=momentum))
        prev = p.name
    return phases


def max_batch(phases, workers: int) -> int:
    sizes = [1]
    for ph in phases:
        s = ph.policy.sizer
        if isinstance(s, FixedSizer):
            sizes += list(s.per_worker)
        elif isinstance(ph.policy, policies.LBBSP):  # one worker may get X = n * B less 1 per other
            sizes.append(s.hi if isinstance(s.hi, int) else s.batch_size * workers - (workers - 1))
        else:
            sizes.append(s.batch_size)
    return max(sizes)


def run_job(cfg: JobConfig, progress=None, data_path: str | None = None, controller=None,
            resume: dict | None = None) -> dict:
    """Train the job on a local cluster; returns the summary (also in run_dir/summary.json)."""
    import tensorflow as tf
    import tf_keras as keras

    from .data import load
    from .engine.generation import TrainSetup
    from .engine.models import build_model
    from .engine.trainer import Engine

    data = load(cfg.data.name, data_path or cfg.data.path)
    tf.random.set_seed(cfg.job.seed)
    phases = build_phases(cfg, len(data.y_train))

    def model_fn():
        return build_model(cfg.model.name, data.input_shape, data.num_classes, seed=cfg.job.seed)

    def optimizer_fn():
        return keras.optimizers.SGD(cfg.train.learning_rate, momentum=cfg.train.momentum)

    def loss_fn(y, logits):
        return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)

    setup = TrainSetup(model_fn, optimizer_fn, loss_fn, data.x_train, data.y_train,
                       max_batch_size=max_batch(phases, cfg.cluster.workers), x_test=data.x_test, y_test=data.y_test,
                       meta={"job": cfg.job.name, "data": data.source, "model": cfg.model.name,
                             "train_examples": int(len(data.y_train))})
    engine = Engine(setup, workers=cfg.cluster.workers, ps=cfg.cluster.ps, host=cfg.cluster.host,
                    run_dir=cfg.job.run_dir, base_lr=cfg.train.learning_rate,
                    checkpoint_every=cfg.train.checkpoint_every, timeout_s=cfg.train.timeout_s,
                    progress=progress, epoch_samples=len(data.y_train), controller=controller)
    total = int(round(cfg.train.epochs * len(data.y_train)))
    summary = engine.run(phases, total, resume=resume)
    logger.info("run directory: %s", os.path.abspath(cfg.job.run_dir))
    return summary
