"""Arrow <-> Spark schemas for the shardgate sources."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType


def to_spark(schema: pa.Schema) -> StructType:
    """The Spark schema of an Arrow schema (timestamps with a zone -> TIMESTAMP)."""
    return from_arrow_schema(schema, prefer_timestamp_ntz=False)


def to_arrow(schema: StructType) -> pa.Schema:
    """The Arrow schema the reader's batches must have for ``schema``."""
    return to_arrow_schema(schema, timezone="UTC")


def drop_last(schema: pa.Schema, n: int) -> pa.Schema:
    """``schema`` without its last ``n`` fields (the gate's hidden columns)."""
    for _ in range(n):
        schema = schema.remove(len(schema) - 1)
    return schema
