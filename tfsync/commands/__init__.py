"""The sub-commands of `tfsync` (tfsync/cli.py assembles them) and the job runner."""
