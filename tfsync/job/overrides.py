"""``tfsync run --set KEY=VALUE``: an override parsed (`parse_override`), applied to a job
file's document before it is validated (`apply_overrides`), and found again when a field
it set is wrong (`overridden_by`), so that the error names the --set."""
from __future__ import annotations

import dataclasses
import re
import tomllib
from typing import Any, Sequence

from .errors import ConfigError, show, show_key, toml_type

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
            out += f"[{part}]" if type(part) is int else (f".{show_key(part)}" if out else show_key(part))
        return out


def _override_error(text: str, why: str) -> ConfigError:
    return ConfigError(f"--set {show(text)}: {why}")


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
                raise _override_error(o.text, f"{here} is {_article(node)}, not a table; "
                                      f"it has no key {show_key(part)}")
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
    t = toml_type(v)
    return ("an " if t[:1] in "aeiou" else "a ") + t


def overridden_by(field: str | None, overrides: Sequence[Override]) -> Override | None:
    """The last override that set ``field``, a value inside it, or a table or array around it."""
    if not field:
        return None

    def inside(a: str, b: str) -> bool:  # field a is b or within it
        return a == b or a.startswith(b + ".") or a.startswith(b + "[")
    return next((o for o in reversed(overrides) if inside(field, o.field) or inside(o.field, field)), None)
