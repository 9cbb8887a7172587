"""How a tfsync command ends: its exit codes, the one-line error on stderr, and SIGTERM
read as Ctrl-C. Every command line (``tfsync.cli`` and the sub-commands it assembles)
ends through this module; it imports nothing of tfsync, so any layer may use it.

    return fail(f"{path}: no checkpoint to resume from; ...", EXIT_BAD_INPUT)

prints ``tfsync: error: <message>`` on stderr and returns the code for ``main`` to exit with.
"""

from __future__ import annotations

import sys

EXIT_DONE = 0
EXIT_FAILED = 1         # the run or the environment failed: a task, the cluster, the job store, the network
EXIT_BAD_INPUT = 2      # bad input: a job file or --set, data, options, a job that is not there
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: every task stopped, checkpoints kept

# What `tfsync --help` says of each code, in its order.
EXIT_CODES = (
    (EXIT_DONE, "done (for `run`: the job trained to the end or was stopped by `tfsync stop`)"),
    (EXIT_FAILED, "a run failed (a task, the cluster, the job store or the network)"),
    (EXIT_BAD_INPUT, "bad input: the job file or a --set, data, options, a job that is not there"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C or SIGTERM): every task stopped, checkpoints kept"),
)


class TfsyncError(Exception):
    """A failure tfsync reports in one line, its message saying what happened and what to
    do: every known failure derives from it. ``exit_code``: ``EXIT_FAILED`` (the run or
    the environment) unless the class says ``EXIT_BAD_INPUT`` (what was asked cannot
    be); ``field``: the job-file field or option it is about, where there is one. The
    command line turns any of them into ``tfsync: error: <message>`` and the code
    (``report_error``, which ``tfsync.cli.main`` and the hook's main call); nothing else maps
    exception types to codes."""

    exit_code = EXIT_FAILED
    field: str | None = None


class BadInput(TfsyncError):
    """What was asked cannot be (a job file, data, an option, a path): exit 2."""

    exit_code = EXIT_BAD_INPUT


def shown(value, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for one-line messages about what a caller sent."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + "...'"


def known_error(e: BaseException) -> int | None:
    """The exit code of an error tfsync reports in one line (a ``TfsyncError``, whose
    message says what and what to do; a file-system error naming its path), or None for
    a bug, which keeps its traceback."""
    if isinstance(e, TfsyncError):
        return e.exit_code
    if isinstance(e, OSError) and e.filename:  # the file system: a path not writable, full, too long
        return EXIT_FAILED
    return None


def report_error(e: BaseException) -> int:
    """A command's end by the error ``e``: its one line on stderr and its exit code
    (``known_error``); a bug is raised again, with its traceback."""
    code = known_error(e)
    if code is None:
        raise e
    return fail(f"cannot use {e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else str(e), code)


def fail(message: str, code: int) -> int:
    """Print ``tfsync: error: <message>`` on stderr (one line: what happened and what to do);
    return ``code``."""
    print(f"tfsync: error: {message}", file=sys.stderr)
    return code


def interrupt(signum, frame):
    """A signal handler: SIGTERM (kill, timeout, a batch system) ends a command as Ctrl-C
    does, through KeyboardInterrupt, so every task is stopped on the way out."""
    raise KeyboardInterrupt(f"signal {signum}")


def codes_help() -> str:
    """The ``exit codes:`` table of ``tfsync --help``."""
    return "exit codes:\n" + "".join(f"  {code:<5}{text}\n" for code, text in EXIT_CODES)
