"""One trial of ``tfsync search``, in its own process: ``python -m tfsync.cli.trial OUT``
reads ``{"config": JobConfig dict, "data": path or null}`` on stdin, trains it on a
local cluster and writes the run's summary to OUT (JSON). Exit 1 with a one-line error
on failure."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys

from ..base import safefile
from ..base.exits import EXIT_BAD_INPUT, EXIT_FAILED, interrupt


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tfsync.cli.trial OUT < request.json", file=sys.stderr)
        return EXIT_BAD_INPUT
    signal.signal(signal.SIGTERM, interrupt)  # stop the tasks on the way out, as `tfsync run` does
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tensorflow").setLevel(logging.CRITICAL)
    from ..job.config import JobConfig
    from .jobrun import own_process_imports, run_job
    request = json.load(sys.stdin)
    try:
        cfg = JobConfig.from_dict(request["config"])
        own_process_imports(cfg)
        summary = run_job(cfg, data_path=request.get("data"),
                          evals_per_run=int(request.get("evals_per_run") or 0))
    except Exception as e:  # reported to the search in one line
        print(f"tfsync trial: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        return EXIT_FAILED
    safefile.write(argv[0], json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
