"""Lets Spark find ``format("magnetar")`` on its own (SPARK-45917: Spark registers the
``DefaultSource`` of every importable ``pyspark_*`` package)."""

from spark import MagnetarDataSource as DefaultSource

__all__ = ["DefaultSource"]
