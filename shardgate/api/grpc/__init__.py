"""The gRPC transport of the gate and the tablets: protobuf messages, servicers and clients.

Transport only (as Vitess keeps ``grpcvtgateservice`` and ``vtgateconn`` apart
from the gate's logic): :mod:`~shardgate.api.grpc.server` exposes a
:class:`~shardgate.gate.Gate`, :mod:`~shardgate.api.grpc.client` calls it,
:mod:`~shardgate.api.grpc.tablet_service` and :mod:`~shardgate.api.grpc.tablet_client`
carry the gate-tablet hop, and :mod:`~shardgate.api.grpc.convert` translates values and
results. The protocol is ``shardgate.proto``; ``scripts/gen-proto.sh`` regenerates the
``*_pb2`` modules.
"""
