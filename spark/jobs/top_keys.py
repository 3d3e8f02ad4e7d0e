"""Top-N over a topic's history: the busiest keys, per protocol, with their byte volume.

    magnetar spark submit top_keys -- --topics orders --n 10
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["top_keys", "main"]


def top_keys(messages: Any, n: int) -> Any:
    """Rows of the magnetar schema → the ``n`` keys with most messages:
    (key, messages, bytes, protocols, firstPublished, lastPublished), busiest first,
    ties by key."""
    from pyspark.sql import functions as F

    return (messages.groupBy(F.col("key").cast("string").alias("key"))
            .agg(F.count(F.lit(1)).alias("messages"),
                 F.sum(F.length("value")).alias("bytes"),
                 F.array_sort(F.collect_set("protocol")).alias("protocols"),
                 F.min("publishTime").alias("firstPublished"),
                 F.max("publishTime").alias("lastPublished"))
            .orderBy(F.col("messages").desc(), F.col("key").asc_nulls_last())
            .limit(n))


def main(argv: Sequence[str] | None = None) -> int:
    from spark.jobs._common import add_connection_arguments, session

    parser = argparse.ArgumentParser(prog="top_keys", description=__doc__.split("\n\n")[0])
    add_connection_arguments(parser)
    parser.add_argument("--topics", required=True, help="topics, comma separated")
    parser.add_argument("--n", type=int, default=10)
    args = parser.parse_args(argv)
    s = session("magnetar-top-keys", args.master)
    df = (s.read.format("magnetar").option("serviceUrl", args.service_url)
          .option("adminUrl", args.admin_url).option("topics", args.topics).load())
    top_keys(df, args.n).show(args.n, truncate=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
