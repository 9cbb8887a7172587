"""``python -m tfsync.cli``: the `tfsync` command line, as the installed `tfsync` runs it."""

from . import main

main()
