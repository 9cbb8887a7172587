"""The job file (TOML) and `JobConfig`, the one configuration object of CLI and API.

Every bad value raises `ConfigError` with one line naming the dotted field, e.g.
``job.toml: train.batch_size = -3: must be an integer >= 1``. Protocols, their options
(types, bounds, defaults) and what they allow come from the protocol catalogue
(`tfsync.policy.catalogue`).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import tomllib
from typing import Any, Callable, Sequence

from ..base import safefile, usercode
from ..policy import catalogue
from ..policy.options import OptionError
from ..base.exits import BadInput

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
# A job file is a few KiB of TOML; a larger "job file" is a mistake (a data file, /dev/zero)
# that must not be read into memory. FIFOs and devices are refused too (safefile.read_regular).
MAX_JOB_FILE = 2**20


class ConfigError(BadInput, ValueError):
    """A job file or dict is invalid; `field` is the dotted path, when there is one."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


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
    training starts (after the cluster's start-up), for ``duration_s``, worker ``worker``'s task is paused so that its steps
    take ``slowdown`` times as long (tfsync.inject.pause)."""

    worker: int
    slowdown: float = 2.0
    start_s: float = 0.0
    duration_s: float = 60.0


DEFAULT_PROTOCOL = (ProtocolEntry("bsp", until=0.5), ProtocolEntry("asp"))
_SECTIONS = {"job": JobSection, "cluster": ClusterSection, "data": DataSection,
             "model": ModelSection, "train": TrainSection, "switch": SwitchSection}


@dataclasses.dataclass(frozen=True)
class JobConfig:
    job: JobSection = JobSection()
    cluster: ClusterSection = ClusterSection()
    data: DataSection = DataSection()
    model: ModelSection = ModelSection()
    train: TrainSection = TrainSection()
    protocol: tuple[ProtocolEntry, ...] = DEFAULT_PROTOCOL
    switch: SwitchSection = SwitchSection()
    inject: tuple[Inject, ...] = ()

    def __post_init__(self):
        _parse(self.to_dict(), "")  # validate objects built directly, too

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str | None = None) -> JobConfig:
        """Build from a dict shaped like the job file; `source` prefixes error messages."""
        return cls(**_parse(d, f"{source}: " if source else ""))

    @classmethod
    def from_json(cls, text: str, source: str | None = None) -> JobConfig:
        """Build from the JSON form (``to_dict``); bad JSON is a ConfigError too."""
        where = f"{source}: " if source else ""
        try:
            d = json.loads(text)
        except RecursionError:
            raise ConfigError(f"{where}arrays or objects nested too deeply; a job config nests a few levels") from None
        except ValueError as e:  # bad JSON, an integer past Python's digit limit
            raise ConfigError(f"{where}not a JSON job config: {str(e).splitlines()[0][:200]}") from None
        return cls.from_dict(d, source)

    def to_dict(self) -> dict[str, Any]:
        """A plain dict shaped like the job file (None values left out)."""
        out: dict[str, Any] = {s: _plain(getattr(self, s)) for s in _SECTIONS}
        for sec in ("model", "data"):  # a user's function replaces the bundled name
            if out[sec].get("fn"):
                out[sec].pop("name", None)
        out["protocol"] = [p.to_dict() for p in self.protocol]
        if self.inject:
            out["inject"] = [_plain(x) for x in self.inject]
        return out


def load_job(path: str | os.PathLike, overrides: Sequence[str] = ()) -> JobConfig:
    """Read and validate a TOML job file (or its JSON form, ``JobConfig.to_dict``, for a .json path).

    ``overrides``: ``"KEY=VALUE"`` texts (``tfsync run --set``), each replacing one value of
    the file before it is validated: KEY a dotted path into its tables (``train.epochs``,
    ``model.args.units``, ``protocol.0.until`` for an entry of an array of tables), VALUE a
    TOML value (``2``, ``0.5``, ``true``, ``"text"``, ``[1, 2]``, ``{a = 1}``; a bare word is
    a string). File references in an override are relative to the working directory, those
    of the file to its directory. A malformed override is a ConfigError naming it.
    """
    try:
        raw = safefile.read_regular(path, MAX_JOB_FILE, "job file")
        d = json.loads(raw) if os.fspath(path).endswith(".json") else tomllib.loads(raw.decode())
    except safefile.NotRegularFileError as e:
        raise ConfigError(f"{e}; pass the path of a TOML job file (example: jobs/mnist.toml)") from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such job file; pass the path of a TOML job file "
                          f"(example: jobs/mnist.toml)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read job file: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: TOML syntax error: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: JSON syntax error: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file; a job file is TOML text") from None
    except RecursionError:
        raise ConfigError(f"{path}: arrays or tables nested too deeply; a job file nests a few levels") from None
    except ValueError as e:  # a NUL in the path, a JSON integer past Python's digit limit
        raise ConfigError(f"{path}: cannot read job file: {str(e).splitlines()[0]}") from None
    d = _absolute_refs(d, os.path.dirname(os.path.abspath(path)))
    given = [parse_override(text) for text in overrides]
    if given:
        d = _absolute_refs(apply_overrides(d, given), os.getcwd())
    try:
        return JobConfig.from_dict(d, source=os.fspath(path))
    except ConfigError as e:
        by = _overridden_by(e.field, given)
        if by is None:
            raise
        raise ConfigError(f"{e} (given by --set {by.key})", e.field) from None


OVERRIDE_HELP = ("override one value of the job file: KEY a dotted path into its tables (train.epochs, "
                 "model.args.units, protocol.0.until for [[protocol]] entry 0), VALUE a TOML value (2, 0.5, "
                 "true, '\"text\"', '[1, 2]', '{a = 1}'; a bare word is a string); repeat for more")
_KEY_PART = re.compile(r'\s*(?:"([^"\\\x00-\x1f]*)"|([A-Za-z0-9_-]+))\s*')


@dataclasses.dataclass(frozen=True)
class Override:
    """One ``--set KEY=VALUE``: the path (str keys, int indices into arrays) and the value."""

    key: str                       # as given, trimmed
    path: tuple[str | int, ...]
    value: Any
    text: str                      # the whole --set, for messages

    @property
    def field(self) -> str:
        """The path as error messages name fields: ``protocol[0].until``."""
        out = ""
        for part in self.path:
            out += f"[{part}]" if type(part) is int else (f".{_key(part)}" if out else _key(part))
        return out


def _override_error(text: str, why: str) -> ConfigError:
    return ConfigError(f"--set {_fmt(text)}: {why}")


def parse_override(text: str) -> Override:
    """``"KEY=VALUE"`` as an Override; ConfigError naming the --set when it is malformed.
    A bare numeric part of KEY is an index into an array; quote it ("0") for a key."""
    if type(text) is not str:
        raise _override_error(str(text), "expected KEY=VALUE")
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep:
        raise _override_error(text, "expected KEY=VALUE, e.g. --set train.epochs=2")
    if not key:
        raise _override_error(text, "empty KEY; expected KEY=VALUE, e.g. --set train.epochs=2")
    path: list[str | int] = []
    pos = 0
    while True:
        m = _KEY_PART.match(key, pos)
        if not m or m.end() == pos:
            raise _override_error(text, "KEY must be dotted names (letters, digits, '_', '-', or \"quoted\") "
                                  "and array indices, e.g. model.args.units or protocol.0.until")
        quoted, bare = m.group(1), m.group(2)
        path.append(quoted if quoted is not None else int(bare) if bare.isdigit() else bare)
        pos = m.end()
        if pos == len(key):
            break
        if key[pos] != ".":
            raise _override_error(text, f"unexpected {key[pos]!r} in KEY; parts are separated by '.'")
        pos += 1
    if type(path[0]) is int:
        raise _override_error(text, "KEY starts with an index; the job file is a table: start with its "
                              "section, e.g. protocol.0.until")
    return Override(key, tuple(path), _override_value(text, value), text)


def _override_value(text: str, value: str) -> Any:
    """VALUE read as a TOML value; a bare word that is not one is the string itself."""
    try:
        parsed = tomllib.loads(f"v = {value}")
        if set(parsed) == {"v"}:
            return parsed["v"]
        raise tomllib.TOMLDecodeError("more than one value")
    except RecursionError:
        raise _override_error(text, "VALUE nests arrays or tables too deeply") from None
    except (tomllib.TOMLDecodeError, ValueError) as e:  # ValueError: an integer past the digit limit
        stripped = value.strip()
        if "\n" in value:
            raise _override_error(text, "VALUE spans lines; give one TOML value on one line") from None
        if stripped[:1] in ('"', "'", "[", "{"):
            why = str(e).splitlines()[0] if str(e) else "invalid"
            raise _override_error(text, f"VALUE is not a TOML value ({why}); quote it for the shell, "
                                  "e.g. --set 'job.name=\"x\"' or --set 'model.args={units = 8}'") from None
        return stripped


def apply_overrides(d: Any, overrides: Sequence[Override]) -> Any:
    """A copy of the job dict ``d`` with each override applied in order (tables missing on
    the way are created; an array index must exist). ConfigError naming the --set when its
    KEY does not fit the document."""
    d = _copy_doc(d)
    for o in overrides:
        node, where = d, []
        for i, part in enumerate(o.path):
            last = i == len(o.path) - 1
            here = ".".join(str(p) for p in where) or "the job file"
            if type(part) is int:
                if not isinstance(node, list):
                    raise _override_error(o.text, f"{here} is {_article(node)}, not an array; index {part} "
                                          "applies to an array of tables such as protocol")
                if part >= len(node):
                    raise _override_error(o.text, f"{here} has {len(node)} entr{'y' if len(node) == 1 else 'ies'} "
                                          f"(0 .. {len(node) - 1}); no entry {part}")
            elif not isinstance(node, dict):
                raise _override_error(o.text, f"{here} is {_article(node)}, not a table; it has no key {_key(part)}")
            if last:
                node[part] = o.value
                break
            if isinstance(node, dict) and part not in node:
                if type(o.path[i + 1]) is int:
                    raise _override_error(o.text, f"{'.'.join(map(str, [*where, part]))} is not in the job file, "
                                          f"so there is no entry {o.path[i + 1]}; set the whole array instead")
                node[part] = {}
            node = node[part]
            where.append(part)
    return d


def _copy_doc(v: Any) -> Any:
    """A copy of the tables and arrays of a document (values shared)."""
    if isinstance(v, dict):
        return {k: _copy_doc(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy_doc(x) for x in v]
    return v


def _article(v: Any) -> str:
    t = _toml_type(v)
    return ("an " if t[:1] in "aeiou" else "a ") + t


def _overridden_by(field: str | None, overrides: Sequence[Override]) -> Override | None:
    """The last override that set ``field``, a value inside it, or a table or array around it."""
    if not field:
        return None

    def inside(a: str, b: str) -> bool:  # field a is b or within it
        return a == b or a.startswith(b + ".") or a.startswith(b + "[")
    return next((o for o in reversed(overrides) if inside(field, o.field) or inside(o.field, field)), None)


def check_field(field: str, value: Any, source: str | None = None) -> Any:
    """``value`` checked as the job-file field ``field`` (e.g. ``"job.name"``) is; ConfigError if bad."""
    return _CHECKS[field](f"{source}: " if source else "", field, value)


def _absolute_refs(d: Any, base_dir: str) -> Any:
    """File references of user code and ``cluster.tls_ca`` made absolute against the job file's
    directory, so the config means the same from any working directory (trials, the manager)."""
    if not isinstance(d, dict):
        return d
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    for sec, key in (("model", "fn"), ("data", "fn"), ("train", "optimizer"), ("train", "loss"),
                     ("train", "learning_rate")):
        v = (d.get(sec) or {}).get(key) if isinstance(d.get(sec), dict) else None
        if isinstance(v, str):
            d[sec][key] = usercode.absolute(v, base_dir)
        elif isinstance(v, dict) and isinstance(v.get("schedule"), str):  # {schedule = "file.py:fn", ...}
            d[sec][key] = {**v, "schedule": usercode.absolute(v["schedule"], base_dir)}
    metrics = d["train"].get("metrics") if isinstance(d.get("train"), dict) else None
    if isinstance(metrics, list):  # train.metrics = ["file.py:fn", {metric = "file.py:Cls", ...}]
        d["train"]["metrics"] = [
            usercode.absolute(m, base_dir) if isinstance(m, str) else
            {**m, "metric": usercode.absolute(m["metric"], base_dir)} if isinstance(m, dict)
            and isinstance(m.get("metric"), str) else m for m in metrics]
    ca = d["cluster"].get("tls_ca") if isinstance(d.get("cluster"), dict) else None
    if isinstance(ca, str) and ca:  # the hooks' CA, relative to the job file as well
        d["cluster"]["tls_ca"] = os.path.join(base_dir, os.path.expanduser(ca))
    return d


def _plain(obj) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in dataclasses.asdict(obj).items() if v is not None and v != {}}


# ---- validation: each check takes (where, field, value) and returns the clean value ----

_SHOWN = 80  # characters of a bad value that an error message shows
_MAX_TEXT = 4096  # characters of a string value (a path, name or reference)
_MAX_DEPTH = 32  # nesting of the tables and arrays in *args (keyword arguments of user code)
_INT_MAX = 2**63 - 1  # integers are 64-bit, as in TOML
_MAX_SECONDS = 10_000_000  # about 116 days: longer waits overflow timers
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _fmt(v: Any) -> str:
    """``v`` as JSON, cut to one short line (one too large or deep to write: its type)."""
    try:
        text = json.dumps(v, default=repr)
    except (ValueError, RecursionError):  # an integer past Python's digit limit, deep nesting
        return f"<{_toml_type(v)} too large to show>"
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


def _key(key: Any) -> str:
    """A key as a field name shows it: a plain one as it is, others quoted and cut short."""
    return key if type(key) is str and re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", key) else _fmt(key)


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer too large for a float
        return False


def _plain_value(v: Any, depth: int = 0) -> bool:
    """Whether ``v`` is made of TOML/JSON values (string keys, 64-bit integers), nested at
    most ``_MAX_DEPTH`` deep."""
    if depth > _MAX_DEPTH:
        return False
    if v is None or type(v) in (str, float, bool):
        return True
    if type(v) is int:
        return -_INT_MAX - 1 <= v <= _INT_MAX
    if type(v) in (list, tuple):
        return all(_plain_value(x, depth + 1) for x in v)
    return type(v) is dict and all(type(k) is str and _plain_value(x, depth + 1) for k, x in v.items())


def _toml_type(v: Any) -> str:
    return {bool: "boolean", int: "integer", str: "string", list: "array", tuple: "array",
            dict: "table"}.get(type(v), type(v).__name__)


def _bad(where: str, field: str, v: Any, allowed: str, type_ok: bool = True):
    got = "" if type_ok else f" (got {_toml_type(v)})"
    raise ConfigError(f"{where}{field} = {_fmt(v)}: must be {allowed}{got}", field)


def _rule(allowed: Callable[[], str], typed: Callable, ok: Callable, clean=lambda v: v):
    """A check(where, field, value) -> clean value, failing with `allowed()` in the message.
    Strings are at most ``_MAX_TEXT`` characters, without control characters."""
    def check(where, field, v):
        if type(v) is str and (len(v) > _MAX_TEXT or _CONTROL.search(v)):
            _bad(where, field, v, f"{allowed()} (a string of at most {_MAX_TEXT} characters, no control characters)")
        if not (typed(v) and ok(v)):
            _bad(where, field, v, allowed(), typed(v))
        return clean(v)
    return check


def _int(lo: int, hi: int | None = None) -> Callable:
    """An integer >= ``lo`` (and <= ``hi``); one past 64 bits never passes."""
    top = _INT_MAX if hi is None else hi

    def check(where, field, v):
        if type(v) is not int or not lo <= v <= top:
            upper = f" and <= {top}" if hi is not None or (type(v) is int and v > top) else ""
            _bad(where, field, v, f"an integer >= {lo}{upper}", type(v) is int)
        return v
    return check


def _number(lo: float, hi: float = math.inf, lo_open: bool = True) -> Callable:
    text = f"a number {'>' if lo_open else '>='} {lo}" + (f" and < {hi}" if hi < math.inf else "")
    return _rule(lambda: text, lambda v: type(v) in (int, float),
                 lambda v: _finite(v) and (v > lo if lo_open else v >= lo) and v < hi,
                 float)


def _choice(registry: str | Callable) -> Callable:
    """One of a registry's names, read at call time (extensions count): the name of a
    tuple (or dict, by its keys) in this module, or a function returning the names."""
    names = registry if callable(registry) else lambda: globals()[registry]
    return _rule(lambda: "one of " + ", ".join(_fmt(n) for n in names()),
                 lambda v: type(v) is str, lambda v: v in names())


def _text(pattern: str = r".+", allowed: str = "a non-empty string") -> Callable:
    return _rule(lambda: allowed, lambda v: type(v) is str, lambda v: re.fullmatch(pattern, v))


_REF = _rule(lambda: '"package.module:function" or "path/to/file.py:function"', lambda v: type(v) is str,
             usercode.check)
_ARGS = _rule(lambda: f"a table of keyword arguments (TOML values, nested at most {_MAX_DEPTH} deep)",
              lambda v: type(v) is dict, _plain_value, dict)


def _learning_rate(where: str, field: str, v: Any):
    """A number, a schedule table ``{schedule = NAME or "module:function", options}``, or a
    reference ``"module:function"`` (called without arguments): the callables return a
    tf_keras LearningRateSchedule or a number, checked when the optimizer is built."""
    if type(v) is str and usercode.check(v):
        return v
    if type(v) is dict:
        name = v.get("schedule")
        if name not in SCHEDULES and not (type(name) is str and usercode.check(name)):
            _bad(where, f"{field}.schedule", name, "one of " + ", ".join(_fmt(n) for n in SCHEDULES)
                 + ' (tf_keras.optimizers.schedules) or a "module:function" returning a schedule, '
                 "with its options beside it")
        return _ARGS(where, field, v)
    if type(v) is str:
        _bad(where, field, v, 'a number > 0, a schedule table {schedule = "ExponentialDecay", ...} or a '
             '"module:function" reference returning a tf_keras LearningRateSchedule', False)
    return _number(0)(where, field, v)


_METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_METRIC_ALLOWED = ('a tf_keras metric name ("accuracy", "mae", "AUC"), a "module:function" reference, or a '
                   'table {metric = "SparseTopKCategoricalAccuracy", k = 5, name = "top5"}')


def _metrics(where: str, field: str, v: Any):
    """train.metrics: names or references, or tables ``{metric = ..., name = ..., options}``;
    whether a name is a tf_keras metric is checked when the workload is built."""
    if type(v) is not list:
        _bad(where, field, v, "an array, each entry " + _METRIC_ALLOWED, False)
    seen = {}
    for i, item in enumerate(v):
        f = named = f"{field}[{i}]"
        what, name = item, item
        if type(item) is dict:
            if "metric" not in item:
                raise ConfigError(f"{where}{f}.metric: missing; a table names its metric, e.g. "
                                  '{metric = "SparseTopKCategoricalAccuracy", k = 5}', f"{f}.metric")
            _ARGS(where, f, item)
            what, name = item["metric"], item.get("name", item["metric"])
            if "name" in item and not (type(name) is str and _METRIC_NAME.fullmatch(name)):
                _bad(where, f"{f}.name", name, "a name of letters, digits and '_' (reported as test_<name>)")
            named = f"{f}.name" if "name" in item else f"{f}.metric"
            f = f"{f}.metric"
        if type(what) is str and (len(what) > _MAX_TEXT or _CONTROL.search(what)):
            _bad(where, f, what, f"{_METRIC_ALLOWED} (at most {_MAX_TEXT} characters, no control characters)")
        if not (type(what) is str and (_METRIC_NAME.fullmatch(what) or usercode.check(what))):
            _bad(where, f, what, _METRIC_ALLOWED, type(what) is str)
        if name == "loss":
            _bad(where, named, name, "another name: test_loss is the loss")
        if name in seen:
            _bad(where, named, name, f"listed once (train.metrics[{seen[name]}] is the same); give one a name")
        seen[name] = i
    return tuple(v) or None


def _host_port(a: Any) -> bool:
    """``"host:port"`` with a port in 1..65535."""
    m = re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:(\d{1,5})", a) if type(a) is str else None
    return bool(m) and 1 <= int(m.group(1)) <= 65535


_CHECKS: dict[str, Callable] = {
    "job.name": _text(r"[A-Za-z0-9_.-]{1,64}", "a name of 1 to 64 letters, digits, '.', '_', '-'"),
    "job.run_dir": _text(), "job.seed": _int(0, 2**32 - 1),
    "cluster.workers": _int(1), "cluster.ps": _int(1), "cluster.host": _text(), "cluster.scale": _choice("SCALE_RULES"),
    "cluster.min_workers": _int(1), "cluster.max_workers": _int(1),
    "cluster.node_wait_s": _number(0, _MAX_SECONDS, lo_open=False),
    "cluster.hooks": _rule(lambda: 'a list of distinct "host:port" strings, ports in 1..65535',
                           lambda v: type(v) is list, lambda v: all(map(_host_port, v)) and len(set(v)) == len(v),
                           tuple),
    "cluster.place_ps": _rule(lambda: 'a list of "host:port" hook addresses, one per PS',
                              lambda v: type(v) is list, lambda v: all(map(_host_port, v)), tuple),
    "cluster.place_workers": _rule(lambda: 'a list of "host:port" hook addresses, one per worker',
                                   lambda v: type(v) is list, lambda v: all(map(_host_port, v)), tuple),
    "cluster.token_file": _text(), "cluster.tls_ca": _text(),
    "cluster.tls_server_name": _text(r"[A-Za-z0-9.:\-]+", "a host name (or address) in the hooks' certificates"),
    "cluster.task_ports": _rule(lambda: "[first, last] with 1 <= first <= last <= 65535",
                                lambda v: type(v) is list, lambda v: len(v) == 2 and all(type(p) is int for p in v)
                                and 1 <= v[0] <= v[1] <= 65535, tuple),
    "data.name": _choice("DATASETS"), "data.path": _text(), "model.name": _choice("MODELS"),
    "data.fn": _REF, "data.args": _ARGS, "model.fn": _REF, "model.args": _ARGS,
    "data.validation": _number(0, 1),
    "train.batch_size": _int(1), "train.learning_rate": _learning_rate,
    "train.momentum": _number(0, 1, lo_open=False),
    "train.optimizer": _rule(lambda: "one of " + ", ".join(_fmt(n) for n in OPTIMIZERS) + ' or "module:function"',
                             lambda v: type(v) is str, lambda v: v in OPTIMIZERS or usercode.check(v)),
    "train.optimizer_args": _ARGS, "train.loss": _text(r"[A-Za-z_][A-Za-z0-9_]*|[^:]+:[A-Za-z_][\w.]*",
                                                        "a tf_keras.losses class name or \"module:function\""),
    "train.loss_args": _ARGS, "train.metrics": _metrics,
    "train.epochs": _number(0, 1_000_000), "train.checkpoint_every": _int(0),
    "train.eval_every": _int(0), "train.eval_samples": _int(0), "train.timeout_s": _number(0, _MAX_SECONDS),
    "train.ps_rounds": _rule(lambda: "true or false", lambda v: type(v) is bool, lambda v: True),
    "switch.method": _choice("SWITCH_METHODS"), "switch.lr": _choice("SWITCH_LR"), "switch.batch": _choice("SWITCH_BATCH"),
    "switch.momentum": _choice("SWITCH_MOMENTUM"), "switch.point": _choice("SWITCH_POINT"),
    "switch.stragglers": _choice("STRAGGLER_POLICIES"), "switch.straggler_window_s": _number(0, _MAX_SECONDS),
    "switch.straggler_k": _int(1), "switch.readmit_after_s": _number(0, _MAX_SECONDS),
    "inject.worker": _int(0), "inject.slowdown": _number(1, _MAX_SECONDS, lo_open=False),
    "inject.start_s": _number(0, _MAX_SECONDS, lo_open=False), "inject.duration_s": _number(0, _MAX_SECONDS),
    "protocol.name": _choice(catalogue.names), "protocol.until": _number(0),
}


def _known(where: str, field: str, key: Any, allowed: list[str], section: bool = False):
    """Reject a key (or section) that is not in `allowed`, suggesting the closest; `field`
    shows the key as `_key` does."""
    if key not in allowed:
        close = difflib.get_close_matches(key, allowed, n=1) if type(key) is str and len(key) <= 100 else []
        what = f"unknown section [{field}]" if section else f"{field}: unknown key"
        hint = (f" (did you mean [{close[0]}]?)" if section else f" (did you mean {close[0]}?)"
                ) if close else ""
        raise ConfigError(f"{where}{what}{hint}; allowed: {', '.join(allowed)}", field)


def _keys(where: str, field: str, v: Any, allowed: list[str]) -> None:
    """Check that `v` is a table whose keys are in `allowed`."""
    if not isinstance(v, dict):
        _bad(where, field, v, "a table", False)
    for key in v:
        _known(where, f"{field}.{_key(key)}", key, allowed)


def _table(where: str, field: str, v: Any, cls) -> dict[str, Any]:
    """Check that `v` is a table whose keys are fields of `cls`; return the clean values."""
    _keys(where, field, v, [f.name for f in dataclasses.fields(cls)])
    group = field.split("[")[0]
    return {k: _CHECKS[f"{group}.{k}"](where, f"{field}.{k}", val) for k, val in v.items()}


def _parse(d: Any, where: str) -> dict[str, Any]:
    """Validate a job dict; return JobConfig's keyword arguments."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}job config must be a table (dict), got {_toml_type(d)}")
    for sec in d:
        _known(where, _key(sec), sec, list(_SECTIONS) + ["protocol", "inject"], section=True)
    out: dict[str, Any] = {s: cls(**_table(where, s, d.get(s, {}), cls))
                           for s, cls in _SECTIONS.items()}
    out["protocol"] = _protocol(where, d.get("protocol"), out["cluster"].workers)
    out["inject"] = _inject(where, d.get("inject", []), out["cluster"].workers)
    if out["switch"].stragglers != "none" and [p.name for p in out["protocol"]] not in (["bsp", "asp"], ["bsp"], ["asp"]):
        raise ConfigError(f"{where}switch.stragglers = {_fmt(out['switch'].stragglers)}: needs the protocol "
                          "list bsp -> asp (the online policies act before the switch to ASP; bsp or asp alone "
                          "is a switch point of 1 or 0); got " + " -> ".join(p.name for p in out["protocol"]),
                          "switch.stragglers")
    if out["switch"].stragglers != "none" and out["switch"].momentum != "keep":
        raise ConfigError(f"{where}switch.momentum = {_fmt(out['switch'].momentum)}: a straggler policy "
                          "moves between BSP and ASP many times and keeps the base momentum; use \"keep\" "
                          "or switch.stragglers = \"none\"", "switch.momentum")
    _user_code(where, d, out)
    c = out["cluster"]
    if c.hooks and not c.token_file:
        raise ConfigError(f"{where}cluster.hooks: needs cluster.token_file, the token file the hooks were started "
                          "with (tfsync hook --token-file)", "cluster.token_file")
    remote = [a for a in c.hooks if a.rsplit(":", 1)[0].strip("[]") not in ("127.0.0.1", "::1", "localhost")]
    if (c.tls_ca or c.tls_server_name) and not c.hooks:
        f = "cluster.tls_ca" if c.tls_ca else "cluster.tls_server_name"
        raise ConfigError(f"{where}{f}: applies to cluster.hooks only (the tasks run on this machine)", f)
    if c.tls_server_name and not c.tls_ca:
        raise ConfigError(f"{where}cluster.tls_server_name: needs cluster.tls_ca, the CA certificate of the "
                          "hooks' --tls-cert", "cluster.tls_server_name")
    if remote and c.task_ports is None:
        raise ConfigError(f"{where}cluster.hooks: {', '.join(remote)} not on this machine: give the ports their "
                          "tasks may listen on, cluster.task_ports = [first, last]", "cluster.task_ports")
    if c.min_workers is not None and c.min_workers > c.workers:
        _bad(where, "cluster.min_workers", c.min_workers, f"<= cluster.workers = {c.workers}")
    if c.max_workers is not None and c.max_workers < c.workers:
        _bad(where, "cluster.max_workers", c.max_workers, f">= cluster.workers = {c.workers}")
    for f, places, count in (("cluster.place_ps", c.place_ps, c.ps), ("cluster.place_workers", c.place_workers,
                                                                        c.workers)):
        if places and len(places) != count:
            raise ConfigError(f"{where}{f}: {len(places)} hooks for {count} tasks; give one per task", f)
        stray = [a for a in places if a not in c.hooks]
        if stray:
            raise ConfigError(f"{where}{f}: {_fmt(stray[0])} is not one of cluster.hooks", f)
    return out


def _user_code(where: str, d: dict, out: dict) -> None:
    """The rules between the bundled names and user callables."""
    for sec in ("model", "data"):
        raw = d.get(sec) or {}
        if "fn" in raw and "name" in raw:
            raise ConfigError(f"{where}{sec}.fn: give {sec}.fn or {sec}.name, not both", f"{sec}.fn")
        if raw.get("args") and "fn" not in raw:
            raise ConfigError(f"{where}{sec}.args: applies to {sec}.fn only; name the function with {sec}.fn",
                              f"{sec}.args")
    if "path" in (d.get("data") or {}) and out["data"].fn:
        raise ConfigError(f"{where}data.path: applies to a bundled data set (data.name); pass a path to "
                          "data.fn through data.args", "data.path")
    train = d.get("train") or {}
    if out["model"].fn and not out["train"].loss:
        raise ConfigError(f"{where}train.loss: missing; a model of your own (model.fn) needs its loss: a "
                          'tf_keras.losses class name such as "SparseCategoricalCrossentropy" (with '
                          'loss_args = {from_logits = true} for logits) or "MeanSquaredError", or '
                          '"module:function" returning per-example losses', "train.loss")
    if train.get("loss_args") and not out["train"].loss:
        raise ConfigError(f"{where}train.loss_args: applies to train.loss; name the loss", "train.loss_args")
    if "momentum" in train and out["train"].optimizer != "sgd":
        raise ConfigError(f"{where}train.momentum: applies to sgd; give {out['train'].optimizer}'s options in "
                          "train.optimizer_args", "train.momentum")
    if out["switch"].momentum != "keep" and out["train"].optimizer in OPTIMIZERS and out["train"].optimizer != "sgd":
        raise ConfigError(f"{where}switch.momentum = {_fmt(out['switch'].momentum)}: changes SGD's momentum after "
                          f"the switch, and {out['train'].optimizer}'s stays as it was made (RMSprop's is fixed at "
                          "build; the others have none); use \"keep\"", "switch.momentum")


def _inject(where: str, items: Any, workers: int) -> tuple[Inject, ...]:
    if not isinstance(items, (list, tuple)):
        _bad(where, "inject", items, "an array of tables (one [[inject]] per straggler episode)", False)
    out = []
    for i, raw in enumerate(items):
        f = f"inject[{i}]"
        v = _table(where, f, raw, Inject)
        if "worker" not in v:
            raise ConfigError(f"{where}{f}.worker: missing; name the worker to slow down (0 .. {workers - 1})",
                              f"{f}.worker")
        if v["worker"] >= workers:
            _bad(where, f"{f}.worker", v["worker"], f"< cluster.workers = {workers}")
        out.append(Inject(**v))
    return tuple(out)


def _protocol(where: str, phases: Any, workers: int) -> tuple[ProtocolEntry, ...]:
    if phases is None:
        return DEFAULT_PROTOCOL
    if not isinstance(phases, list) or not phases:
        _bad(where, "protocol", phases, "a non-empty array of tables (one [[protocol]] per "
             "phase)", isinstance(phases, list))
    out, prev = [], 0.0
    for i, raw in enumerate(phases):
        f, last = f"protocol[{i}]", i == len(phases) - 1
        _keys(where, f, raw, [*catalogue.RESERVED, *catalogue.option_names()])
        if "name" not in raw:
            raise ConfigError(f"{where}{f}.name: missing; every phase needs a name, one of "
                              f"{', '.join(catalogue.names())}", f"{f}.name")
        name = _CHECKS["protocol.name"](where, f"{f}.name", raw["name"])
        spec = catalogue.spec(name)
        until = _CHECKS["protocol.until"](where, f"{f}.until", raw["until"]) if "until" in raw \
            else 1.0 if last else None
        if until is None:
            raise ConfigError(f"{where}{f}.until: missing; every phase but the last needs "
                              f"until, a fraction of the workload in (0, 1)", f"{f}.until")
        if until > 1.0 or (last and until != 1.0) or (not last and until == 1.0):
            _bad(where, f"{f}.until", raw["until"], "1.0 or omitted (the last phase runs to "
                 "the end)" if last else "< 1.0 (only the last phase ends at 1.0)")
        if until <= prev:
            _bad(where, f"{f}.until", raw["until"], f"greater than protocol[{i - 1}].until = "
                 f"{prev} (fractions strictly increase)")
        sizes = raw.get("batch_sizes")
        if sizes is not None:
            if spec.self_sizing:
                _bad(where, f"{f}.batch_sizes", sizes, f"left out: {name} sizes its own batches")
            if not isinstance(sizes, (list, tuple)) or len(sizes) != workers or \
                    any(type(b) is not int or b < 1 for b in sizes):
                _bad(where, f"{f}.batch_sizes", sizes, f"a list of {workers} integers >= 1, "
                     f"one per worker (cluster.workers = {workers})")
            sizes = tuple(sizes)
        prev = until
        out.append(ProtocolEntry(name, until, sizes, settings=_options(where, f, spec, raw)))
    return tuple(out)


def _options(where: str, f: str, spec: catalogue.Spec, raw: dict) -> dict[str, Any]:
    """Phase `f`'s protocol options, checked against the catalogue's `spec`."""
    out = {}
    for key, v in raw.items():
        if key in catalogue.RESERVED:
            continue
        if key not in spec.options:
            _bad(where, f"{f}.{key}", v, f"left out: {key} applies only to "
                 + ", ".join(_fmt(n) for n in catalogue.taking(key)))
        if type(v) is str and (len(v) > _MAX_TEXT or _CONTROL.search(v)):
            _bad(where, f"{f}.{key}", v, f"a string of at most {_MAX_TEXT} characters, no control characters")
        try:
            out[key] = spec.options[key].clean(v)
        except OptionError as e:
            _bad(where, f"{f}.{key}", v, e.allowed, e.type_ok)
    for key, opt in spec.options.items():
        if opt.required and key not in out:
            raise ConfigError(f"{where}{f}.{key}: missing; protocol {spec.name} needs {opt.help}", f"{f}.{key}")
    return out
