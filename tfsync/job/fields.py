"""Each field's own check: `CHECKS` maps a dotted field (``"train.batch_size"``) to a
check(where, field, value) that returns the clean value or raises `ConfigError` with one
line naming the field, the value and what it must be. The names a field may take are
read when it is checked (`tfsync.job.schema`, the protocol catalogue), so extensions count."""
from __future__ import annotations

import math
import re
from typing import Any, Callable

from ..base import usercode
from ..policy import catalogue
from . import schema
from .errors import ConfigError, bad, show

MAX_TEXT = 4096  # characters of a string value (a path, name or reference)
_MAX_DEPTH = 32  # nesting of the tables and arrays in *args (keyword arguments of user code)
_INT_MAX = 2**63 - 1  # integers are 64-bit, as in TOML
_MAX_SECONDS = 10_000_000  # about 116 days: longer waits overflow timers
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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

def _rule(allowed: Callable[[], str], typed: Callable, ok: Callable, clean=lambda v: v):
    """A check(where, field, value) -> clean value, failing with `allowed()` in the message.
    Strings are at most ``MAX_TEXT`` characters, without control characters."""
    def check(where, field, v):
        if type(v) is str and (len(v) > MAX_TEXT or CONTROL.search(v)):
            bad(where, field, v, f"{allowed()} (a string of at most {MAX_TEXT} characters, no control characters)")
        if not (typed(v) and ok(v)):
            bad(where, field, v, allowed(), typed(v))
        return clean(v)
    return check


def _int(lo: int, hi: int | None = None) -> Callable:
    """An integer >= ``lo`` (and <= ``hi``); one past 64 bits never passes."""
    top = _INT_MAX if hi is None else hi

    def check(where, field, v):
        if type(v) is not int or not lo <= v <= top:
            upper = f" and <= {top}" if hi is not None or (type(v) is int and v > top) else ""
            bad(where, field, v, f"an integer >= {lo}{upper}", type(v) is int)
        return v
    return check


def _number(lo: float, hi: float = math.inf, lo_open: bool = True) -> Callable:
    text = f"a number {'>' if lo_open else '>='} {lo}" + (f" and < {hi}" if hi < math.inf else "")
    return _rule(lambda: text, lambda v: type(v) in (int, float),
                 lambda v: _finite(v) and (v > lo if lo_open else v >= lo) and v < hi,
                 float)


def _choice(registry: str | Callable) -> Callable:
    """One of a registry's names, read at call time (extensions count): the name of a
    tuple (or dict, by its keys) of `tfsync.job.schema`, or a function returning the names."""
    names = registry if callable(registry) else lambda: getattr(schema, registry)
    return _rule(lambda: "one of " + ", ".join(show(n) for n in names()),
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
        if name not in schema.SCHEDULES and not (type(name) is str and usercode.check(name)):
            bad(where, f"{field}.schedule", name, "one of " + ", ".join(show(n) for n in schema.SCHEDULES)
                 + ' (tf_keras.optimizers.schedules) or a "module:function" returning a schedule, '
                 "with its options beside it")
        return _ARGS(where, field, v)
    if type(v) is str:
        bad(where, field, v, 'a number > 0, a schedule table {schedule = "ExponentialDecay", ...} or a '
             '"module:function" reference returning a tf_keras LearningRateSchedule', False)
    return _number(0)(where, field, v)


_METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_METRIC_ALLOWED = ('a tf_keras metric name ("accuracy", "mae", "AUC"), a "module:function" reference, or a '
                   'table {metric = "SparseTopKCategoricalAccuracy", k = 5, name = "top5"}')


def _metrics(where: str, field: str, v: Any):
    """train.metrics: names or references, or tables ``{metric = ..., name = ..., options}``;
    whether a name is a tf_keras metric is checked when the workload is built."""
    if type(v) is not list:
        bad(where, field, v, "an array, each entry " + _METRIC_ALLOWED, False)
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
                bad(where, f"{f}.name", name, "a name of letters, digits and '_' (reported as test_<name>)")
            named = f"{f}.name" if "name" in item else f"{f}.metric"
            f = f"{f}.metric"
        if type(what) is str and (len(what) > MAX_TEXT or CONTROL.search(what)):
            bad(where, f, what, f"{_METRIC_ALLOWED} (at most {MAX_TEXT} characters, no control characters)")
        if not (type(what) is str and (_METRIC_NAME.fullmatch(what) or usercode.check(what))):
            bad(where, f, what, _METRIC_ALLOWED, type(what) is str)
        if name == "loss":
            bad(where, named, name, "another name: test_loss is the loss")
        if name in seen:
            bad(where, named, name, f"listed once (train.metrics[{seen[name]}] is the same); give one a name")
        seen[name] = i
    return tuple(v) or None


def _host_port(a: Any) -> bool:
    """``"host:port"`` with a port in 1..65535."""
    m = re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:(\d{1,5})", a) if type(a) is str else None
    return bool(m) and 1 <= int(m.group(1)) <= 65535


CHECKS: dict[str, Callable] = {
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
    "train.optimizer": _rule(lambda: "one of " + ", ".join(show(n) for n in schema.OPTIMIZERS)
                             + ' or "module:function"',
                             lambda v: type(v) is str, lambda v: v in schema.OPTIMIZERS or usercode.check(v)),
    "train.optimizer_args": _ARGS, "train.loss": _text(r"[A-Za-z_][A-Za-z0-9_]*|[^:]+:[A-Za-z_][\w.]*",
                                                        "a tf_keras.losses class name or \"module:function\""),
    "train.loss_args": _ARGS, "train.metrics": _metrics,
    "train.epochs": _number(0, 1_000_000), "train.checkpoint_every": _int(0),
    "train.eval_every": _int(0), "train.eval_samples": _int(0), "train.timeout_s": _number(0, _MAX_SECONDS),
    "train.ps_rounds": _rule(lambda: "true or false", lambda v: type(v) is bool, lambda v: True),
    "switch.method": _choice("SWITCH_METHODS"), "switch.lr": _choice("SWITCH_LR"),
    "switch.batch": _choice("SWITCH_BATCH"),
    "switch.momentum": _choice("SWITCH_MOMENTUM"), "switch.point": _choice("SWITCH_POINT"),
    "switch.stragglers": _choice("STRAGGLER_POLICIES"), "switch.straggler_window_s": _number(0, _MAX_SECONDS),
    "switch.straggler_k": _int(1), "switch.readmit_after_s": _number(0, _MAX_SECONDS),
    "inject.worker": _int(0), "inject.slowdown": _number(1, _MAX_SECONDS, lo_open=False),
    "inject.start_s": _number(0, _MAX_SECONDS, lo_open=False), "inject.duration_s": _number(0, _MAX_SECONDS),
    "protocol.name": _choice(catalogue.names), "protocol.until": _number(0),
}


def check_field(field: str, value: Any, source: str | None = None) -> Any:
    """``value`` checked as the job-file field ``field`` (e.g. ``"job.name"``) is; ConfigError if bad."""
    return CHECKS[field](f"{source}: " if source else "", field, value)
