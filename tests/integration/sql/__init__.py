"""SQL answers: the gate against one database holding all rows (differential, golden,
SQLAlchemy suite)."""
