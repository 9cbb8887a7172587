"""The job's types and defaults: one frozen dataclass per section of a job file
(``[job]``, ``[cluster]``, ``[data]``, ``[model]``, ``[train]``, ``[switch]``, each
``[[protocol]]`` phase and ``[[inject]]`` episode), and the names their fields may take.
They check nothing: `tfsync.job.fields` and `tfsync.job.rules` do, and `JobConfig`
(`tfsync.job.config`) puts them together."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..policy import catalogue

# Short names: data.name and model.name stand for these functions (bundled ones in
# tfsync.examples.images), called as data.fn and model.fn are (tfsync.engine.workload): a data
# function with path = data.path, a model function with the data's input_shape and classes
# and seed = job.seed. Other modules may add entries (DATASETS["svhn"] = "mypkg.svhn:load");
# protocols are added to the catalogue (tfsync.policy.register).
DATASETS: dict[str, str] = {"mnist": "tfsync.examples.images:mnist", "cifar10": "tfsync.examples.images:cifar10"}
MODELS: dict[str, str] = {name: f"tfsync.examples.images:{name}" for name in ("cnn", "mlp", "linear")}
# tf_keras optimizers by name -> their class in tf_keras.optimizers (or "module:function"
# returning an optimizer). Not optimizers.get: its dict form can return legacy classes.
OPTIMIZER_CLASSES: dict[str, str] = {
    "sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop", "adagrad": "Adagrad",
    "adadelta": "Adadelta", "adamax": "Adamax", "nadam": "Nadam", "ftrl": "Ftrl", "lion": "Lion",
    "adafactor": "Adafactor"}
OPTIMIZERS: tuple[str, ...] = tuple(OPTIMIZER_CLASSES)
# tf_keras.optimizers.schedules by class name (train.learning_rate = {schedule = ..., ...})
DEFAULT_MOMENTUM = 0.9
SCHEDULES: tuple[str, ...] = ("ExponentialDecay", "PiecewiseConstantDecay", "PolynomialDecay",
                              "InverseTimeDecay", "CosineDecay", "CosineDecayRestarts")
SWITCH_METHODS: tuple[str, ...] = ("restart", "hot")
SWITCH_LR: tuple[str, ...] = ("linear", "constant")
SWITCH_BATCH: tuple[str, ...] = ("local", "global")
SCALE_RULES: tuple[str, ...] = ("local", "global")   # tfsync.engine.scaling
SWITCH_MOMENTUM: tuple[str, ...] = ("keep", "zero", "inverse_n", "ramp_exp", "ramp_linear")
SWITCH_POINT: tuple[str, ...] = ("auto", "job")
STRAGGLER_POLICIES: tuple[str, ...] = ("none", "greedy", "elastic")  # tfsync.switch.online


@dataclasses.dataclass(frozen=True)
class JobSection:
    name: str = "job"
    run_dir: str = ""  # "" -> "runs/<name>"
    seed: int = 0

    def __post_init__(self):
        if not self.run_dir:
            object.__setattr__(self, "run_dir", f"runs/{self.name}")


@dataclasses.dataclass(frozen=True)
class ClusterSection:
    workers: int = 2
    ps: int = 1
    host: str = "127.0.0.1"
    # Node hooks ("host:port", each node running `tfsync hook`) that run the PS and worker
    # tasks, round-robin, PS first; empty: every task on this machine.
    hooks: tuple[str, ...] = ()
    token_file: str | None = None             # the token the hooks were started with (mode 0600)
    task_ports: tuple[int, int] | None = None  # (first, last) port for tasks on remote nodes
    tls_ca: str | None = None           # hooks serve TLS (tfsync hook --tls-cert): the CA of their certificates
    tls_server_name: str | None = None  # a name in those certificates, when the hook addresses are not
    # Pin tasks to nodes: one hook address per PS / per worker (each one of `hooks`);
    # left out: round-robin. A pinned node that does not answer: its tasks go to the others.
    place_ps: tuple[str, ...] = ()
    place_workers: tuple[str, ...] = ()
    # The rate and batch when `tfsync scale` changes the worker count: "local" keeps each
    # worker's batch (the rate by switch.lr for the new count), "global" the global batch.
    scale: str = "local"
    # Elastic bounds: `tfsync scale` stays within them; with min_workers set, a lost worker
    # shrinks the job (while min_workers remain) instead of restarting its task.
    min_workers: int | None = None
    max_workers: int | None = None
    # When none of the hooks answers (every node lost), the job pauses this long for one to
    # come back, its checkpoint kept, before it fails (0: at once).
    node_wait_s: float = 300.0


@dataclasses.dataclass(frozen=True)
class DataSection:
    """A data set by short ``name`` (and ``path``; ``DATASETS``), or the user's ``fn`` ("module:function"
    or "file.py:function", called with ``args``) returning the arrays. ``validation``: the
    share of the training arrays held out for the test_* numbers when there are no test
    arrays (tfsync.engine.workload.hold_out)."""

    name: str = "mnist"
    path: str | None = None  # None: tfsync.base.data's default search
    fn: str | None = None
    args: dict = dataclasses.field(default_factory=dict, hash=False)
    validation: float | None = None

    @property
    def function(self) -> tuple[str, str]:
        """(the field that names it, the "module:function" reference) of the data function."""
        return ("data.fn", self.fn) if self.fn else ("data.name", DATASETS[self.name])


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """A model by short ``name`` (``MODELS``), or the user's ``fn`` returning a tf_keras Model."""

    name: str = "cnn"
    fn: str | None = None
    args: dict = dataclasses.field(default_factory=dict, hash=False)

    @property
    def function(self) -> tuple[str, str]:
        """(the field that names it, the "module:function" reference) of the model function."""
        return ("model.fn", self.fn) if self.fn else ("model.name", MODELS[self.name])


