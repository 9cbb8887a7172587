"""Keras (tf_keras) integration: callbacks for model.fit under ParameterServerStrategy."""

from ..quiet import import_tensorflow

import_tensorflow()  # without its start-up lines (tfsync.quiet)

from .sync_switch import SyncSwitch  # noqa: E402

__all__ = ["SyncSwitch"]
