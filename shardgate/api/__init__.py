"""The gRPC transport of the gate: protobuf messages, servicer and client.

Transport only (as Vitess keeps ``grpcvtgateservice`` and ``vtgateconn`` apart
from the gate's logic): :mod:`~shardgate.api.server` exposes a
:class:`~shardgate.gate.Gate`, :mod:`~shardgate.api.client` calls it, and
:mod:`~shardgate.api.convert` translates values and results. The protocol is
``shardgate.proto``; ``scripts/gen-proto.sh`` regenerates the ``*_pb2`` modules.
"""
