"""Naming user code in job files: ``"package.module:function"``, or
``"path/to/file.py:function"`` (relative to the job file). No TensorFlow here.

    resolve("mypkg.models:build", "model.fn")     # the function, or UserCodeError
    call("models.py:build", {"units": 64}, "model.fn")

Every failure is a :class:`UserCodeError` whose message is one line naming the job-file
field and the cause (module not found, attribute missing, not callable, the call raised).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys

from . import safefile
from .exits import BadInput

REF = re.compile(r"(?P<module>[^:]+):(?P<attr>[A-Za-z_][A-Za-z0-9_.]*)")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class UserCodeError(BadInput, ValueError):
    """User code named in a job file cannot be found or used (one line, names the field)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def is_file_ref(ref: str) -> bool:
    m = REF.fullmatch(ref)
    return bool(m) and m.group("module").endswith(".py")


def check(ref: str) -> bool:
    """Whether ``ref`` has the form of a reference (it is not imported)."""
    m = REF.fullmatch(ref)
    return bool(m) and (m.group("module").endswith(".py") or bool(_MODULE.fullmatch(m.group("module"))))


def absolute(ref: str, base_dir: str) -> str:
    """``ref`` with a relative file path made absolute against ``base_dir`` (the job
    file's directory); module references are returned as they are."""
    if not is_file_ref(ref):
        return ref
    path, attr = ref.rsplit(":", 1)
    return f"{os.path.normpath(os.path.join(base_dir, os.path.expanduser(path)))}:{attr}"


def _load_file(path: str, field: str):
    if not os.path.isfile(path):  # a FIFO or device is never opened: importing it would block or never end
        problem = os.path.exists(path) and safefile.not_regular(path, os.stat(path))
        raise UserCodeError(field, str(problem) if problem else f"file {path} does not exist")
    name = "tfsync_user_" + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # its own helper modules import too
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise UserCodeError(field, f"importing {path} raised {_one_line(e)}") from None
    return module


def resolve(ref: str, field: str):
    """The callable ``ref`` names."""
    if not isinstance(ref, str) or not check(ref):
        raise UserCodeError(field, f"{ref!r} is not a reference to a function; expected "
                                   '"package.module:function" or "path/to/file.py:function"')
    module_name, attr = ref.rsplit(":", 1)
    if module_name.endswith(".py"):
        module = _load_file(module_name, field)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            raise UserCodeError(field, f"module {e.name!r} not found (importing {module_name}); is it installed, "
                                       "or on PYTHONPATH? A file path works too: \"path/to/file.py:function\"") from None
        except Exception as e:
            raise UserCodeError(field, f"importing {module_name} raised {_one_line(e)}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserCodeError(field, f"{module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserCodeError(field, f"{ref} is a {type(obj).__name__}, not a function or class")
    return obj


def call(ref: str, args: dict, field: str):
    """``resolve(ref)(**args)``; an exception it raises becomes a one-line UserCodeError."""
    fn = resolve(ref, field)
    try:
        return fn(**args)
    except Exception as e:
        raise UserCodeError(field, f"{ref}({', '.join(f'{k}=...' for k in args)}) raised {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__
