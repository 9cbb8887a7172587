"""`JobConfig`, the one configuration object of CLI and API, and its ways in: a job file
(`load_job`: TOML, or its JSON form, with ``--set`` overrides), a dict shaped like one
(`JobConfig.from_dict`) and its JSON (`JobConfig.from_json`).

Every bad value raises `ConfigError` with one line naming the dotted field, e.g.
``job.toml: train.batch_size = -3: must be an integer >= 1``. The parts, each importing
only those listed before it: `tfsync.job.errors` (ConfigError and how messages show
values), `tfsync.job.schema` (the sections' types and defaults), `tfsync.job.fields`
(each field's check), `tfsync.job.rules` (the document and the rules between fields),
`tfsync.job.overrides` (``--set``). Protocols, their options (types, bounds, defaults)
and what they allow come from the protocol catalogue (`tfsync.policy.catalogue`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from typing import Any, Sequence

from ..base import safefile, usercode
from .errors import ConfigError
from .overrides import apply_overrides, overridden_by, parse_override
from .rules import parse
from .schema import (DEFAULT_PROTOCOL, SECTIONS, ClusterSection, DataSection, Inject, JobSection, ModelSection,
                     ProtocolEntry, SwitchSection, TrainSection)

# A job file is a few KiB of TOML; a larger "job file" is a mistake (a data file, /dev/zero)
# that must not be read into memory. FIFOs and devices are refused too (safefile.read_regular).
MAX_JOB_FILE = 2**20


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """A job: its sections, protocol phases and straggler episodes, checked whenever one is built."""

    job: JobSection = JobSection()
    cluster: ClusterSection = ClusterSection()
    data: DataSection = DataSection()
    model: ModelSection = ModelSection()
    train: TrainSection = TrainSection()
    protocol: tuple[ProtocolEntry, ...] = DEFAULT_PROTOCOL
    switch: SwitchSection = SwitchSection()
    inject: tuple[Inject, ...] = ()

    def __post_init__(self):
        parse(self.to_dict(), "")  # validate objects built directly, too

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str | None = None) -> JobConfig:
        """Build from a dict shaped like the job file; `source` prefixes error messages."""
        return cls(**parse(d, f"{source}: " if source else ""))

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
        out: dict[str, Any] = {s: _plain(getattr(self, s)) for s in SECTIONS}
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
        by = overridden_by(e.field, given)
        if by is None:
            raise
        raise ConfigError(f"{e} (given by --set {by.key})", e.field) from None


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
