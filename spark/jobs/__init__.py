"""Runnable example jobs, each a thin entry point over pure DataFrame → DataFrame transforms.

* :mod:`spark.jobs.unified_stream` — streaming: counts per protocol and key in tumbling
  event-time windows (with a watermark), written to a Magnetar topic.
* :mod:`spark.jobs.top_keys` — batch: the busiest keys of a topic's history.

Run one with ``magnetar spark submit unified_stream -- --help`` (or ``spark-submit``).
"""

JOBS = {
    "unified_stream": "spark.jobs.unified_stream",
    "top_keys": "spark.jobs.top_keys",
}

__all__ = ["JOBS"]
