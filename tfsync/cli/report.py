"""`tfsync report RUN_DIR [RUN_DIR ...]`: the HTML report of one run, or of several side by side."""

from __future__ import annotations

import os

from ..base.exits import EXIT_BAD_INPUT, fail


def add_commands(sub) -> None:
    p = sub.add_parser(
        "report", help="write an HTML report of one run, or of several runs side by side",
        description="Write one self-contained HTML page (figures embedded, opens offline) of what the runs "
                    "did: loss and test metrics against time and samples, the protocol timeline with "
                    "switches, checkpoints, recoveries and stragglers, per-worker speed (and LB-BSP's "
                    "predictions), batch sizes, staleness and waits, each switch's overhead, and a summary "
                    "table. The figures are also written as PNG files beside the page (<page>_files/). "
                    "`tfsync run` writes RUN_DIR/report.html at its end.")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (a job's run_dir)")
    p.add_argument("-o", "--output", help="the HTML file (default: RUN_DIR/report.html for one run; "
                                          "needed for several)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from ..report.page import write_report

    if len(args.runs) > 1 and not args.output:
        return fail("several runs: name the report file with -o PATH.html", EXIT_BAD_INPUT)
    out = write_report(args.runs, args.output)   # a ReportError: one line and exit 2 (tfsync.cli.main)
    print(os.path.abspath(out))
    return 0
