"""tfsync: synchronization protocols for TensorFlow parameter-server training.

Policies (``tfsync.policy``) are plain Python; the engine (``tfsync.engine``) runs them
on ParameterServerStrategy. tf_keras (Keras 2) is the Keras that works under that
strategy (Keras 3 rejects a dataset function there; its maintainers do not support PS
training: keras-team/keras issue 18624), so tfsync asks TensorFlow for it before TF is imported.
"""

import os as _os

_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = "0.1.0"



def __getattr__(name):
    # imported on first use, not with the package: `python -m tfsync.base.isolation` must be
    # able to make a user namespace while the process has one thread (numpy starts more)
    if name in ("DatasetFactory", "worker_index"):
        from .base import pipeline
        return getattr(pipeline, name)
    raise AttributeError(f"module 'tfsync' has no attribute {name!r}")
