"""Pipeline jobs on Spark: ``shardgate spark dump`` and ``shardgate spark archive``.

* :class:`~shardgate.spark.jobs.dump.DumpJob`: a table's consistent snapshot
  into a Delta lake table (delta-rs), kept converging from the change stream
  (newest token wins, deletes as tombstones); :func:`~shardgate.spark.jobs.lake.read_table`
  reads it back as a Spark DataFrame.
* :class:`~shardgate.spark.jobs.archive.ArchiveJob`: acked queue events older
  than a cut-off into date-partitioned Parquet, purged only once written.

See ``docs/spark.md`` ("Jobs").
"""

from shardgate.spark.jobs.archive import ArchiveJob, ArchiveSummary, parse_before
from shardgate.spark.jobs.dump import DumpJob, DumpSummary
from shardgate.spark.jobs.lake import LakeTable, read_table

__all__ = [
    "ArchiveJob",
    "ArchiveSummary",
    "DumpJob",
    "DumpSummary",
    "LakeTable",
    "parse_before",
    "read_table",
]
