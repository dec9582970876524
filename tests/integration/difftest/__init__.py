"""The differential tester of issue 13: a sharded keyspace must answer like one database.

Modules: :mod:`.schema` (tables, vschema, DDL, independent keyspace ids, random
rows), :mod:`.queries` (random SELECTs), :mod:`.dml` (random writes),
:mod:`.compare` (result normalisation), :mod:`.harness` (the databases, the
gate, the checks) and :mod:`.by_design` (constructs whose reference is not
the engine's own answer). The test is ``tests/integration/sql/test_difftest.py``.
"""