@dataclasses.dataclass(frozen=True)
class TrainSection:
    batch_size: int = 64  # B, per worker
    # eta, per worker: a number, or a schedule {schedule = "ExponentialDecay", ...options}
    learning_rate: float | dict = 0.01
    momentum: float | None = None  # sgd's (unset: DEFAULT_MOMENTUM)
    optimizer: str = "sgd"  # a name of OPTIMIZERS or "module:function"
    optimizer_args: dict = dataclasses.field(default_factory=dict, hash=False)  # its other options
    # per-example loss: a tf_keras.losses class name (options in loss_args) or
    # "module:function"; unset: the bundled models' sparse cross-entropy on logits
    loss: str | None = None
    loss_args: dict = dataclasses.field(default_factory=dict, hash=False)
    # what the evaluator reports beside the loss (tfsync.job.metrics): tf_keras metric names,
    # "module:function", or tables {metric = ..., options}; unset: accuracy for class ids
    metrics: tuple | None = dataclasses.field(default=None, hash=False)

    @property
    def base_momentum(self) -> float:
        """The momentum the configuration policy starts from: sgd's (default 0.9); 0 for
        the other optimizers (their own options are in optimizer_args)."""
        if self.optimizer != "sgd":
            return 0.0
        return DEFAULT_MOMENTUM if self.momentum is None else self.momentum
    epochs: float = 1.0  # total workload, in passes over the training set
    checkpoint_every: int = 200  # steps; 0 = off
    eval_every: int = 0  # steps; 0 = off. Test accuracy in the background, for the curve
    eval_samples: int = 0  # test examples per evaluation (a fixed random subset); 0 = all
    timeout_s: float = 600.0  # a step taking longer fails the job
    ps_rounds: bool = True  # steady BSP rounds closed and opened on the PS itself (tfsync.engine.pilot)


@dataclasses.dataclass(frozen=True, init=False)
class ProtocolEntry:
    """One [[protocol]] entry (a phase of the job): ``ProtocolEntry("ssp", until=0.5, staleness=2)``. Options left out
    take the catalogue's defaults; ``options()`` gives them all."""

    name: str  # a protocol of the catalogue
    until: float = 1.0  # fraction of the total workload at which this phase ends
    batch_sizes: tuple[int, ...] | None = None  # per worker; None = train.batch_size
    settings: dict = dataclasses.field(default_factory=dict, hash=False)  # the protocol's options

    def __init__(self, name: str, until: float = 1.0, batch_sizes: tuple[int, ...] | None = None,
                 settings: dict | None = None, **options):
        spec = catalogue.find(name)
        given = {k: v for k, v in {**(settings or {}), **options}.items() if v is not None}
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "until", until)
        object.__setattr__(self, "batch_sizes", batch_sizes)
        object.__setattr__(self, "settings", {**(spec.defaults() if spec else {}), **given})

    def options(self) -> dict:
        """The policy's keyword arguments this phase sets."""
        return dict(self.settings)

    def to_dict(self) -> dict[str, Any]:
        """The phase as a job file's [[protocol]] table."""
        sizes = {} if self.batch_sizes is None else {"batch_sizes": list(self.batch_sizes)}
        return {"name": self.name, "until": self.until, **self.settings, **sizes}


@dataclasses.dataclass(frozen=True)
class SwitchSection:
    method: str = "hot"  # "hot": swap the policy in place; "restart": checkpoint + restart
    # Configuration policy (Sync-Switch §IV-C; tfsync.switch.configuration):
    lr: str = "linear"  # BSP runs n*eta, ASP eta | "constant": eta throughout
    batch: str = "local"  # ASP runs B per worker | "global": n*B per worker (Fig. 8a)
    momentum: str = "keep"  # after BSP -> ASP: keep | zero | inverse_n | ramp_exp | ramp_linear
    # Timing policy (§IV-B1): "auto" uses the switch point `tfsync search` stored for this
    # recurring job, if any; "job" always uses protocol[0].until of the job file.
    point: str = "auto"
    # Online straggler policy before the switch (§IV-B2): none | greedy | elastic. Needs
    # the protocol list bsp -> asp; a straggler is a worker slower than mean - std for
    # `straggler_k` windows of `straggler_window_s` seconds (needs >= 3 workers).
    stragglers: str = "none"
    straggler_window_s: float = 2.0
    straggler_k: int = 3
    readmit_after_s: float = 100.0  # elastic: a removed worker gets another chance after this


@dataclasses.dataclass(frozen=True)
class Inject:
    """A transient straggler for experiments and tests: from ``start_s`` seconds after
    training starts (after the cluster's start-up), for ``duration_s``, worker ``worker``'s
    task is paused so that its steps take ``slowdown`` times as long (tfsync.inject.pause)."""

    worker: int
    slowdown: float = 2.0
    start_s: float = 0.0
    duration_s: float = 60.0


DEFAULT_PROTOCOL = (ProtocolEntry("bsp", until=0.5), ProtocolEntry("asp"))
SECTIONS = {"job": JobSection, "cluster": ClusterSection, "data": DataSection,
            "model": ModelSection, "train": TrainSection, "switch": SwitchSection}
