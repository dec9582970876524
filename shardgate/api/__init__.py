"""The front doors, transport only: :mod:`~shardgate.api.grpc` (the gate's and the
tablets' gRPC services and clients), :mod:`~shardgate.api.mysql` (the MySQL protocol
listener) and :mod:`~shardgate.api.http` (console, ``/debug``, ``/metrics``). Each
unpacks a request, calls the gate with the caller's identity, and packs the answer.
"""
