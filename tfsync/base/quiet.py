"""TensorFlow imported without its start-up noise, for the CLI and the Python API alike.

Importing TensorFlow prints lines to stderr that no setting turns off (``cudart_stub``'s
"Could not find cuda drivers", written by C++ before absl logging is set up), and its
gRPC runtime logs each cancelled call when a cluster is torn down. Unless
``$TFSYNC_VERBOSE`` is set (`tfsync -v` sets it), the first import of TensorFlow through
tfsync runs with file descriptor 2 pointed at /dev/null, and TF's C++ (``TF_CPP_MIN_LOG_LEVEL``)
and gRPC (``GRPC_VERBOSITY``) logs default to errors only. A program that imported
TensorFlow itself before tfsync keeps what it chose.

The command line goes further (``native_logs_off``): TF's C++ runtime logs through absl,
which no setting quiets, an ``E0000 ... Failed to remove function remotely`` line for
every function of every task a teardown stopped (some 60 per run). `tfsync` commands
therefore point file descriptor 2 at /dev/null for the whole process and write their
own messages, Python's warnings and tracebacks to a copy of the real stderr (only a
process started as `tfsync`: a program calling ``tfsync.cli.main([...])`` keeps its stderr).
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import sys

ENV_VERBOSE = "TFSYNC_VERBOSE"


def verbose() -> bool:
    return os.environ.get(ENV_VERBOSE, "") not in ("", "0")


def import_tensorflow():
    """``import tensorflow`` (once per process), quietly unless verbose; returns the module."""
    if "tensorflow" in sys.modules or verbose():
        import tensorflow
        return tensorflow
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        import tensorflow
    finally:  # an ImportError still propagates, and its traceback reaches the real stderr
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
    return tensorflow


def quiet_tf_loggers() -> None:
    """TF's Python loggers at CRITICAL (a generation's teardown logs every closure it
    cancels; tfsync reports failures itself, in one line), unless verbose."""
    if not verbose():
        logging.getLogger("tensorflow").setLevel(logging.CRITICAL)
        logging.getLogger("absl").setLevel(logging.CRITICAL)


def native_logs_off() -> None:
    """What native code writes to stderr goes to /dev/null from now on; ``sys.stderr``
    (tfsync's messages, logging, tracebacks) to the real stderr. For a command-line
    process, before logging is configured; not when verbose."""
    if verbose():
        return
    sys.stderr.flush()
    real = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    sys.stderr = os.fdopen(real, "w", buffering=1, encoding=sys.stderr.encoding or "utf-8",
                           errors="backslashreplace")
    # a native crash is not silent: Python's "Fatal Python error" and every thread's stack
    # go to the real stderr (TF's own line about it went to /dev/null with the rest)
    faulthandler.enable(file=sys.stderr, all_threads=True)


def end_process(code: int):
    """End a command-line process that has done its work: exit handlers run and output is
    flushed, then the process exits at once, without Python's finalization. That
    finalization runs while TF's and gRPC's daemon threads still do their work (closure
    fetchers blocked on tasks already stopped, a node probe in the middle of a call), and
    it can abort the process (SIGABRT, no message: grpc/grpc#19780) after a run that
    succeeded and wrote its summary."""
    atexit._run_exitfuncs()   # what the process registered (fork servers, temporary directories)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe: nothing more can be said
            pass
    os._exit(0 if code is None else code if isinstance(code, int) else 1)   # as sys.exit reads it
