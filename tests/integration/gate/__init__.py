"""The gate: sessions, transactions, two-phase commit, limits, shard errors, VSchema DDL."""
