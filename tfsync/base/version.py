"""tfsync's version (setup.py says the same), for `tfsync --version`, the manifests it writes and
``tfsync.__version__``."""

VERSION = "0.1.0"
