"""Run a job file's training on the local cluster: JobConfig -> engine phases -> summary."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

from ..job.config import JobConfig
from ..job.errors import ConfigError
from ..job.limits import check_job, example_bytes
from ..policy import catalogue
from ..policy.auto import AutoPolicy
from ..policy.base import BatchSizer
from ..policy.sizing import FixedSizer
from ..switch.configuration import ConfigPolicy

logger = logging.getLogger(__name__)


def with_run_dir(cfg: JobConfig, run_dir: str) -> JobConfig:
    return dataclasses.replace(cfg, job=dataclasses.replace(cfg.job, run_dir=run_dir))


def config_policy(cfg: JobConfig) -> ConfigPolicy:
    return ConfigPolicy(lr=cfg.switch.lr, batch=cfg.switch.batch, momentum=cfg.switch.momentum)


def lr_rule(cfg: JobConfig):
    """The learning-rate factor of a protocol a command switches to: the configuration
    policy's, as the job file's phases get theirs."""
    conf = config_policy(cfg)
    return lambda protocol, workers: conf.hyper(protocol, workers, cfg.train.batch_size,
                                                cfg.train.base_momentum).lr_scale


def build_phases(cfg: JobConfig, num_train: int):
    """Engine phases for the job's protocol list, with the configuration policy applied."""
    from ..engine.phase import Phase

    n, B = cfg.cluster.workers, cfg.train.batch_size
    conf = config_policy(cfg)
    phases, prev = [], None
    for p in cfg.protocol:
        after_switch = catalogue.aggregating(prev) and not catalogue.aggregating(p.name)
        hyper = conf.hyper(p.name, n, B, cfg.train.base_momentum, after_switch=after_switch)
        momentum = hyper.momentum
        if after_switch and conf.momentum.startswith("ramp"):  # per epoch after the switch (Fig. 8b)
            momentum = functools.partial(conf.momentum_after, cfg.train.base_momentum, n)
        sizer = FixedSizer(p.batch_sizes) if p.batch_sizes else BatchSizer(hyper.batch_size)
        policy = catalogue.make(p.name, sizer, **p.options())
        if isinstance(policy, AutoPolicy):   # its ASP at the configuration policy's rate and batch
            asp = conf.hyper("asp", n, B, cfg.train.base_momentum, after_switch=True)
            policy.lr_scales = {"lbbsp": hyper.lr_scale, "asp": asp.lr_scale}
            if cfg.train.optimizer == "sgd":   # the momentum the engine can set
                policy.momentum = cfg.train.base_momentum
            elif policy.asp_momentum is not None:
                raise ConfigError(f"protocol.asp_momentum: the optimizer {cfg.train.optimizer!r} has no momentum "
                                  "tfsync sets (only sgd's)", "protocol.asp_momentum")
            policy.asp = catalogue.make("asp", BatchSizer(asp.batch_size))
        phases.append(Phase(policy, until=p.until,
                            switch=cfg.switch.method, lr_scale=hyper.lr_scale, momentum=momentum))
        prev = p.name
    if cfg.switch.stragglers != "none" and cfg.protocol[0].name == "bsp":  # asp alone: nothing before a switch
        total = int(round(cfg.train.epochs * num_train))
        if len(phases) == 1:   # BSP to the end (a switch point of 1), still straggler-aware: ASP while one is
            hyper = conf.hyper("asp", n, B, cfg.train.base_momentum, after_switch=True)
            phases.append(Phase(catalogue.make("asp", BatchSizer(hyper.batch_size)), lr_scale=hyper.lr_scale))
            return [straggler_phase(cfg, phases, None)]
        return [straggler_phase(cfg, phases, int(round(phases[0].until * total)))]
    return phases


def straggler_phase(cfg: JobConfig, phases, bsp_samples: int | None):
    """The bsp -> asp plan as one phase run by Sync-Switch's online straggler policy
    (Sync-Switch §IV-B2): it switches itself, hot, once ``bsp_samples`` are trained (None:
    never: BSP to the end, ASP while a straggler is seen); BSP and ASP keep the learning
    rates of the configuration policy. The momentum rule after the switch does not apply
    here (the base momentum is kept)."""
    from ..engine.phase import Phase
    from ..switch.online import ElasticStragglerPolicy, GreedyStragglerPolicy
    from ..switch.stragglers import StragglerDetector, too_few_to_detect

    bsp, asp = phases
    detector = StragglerDetector(cfg.switch.straggler_window_s, cfg.switch.straggler_k)
    if cfg.cluster.workers < detector.min_workers:
        logger.warning(too_few_to_detect(f"switch.stragglers = {cfg.switch.stragglers}", cfg.cluster.workers,
                                         detector.min_workers))
    options = {"bsp": bsp.policy, "asp": asp.policy, "lr_scales": {"bsp": bsp.lr_scale, "asp": asp.lr_scale}}
    if cfg.switch.stragglers == "elastic":
        policy = ElasticStragglerPolicy(detector, bsp_samples,
                                        readmit_after_s=cfg.switch.readmit_after_s, **options)
    else:
        policy = GreedyStragglerPolicy(detector, bsp_samples, **options)
    return Phase(policy, until=1.0, switch="hot", lr_scale=bsp.lr_scale)


