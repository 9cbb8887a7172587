"""Keras (tf_keras) integration: callbacks for model.fit under ParameterServerStrategy."""

from .sync_switch import SyncSwitch

__all__ = ["SyncSwitch"]
