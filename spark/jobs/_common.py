"""What every job's entry point shares: connection arguments and the session."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--service-url", default="pulsar://127.0.0.1:6650", help="Pulsar service URL")
    parser.add_argument("--admin-url", default="http://127.0.0.1:8080", help="admin REST URL")
    parser.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[2])")


def session(app: str, master: str | None) -> Any:
    """A SparkSession with ``format("magnetar")`` registered; workers use this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark import register

    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit, which sets the master
        builder = builder.master("local[2]")
    s = builder.getOrCreate()
    register(s)
    return s
