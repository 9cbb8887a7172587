"""The job document as a whole: its sections and keys (did-you-mean for an unknown one),
the ``[[protocol]]`` phases and their options from the protocol catalogue, the
``[[inject]]`` episodes, and the rules between fields. `parse` gives `JobConfig`'s
keyword arguments, each field checked by `tfsync.job.fields`."""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from ..policy import catalogue
from ..policy.options import OptionError
from .errors import ConfigError, bad, show, show_key, toml_type
from .fields import CHECKS, CONTROL, MAX_TEXT
from .schema import DEFAULT_PROTOCOL, OPTIMIZERS, SECTIONS, Inject, ProtocolEntry


def _known(where: str, field: str, key: Any, allowed: list[str], section: bool = False):
    """Reject a key (or section) that is not in `allowed`, suggesting the closest; `field`
    shows the key as `show_key` does."""
    if key not in allowed:
        close = difflib.get_close_matches(key, allowed, n=1) if type(key) is str and len(key) <= 100 else []
        what = f"unknown section [{field}]" if section else f"{field}: unknown key"
        hint = (f" (did you mean [{close[0]}]?)" if section else f" (did you mean {close[0]}?)"
                ) if close else ""
        raise ConfigError(f"{where}{what}{hint}; allowed: {', '.join(allowed)}", field)


def _keys(where: str, field: str, v: Any, allowed: list[str]) -> None:
    """Check that `v` is a table whose keys are in `allowed`."""
    if not isinstance(v, dict):
        bad(where, field, v, "a table", False)
    for key in v:
        _known(where, f"{field}.{show_key(key)}", key, allowed)


def _table(where: str, field: str, v: Any, cls) -> dict[str, Any]:
    """Check that `v` is a table whose keys are fields of `cls`; return the clean values."""
    _keys(where, field, v, [f.name for f in dataclasses.fields(cls)])
    group = field.split("[")[0]
    return {k: CHECKS[f"{group}.{k}"](where, f"{field}.{k}", val) for k, val in v.items()}