def with_switch_point(cfg: JobConfig, fraction: float) -> JobConfig:
    """``cfg`` training BSP for ``fraction`` of the workload, then ASP."""
    from ..switch.plan import SwitchPlan
    return dataclasses.replace(cfg, protocol=tuple(SwitchPlan.bsp_then_asp(fraction).to_phases()))


def eval_cadence(cfg: JobConfig, num_train: int, evals: int) -> int:
    """Steps between evaluations for about ``evals`` of them over the workload (0: none)."""
    if not evals:
        return 0
    return max(1, int(cfg.train.epochs * num_train / cfg.train.batch_size / evals))


def resumed_workers(cfg: JobConfig, resume: dict | None) -> tuple[int, dict | None]:
    """The worker count a run goes on with: the job file's, or where `tfsync scale` changed
    it before the checkpoint it resumes from, that one (the engine then rescales the plan
    from the job file's count: ``resume["plan_workers"]``, tfsync.engine.scaling)."""
    n = int(resume.get("workers") or cfg.cluster.workers) if resume else cfg.cluster.workers
    if n == cfg.cluster.workers:
        return n, resume
    logger.warning("resume: the job goes on with %d workers, as `tfsync scale` left it (the job file says "
                   "cluster.workers = %d)", n, cfg.cluster.workers)
    return n, {**resume, "plan_workers": cfg.cluster.workers}


def max_batch(phases, workers: int) -> int:
    """The largest batch any phase's policy may grant (the input pipeline's batch)."""
    return max([1] + [ph.policy.max_batch(workers) for ph in phases])


def hook_nodes(cfg: JobConfig):
    """The cluster factory for the job file's ``cluster.hooks`` (None when it lists none)."""
    if not cfg.cluster.hooks:
        return None
    from ..api import auth, transport
    from ..engine.hook_cluster import HookNodes
    token = auth.read_token(os.path.expanduser(cfg.cluster.token_file))
    tls = None
    if cfg.cluster.tls_ca:  # hooks that serve TLS
        tls = transport.TlsConfig(ca_file=cfg.cluster.tls_ca, server_name=cfg.cluster.tls_server_name)
        try:
            transport.channel_credentials(tls)
        except transport.TransportError as e:
            raise ConfigError(f"cluster.tls_ca: {e}", "cluster.tls_ca") from None
    c = cfg.cluster
    pinned = {**{("ps", i): c.hooks.index(a) for i, a in enumerate(c.place_ps)},
              **{("worker", i): c.hooks.index(a) for i, a in enumerate(c.place_workers)}}
    return HookNodes([(a, token) for a in c.hooks], ports=c.task_ports, tls=tls, pinned=pinned)


def platform_cluster(cfg: JobConfig):
    """The cluster factory for tasks a platform started from TF_CONFIG, this process being
    their chief (None when TF_CONFIG is not set)."""
    from ..base import tfconfig
    from ..engine.cluster import PlatformCluster
    try:
        tc = tfconfig.read()
    except tfconfig.TFConfigError as e:
        raise ConfigError(str(e), "TF_CONFIG") from None
    if tc is None:
        return None
    if tc.task_type != "chief":
        raise ConfigError(f"TF_CONFIG.task.type is {tc.task_type!r}: `tfsync run` is the chief (the coordinator); "
                          "a ps or worker runs `python -m tfsync.engine.server`", "TF_CONFIG")
    if cfg.cluster.hooks:
        raise ConfigError("cluster.hooks and TF_CONFIG both name the tasks; keep one", "cluster.hooks")
    for job, count in (("workers", cfg.cluster.workers), ("ps", cfg.cluster.ps)):
        listed = len(tc.spec["worker" if job == "workers" else "ps"])
        if listed != count:
            raise ConfigError(f"cluster.{job} = {count}, but TF_CONFIG lists {listed}; make them agree "
                              f"(--set cluster.{job}={listed})", f"cluster.{job}")
    if cfg.switch.method == "restart":
        raise ConfigError('switch.method = "restart" needs new tasks, but TF_CONFIG\'s are the platform\'s: '
                          'use "hot"', "switch.method")
    return PlatformCluster.factory(tc.spec)


def tasks_here(cfg: JobConfig) -> bool:
    """Whether the job's tasks are this process's to start, on this machine (no hooks, no
    TF_CONFIG naming tasks a platform started)."""
    return not cfg.cluster.hooks and "TF_CONFIG" not in os.environ


def own_process_imports(cfg: JobConfig) -> None:
    """In a command's own process (not a program calling ``tfsync.cli.main``), before any
    TensorFlow context: import TensorFlow and, where the job's tasks run on this machine
    (no hooks, no TF_CONFIG), fork the tasks' fork server from this process, so that one
    import serves both (``tfsync.base.forkserver.fork_here``). What the imports made lives
    as long as the process: Python's full collections skip it from now on (``gc.freeze``,
    0.2 s a collection less; each generation's close makes one)."""
    import gc
    if tasks_here(cfg):
        from ..base import forkserver
        forkserver.prestart(here=True)
    import tensorflow  # noqa: F401
    gc.collect()
    gc.freeze()


