"""`tfsync report`: what a run did, as one HTML page a person opens (and its PNGs).

    from tfsync.report import write_report
    write_report(["runs/mnist"])                  # runs/mnist/report.html
    write_report(["runs/a", "runs/b"], "ab.html")  # two runs side by side

matplotlib is imported only when a report is drawn, not with this package (every
`tfsync` command imports it for its --help).
"""

from .load import ReportError, load_run


def write_report(paths: list[str], out: str | None = None) -> str:
    """See :func:`tfsync.report.page.write_report`."""
    from .page import write_report as write

    return write(paths, out)


__all__ = ["ReportError", "load_run", "write_report"]
