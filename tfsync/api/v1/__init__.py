"""tfsync.api.v1: generated from proto/tfsync/api/v1/*.proto by proto/generate.py. Do not
edit the ``*_pb2*.py`` modules by hand; edit the .proto files and regenerate."""
