"""The control-plane API of tfsync, one subpackage per version (generated from proto/)."""
