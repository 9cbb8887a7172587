"""Data files shipped with tfsync (the bundled MNIST sample)."""
