"""PySpark (>= 4.2) data sources and pipeline jobs over a shardgate cluster.

``register(spark)`` makes these formats available by name:

==========================  ============================================  =====================
format                      what                                          module
==========================  ============================================  =====================
``shardgate``               batch read (key-range splits), append and      ``reader``, ``writer``
                            bulk enqueue into queue tables
``shardgate_changes``       the change stream as a streaming source         ``changes_source``
``shardgate_queue``         queue events as a streaming source (acked       ``queue_source``
                            after the batch commits)
==========================  ============================================  =====================

Needs the ``spark`` extra (``pip install 'shardgate[spark]'``) on the driver
and on every executor (Spark imports the classes there), and
``spark.sql.python.filterPushdown.enabled=true`` (the reader pushes filters).
See ``docs/spark.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Spark settings the sources need; :func:`register` checks them.
REQUIRED_CONF = {"spark.sql.python.filterPushdown.enabled": "true"}


def data_sources() -> list[type]:
    """The data source classes, in registration order."""
    from shardgate.spark.changes_source import ShardgateChangesDataSource
    from shardgate.spark.queue_source import ShardgateQueueDataSource
    from shardgate.spark.reader import ShardgateDataSource

    return [ShardgateDataSource, ShardgateChangesDataSource, ShardgateQueueDataSource]


def register(spark: SparkSession) -> None:
    """Register the shardgate formats on ``spark`` (and turn on filter pushdown)."""
    for key, value in REQUIRED_CONF.items():
        spark.conf.set(key, value)
    for cls in data_sources():
        spark.dataSource.register(cls)
