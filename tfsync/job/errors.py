"""`ConfigError`, the one error of a bad job file or dict, and how its one-line messages
show a field and a value: ``job.toml: train.batch_size = -3: must be an integer >= 1``."""
from __future__ import annotations

import json
import re
from typing import Any

from ..base.exits import BadInput

_SHOWN = 80  # characters of a bad value that an error message shows


class ConfigError(BadInput, ValueError):
    """A job file or dict is invalid; `field` is the dotted path, when there is one."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def show(v: Any) -> str:
    """``v`` as JSON, cut to one short line (one too large or deep to write: its type)."""
    try:
        text = json.dumps(v, default=repr)
    except (ValueError, RecursionError):  # an integer past Python's digit limit, deep nesting
        return f"<{toml_type(v)} too large to show>"
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


def show_key(key: Any) -> str:
    """A key as a field name shows it: a plain one as it is, others quoted and cut short."""
    return key if type(key) is str and re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", key) else show(key)


def toml_type(v: Any) -> str:
    """The TOML name of ``v``'s type (what a message says it got)."""
    return {bool: "boolean", int: "integer", str: "string", list: "array", tuple: "array",
            dict: "table"}.get(type(v), type(v).__name__)


def bad(where: str, field: str, v: Any, allowed: str, type_ok: bool = True):
    """Raise ``<where><field> = <value>: must be <allowed>``, with the type got when it is the wrong one."""
    got = "" if type_ok else f" (got {toml_type(v)})"
    raise ConfigError(f"{where}{field} = {show(v)}: must be {allowed}{got}", field)
