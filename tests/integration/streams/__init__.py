"""Change streams: backends' logs, the gate's merged stream, cache invalidation, gRPC."""
