"""Bulk copy between databases: each backend's fastest way to read and load many rows
(:mod:`~shardgate.backends.bulk.copy`). Workflows and the Spark pipeline use it; the
COPY text format it shares with the PostgreSQL backend is :mod:`~shardgate.backends.copytext`."""
