"""The engine: runs tfsync policies on TensorFlow ParameterServerStrategy."""
