"""The engine: runs tfsync policies on TensorFlow ParameterServerStrategy."""

from ..base.quiet import import_tensorflow

import_tensorflow()  # before any engine module imports it: without its start-up lines
