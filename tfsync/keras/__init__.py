"""Keras (tf_keras) integration: callbacks for model.fit under ParameterServerStrategy
(a TensorBoard whose update_freq works there), and a local cluster to try them on in one line (``local_cluster``)."""

from ..base.quiet import import_tensorflow

import_tensorflow()  # without its start-up lines (tfsync.base.quiet)

from .local import LocalStrategy, local_cluster  # noqa: E402
from .sync_switch import SyncSwitch  # noqa: E402
from .tensorboard import TensorBoard  # noqa: E402

__all__ = ["LocalStrategy", "SyncSwitch", "TensorBoard", "local_cluster"]
