"""SQL text in and out: parsing gate SQL (:mod:`~shardgate.sql.parse`), generating
per-shard dialect SQL (:mod:`~shardgate.sql.dialects`); sqlglot underneath.

Nothing is imported here, so a process that only needs :class:`~shardgate.sql.dialects.Dialect`
(a Spark task, a backend) does not load sqlglot.
"""