def parse(d: Any, where: str) -> dict[str, Any]:
    """Validate a job dict; return JobConfig's keyword arguments."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where}job config must be a table (dict), got {toml_type(d)}")
    for sec in d:
        _known(where, show_key(sec), sec, list(SECTIONS) + ["protocol", "inject"], section=True)
    out: dict[str, Any] = {s: cls(**_table(where, s, d.get(s, {}), cls))
                           for s, cls in SECTIONS.items()}
    out["protocol"] = _protocol(where, d.get("protocol"), out["cluster"].workers)
    out["inject"] = _inject(where, d.get("inject", []), out["cluster"].workers)
    phases = [p.name for p in out["protocol"]]
    if out["switch"].stragglers != "none" and phases not in (["bsp", "asp"], ["bsp"], ["asp"]):
        raise ConfigError(f"{where}switch.stragglers = {show(out['switch'].stragglers)}: needs the protocol "
                          "list bsp -> asp (the online policies act before the switch to ASP; bsp or asp alone "
                          "is a switch point of 1 or 0); got " + " -> ".join(phases),
                          "switch.stragglers")
    if out["switch"].stragglers != "none" and out["switch"].momentum != "keep":
        raise ConfigError(f"{where}switch.momentum = {show(out['switch'].momentum)}: a straggler policy "
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
        bad(where, "cluster.min_workers", c.min_workers, f"<= cluster.workers = {c.workers}")
    if c.max_workers is not None and c.max_workers < c.workers:
        bad(where, "cluster.max_workers", c.max_workers, f">= cluster.workers = {c.workers}")
    for f, places, count in (("cluster.place_ps", c.place_ps, c.ps), ("cluster.place_workers", c.place_workers,
                                                                        c.workers)):
        if places and len(places) != count:
            raise ConfigError(f"{where}{f}: {len(places)} hooks for {count} tasks; give one per task", f)
        stray = [a for a in places if a not in c.hooks]
        if stray:
            raise ConfigError(f"{where}{f}: {show(stray[0])} is not one of cluster.hooks", f)
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
        raise ConfigError(f"{where}switch.momentum = {show(out['switch'].momentum)}: changes SGD's momentum after "
                          f"the switch, and {out['train'].optimizer}'s stays as it was made (RMSprop's is fixed at "
                          "build; the others have none); use \"keep\"", "switch.momentum")


def _inject(where: str, items: Any, workers: int) -> tuple[Inject, ...]:
    if not isinstance(items, (list, tuple)):
        bad(where, "inject", items, "an array of tables (one [[inject]] per straggler episode)", False)
    out = []
    for i, raw in enumerate(items):
        f = f"inject[{i}]"
        v = _table(where, f, raw, Inject)
        if "worker" not in v:
            raise ConfigError(f"{where}{f}.worker: missing; name the worker to slow down (0 .. {workers - 1})",
                              f"{f}.worker")
        if v["worker"] >= workers:
            bad(where, f"{f}.worker", v["worker"], f"< cluster.workers = {workers}")
        out.append(Inject(**v))
    return tuple(out)


def _protocol(where: str, phases: Any, workers: int) -> tuple[ProtocolEntry, ...]:
    if phases is None:
        return DEFAULT_PROTOCOL
    if not isinstance(phases, list) or not phases:
        bad(where, "protocol", phases, "a non-empty array of tables (one [[protocol]] per "
             "phase)", isinstance(phases, list))
    out, prev = [], 0.0
    for i, raw in enumerate(phases):
        f, last = f"protocol[{i}]", i == len(phases) - 1
        _keys(where, f, raw, [*catalogue.RESERVED, *catalogue.option_names()])
        if "name" not in raw:
            raise ConfigError(f"{where}{f}.name: missing; every phase needs a name, one of "
                              f"{', '.join(catalogue.names())}", f"{f}.name")
        name = CHECKS["protocol.name"](where, f"{f}.name", raw["name"])
        spec = catalogue.spec(name)
        until = CHECKS["protocol.until"](where, f"{f}.until", raw["until"]) if "until" in raw \
            else 1.0 if last else None
        if until is None:
            raise ConfigError(f"{where}{f}.until: missing; every phase but the last needs "
                              f"until, a fraction of the workload in (0, 1)", f"{f}.until")
        if until > 1.0 or (last and until != 1.0) or (not last and until == 1.0):
            bad(where, f"{f}.until", raw["until"], "1.0 or omitted (the last phase runs to "
                 "the end)" if last else "< 1.0 (only the last phase ends at 1.0)")
        if until <= prev:
            bad(where, f"{f}.until", raw["until"], f"greater than protocol[{i - 1}].until = "
                 f"{prev} (fractions strictly increase)")
        sizes = raw.get("batch_sizes")
        if sizes is not None:
            if spec.self_sizing:
                bad(where, f"{f}.batch_sizes", sizes, f"left out: {name} sizes its own batches")
            if not isinstance(sizes, (list, tuple)) or len(sizes) != workers or \
                    any(type(b) is not int or b < 1 for b in sizes):
                bad(where, f"{f}.batch_sizes", sizes, f"a list of {workers} integers >= 1, "
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
            bad(where, f"{f}.{key}", v, f"left out: {key} applies only to "
                 + ", ".join(show(n) for n in catalogue.taking(key)))
        if type(v) is str and (len(v) > MAX_TEXT or CONTROL.search(v)):
            bad(where, f"{f}.{key}", v, f"a string of at most {MAX_TEXT} characters, no control characters")
        try:
            out[key] = spec.options[key].clean(v)
        except OptionError as e:
            bad(where, f"{f}.{key}", v, e.allowed, e.type_ok)
    for key, opt in spec.options.items():
        if opt.required and key not in out:
            raise ConfigError(f"{where}{f}.{key}: missing; protocol {spec.name} needs {opt.help}", f"{f}.{key}")
    return out
