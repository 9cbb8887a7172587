"""The control-plane API of tfsync: the wire contract, one subpackage per version
(``v1``, generated from proto/), and how to speak it: job tokens (``auth``) and gRPC
servers, channels and TLS (``transport``), and calls whose failures are tfsync errors
(``client``: no caller reads a gRPC status code). The node hooks and the manager both build on
it, so the hooks need nothing of the manager."""
