"""Spark on the unified stream: the ``magnetar`` PySpark data source.

Every message on a Magnetar topic, whichever protocol produced it, reads as one row of
:data:`SCHEMA` (topic, partition, Kafka-compatible offset, message id, key, value,
properties, publish and event time, producer name, protocol), in batch and in Structured
Streaming; rows write back to topics the same way.

Example (a broker from ``magnetar standalone``)::

    from pyspark.sql import SparkSession
    from spark import register

    session = SparkSession.builder.master("local[2]").getOrCreate()
    register(session)
    df = (session.read.format("magnetar")
          .option("serviceUrl", "pulsar://127.0.0.1:6650")
          .option("adminUrl", "http://127.0.0.1:8080")
          .option("topics", "orders")
          .load())
    df.groupBy("protocol").count().show()

With the ``pyspark_magnetar`` package installed, Spark finds the source by itself and
``register`` is not needed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SCHEMA", "AdminError", "MagnetarDataSource", "MagnetarPartition", "protocol_of", "register"]

# PySpark is imported on first use, so that importing this package (the `magnetar spark`
# command does) costs nothing.
_LAZY = {"SCHEMA": "_source", "MagnetarDataSource": "_source", "MagnetarPartition": "_source",
         "protocol_of": "_source", "AdminError": "_admin"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(session: Any) -> None:
    """Make ``format("magnetar")`` available in ``session`` (a ``SparkSession``)."""
    from ._source import MagnetarDataSource

    session.dataSource.register(MagnetarDataSource)
