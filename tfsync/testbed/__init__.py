"""A test cluster of separate hosts on one machine (network namespaces): ``tfsync testbed``."""