def check_batch_fits(cfg: JobConfig, examples: int, workers: int) -> None:
    """A worker's batch larger than the training set is refused (ConfigError naming the
    field and the numbers); a round of all the workers' batches larger than it is said in
    a warning (BSP's one update then covers the set more than once)."""
    sizes = [("train.batch_size", cfg.train.batch_size)] + [
        (f"protocol.{i}.batch_sizes", max(p.batch_sizes)) for i, p in enumerate(cfg.protocol) if p.batch_sizes]
    field, biggest = max(sizes, key=lambda fs: fs[1])
    if biggest > examples:
        raise ConfigError(f"{field}: a worker's batch of {biggest:,} is larger than the training set "
                          f"({examples:,} examples); at most {examples:,}", field)
    round_ = cfg.train.batch_size * workers
    if round_ > examples:
        logger.warning("train.batch_size = %d on %d workers: one round of their batches (%s samples) is larger "
                       "than the training set (%s examples): a BSP update covers it %.2g times",
                       cfg.train.batch_size, workers, f"{round_:,}", f"{examples:,}", round_ / examples)


def run_job(cfg: JobConfig, progress=None, data_path: str | None = None, controller=None,
            resume: dict | None = None, evals_per_run: int = 0, cluster_factory=None) -> dict:
    """Train the job; returns the summary (also in run_dir/summary.json). The tasks run on
    the job file's hooks, else through ``cluster_factory``, else as processes of this one.
    ``evals_per_run``: where the job sets no ``train.eval_every``, evaluate about this
    many times over the workload (the switch-point search needs a curve)."""
    import tensorflow as tf

    from ..engine.generation import TrainSetup
    from ..engine.engine import Engine
    from ..engine.workload import Workload

    tf.random.set_seed(cfg.job.seed)
    data = Workload.from_config(cfg, data_path)  # user code checked on one batch, before any task
    phases = build_phases(cfg, data.train_examples)
    workers, resume = resumed_workers(cfg, resume)
    biggest = max(max_batch(phases, cfg.cluster.workers), max_batch(phases, workers))
    if cfg.cluster.scale == "global":   # each worker's batch: the global one / workers
        biggest = max(biggest, -(-cfg.train.batch_size * cfg.cluster.workers // workers))
    check_batch_fits(cfg, data.train_examples, workers)
    platform = platform_cluster(cfg)
    fits = functools.partial(check_job, ps=cfg.cluster.ps, max_batch=biggest, per_example=example_bytes(*data.sample()),
                             local_tasks=not cfg.cluster.hooks and platform is None)   # fits(workers): a scale asks too
    fits(workers)
    setup = TrainSetup(data.model_fn, data.optimizer_fn, data.loss_fn, data.x_train, data.y_train,
                       max_batch_size=biggest, x_test=data.x_test, y_test=data.y_test, metrics=data.metrics,
                       meta={"job": cfg.job.name, "data": data.source, "model": data.model_name,
                             "eval_data": data.eval_data,
                             "train_examples": int(data.train_examples),
                             "protocols": [[p.name, p.until] for p in cfg.protocol],
                             "stragglers": cfg.switch.stragglers})
    injector = None
    if cfg.inject:
        from ..inject.pause import Episode, PauseSchedule
        injector = PauseSchedule([Episode(x.worker, x.slowdown, x.start_s, x.duration_s) for x in cfg.inject],
                                 pid_of=lambda w: engine.lifecycle.task_pid("worker", w))
    engine = Engine(setup, workers=workers, ps=cfg.cluster.ps, host=cfg.cluster.host,
                    run_dir=cfg.job.run_dir,  # the base rate is the optimizer's (number or schedule)
                    checkpoint_every=cfg.train.checkpoint_every, timeout_s=cfg.train.timeout_s,
                    ps_rounds=cfg.train.ps_rounds, lr_rule=lr_rule(cfg), scale_rule=cfg.cluster.scale,
                    min_workers=cfg.cluster.min_workers, max_workers=cfg.cluster.max_workers, fits=fits,
                    node_wait_s=cfg.cluster.node_wait_s,
                    progress=progress, epoch_samples=data.train_examples, controller=controller,
                    eval_every=cfg.train.eval_every or eval_cadence(cfg, data.train_examples, evals_per_run),
                    eval_samples=cfg.train.eval_samples,
                    on_start=injector.start if injector else None,
                    cluster_factory=hook_nodes(cfg) or platform or cluster_factory)
    total = int(round(cfg.train.epochs * data.train_examples))
    try:
        summary = engine.run(phases, total, resume=resume)
    finally:
        if injector is not None:
            injector.stop()
    if injector is not None:
        log = engine.runlog
        base = log.since(log.train_started) if log.train_started else 0.0  # the run's time base
        summary["injected"] = summary.get("injected", []) + [  # after the earlier runs' (a resumed job)
            {**x, "time": round(base + x["time"], 3)} for x in injector.entries()]
        log.recorder.summary(summary)
    logger.info("run directory: %s", os.path.abspath(cfg.job.run_dir))
    return summary
