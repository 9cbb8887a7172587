"""Moved to ``tfsync.job.config``; this old name still imports it, with a warning."""
from .base.moved import moved

moved(__name__, "tfsync.job.config")
