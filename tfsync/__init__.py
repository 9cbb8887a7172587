"""tfsync: synchronization protocols for TensorFlow parameter-server training.

Policies (``tfsync.policy``) are plain Python; the engine (``tfsync.engine``) runs them
on ParameterServerStrategy. tf_keras (Keras 2) is the Keras that works under that
strategy (Keras 3 rejects a dataset function there; its maintainers do not support PS
training: keras-team/keras issue 18624), so tfsync asks TensorFlow for it before TF is imported.
"""

import os as _os

_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = "0.1.0"

from .base.pipeline import DatasetFactory, worker_index  # noqa: E402  (after the environment is set)
