"""The cluster manager (gRPC service, job store, launchers): see issue 3."""
