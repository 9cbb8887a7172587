"""Moved to ``tfsync.engine.workload``; this old name still imports it, with a warning."""
from .base.moved import moved

moved(__name__, "tfsync.engine.workload")
