"""YAML text of plain data (dicts, lists, strings, numbers, booleans, None), written
block style as ``kubectl`` users read it, for ``tfsync k8s``'s manifests: tfsync has no
YAML library among its dependencies, and writing is the easy half.

    text = dump_all([{"apiVersion": "v1", "kind": "ConfigMap", ...}, ...])

Unambiguous rather than pretty where the two differ: a string is written plain only
where no reader could take it for anything but that string (a name such as ``mnist-job``
or ``/bin/sh``: a letter, ``_`` or ``/`` first, then letters, digits, ``_.-/``; never
``no``, ``on`` or ``null``), multi-line text as a literal block (``|``) that keeps it
exactly (shell scripts, files), and everything else double-quoted, so ``"0400"``,
``"1e3"`` or ``"0.0.0.0:7000"`` stay strings in YAML 1.1 and 1.2 readers alike.
Standard library only (base layer).
"""

from __future__ import annotations

import re

# keys that YAML 1.1 readers (PyYAML, Kubernetes' sigs.k8s.io/yaml) would read as booleans or null
_SPECIAL = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"}
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_.\-/]*")


def dump_all(documents) -> str:
    """The documents as one YAML stream, each opened by ``---``."""
    return "".join("---\n" + "\n".join(_block(doc, 0)) + "\n" for doc in documents)


def _printable(ch: str) -> bool:
    """A character YAML allows as it is (its printable set, less NEL and the line separators)."""
    c = ord(ch)
    return (0x20 <= c <= 0x7E or 0xA0 <= c <= 0xD7FF or 0xE000 <= c <= 0xFFFD or 0x10000 <= c <= 0x10FFFF) \
        and c not in (0x2028, 0x2029)


def quoted(text: str) -> str:
    """``text`` as a double-quoted YAML scalar."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif _printable(ch):
            out.append(ch)
        else:
            c = ord(ch)
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(
                ch, f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"))
    return '"' + "".join(out) + '"'


def _literal(text: str) -> str | None:
    """The header of a literal block that keeps ``text`` exactly (``|``, ``|-`` or ``|+``
    for one, no or more final line breaks), or None where a quoted scalar must."""
    lines = text.split("\n")
    if len(lines) < 2 or not lines[0] or lines[0][0] in " \t" or any(
            not all(_printable(ch) or ch == "\t" for ch in line) or (line and line != line.rstrip(" \t"))
            for line in lines):
        return None
    breaks = len(text) - len(text.rstrip("\n"))
    return "|" if breaks == 1 else "|-" if breaks == 0 else "|+"


def _scalar(value) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return repr(value)
    if isinstance(value, str):
        return value if _plain(value) else quoted(value)
    raise TypeError(f"cannot write a {type(value).__name__} as YAML: {value!r}")


def _key(key) -> str:
    if not isinstance(key, str):
        raise TypeError(f"YAML keys here are strings, got {key!r}")
    return key if _plain(key) else quoted(key)


def _plain(text: str) -> bool:
    return bool(_PLAIN.fullmatch(text)) and text.lower() not in _SPECIAL


def _inline(value, pad: str) -> tuple[str, list[str]]:
    """What follows ``key:`` or ``-`` on its line, and the lines after it (at ``pad``)."""
    if isinstance(value, dict) and value:
        return "", _block(value, len(pad))
    if isinstance(value, (list, tuple)) and value:
        return "", _block(list(value), len(pad))
    if isinstance(value, dict):
        return " {}", []
    if isinstance(value, (list, tuple)):
        return " []", []
    header = _literal(value) if isinstance(value, str) else None
    if header:
        return " " + header, [pad + line if line else "" for line in value.rstrip("\n").split("\n")] \
            + [""] * (max(0, len(value) - len(value.rstrip("\n")) - 1))
    return " " + _scalar(value), []


def _block(value, indent: int) -> list[str]:
    """The lines of a non-scalar ``value`` at ``indent`` spaces."""
    pad = " " * indent
    lines = []
    if isinstance(value, dict):
        for key, item in value.items():
            head, rest = _inline(item, pad if isinstance(item, (list, tuple)) else pad + "  ")
            lines.append(f"{pad}{_key(key)}:{head}")
            lines += rest
        return lines
    if isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)) and item:
                inner = _block(item, indent + 2)
                lines.append(pad + "- " + inner[0][indent + 2:])
                lines += inner[1:]
            else:
                head, rest = _inline(item, pad + "  ")
                lines.append(f"{pad}-{head}")
                lines += rest
        return lines
    raise TypeError(f"a YAML document here is a mapping or a list, got {type(value).__name__}")
