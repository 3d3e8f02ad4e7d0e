"""The unified stream: events from every protocol, counted per protocol and key.

Messages produced through any protocol Magnetar serves land on the input topics; this
streaming job counts them per protocol and per key in tumbling event-time windows, with
a watermark so each window is emitted once, when it can no longer change, and writes one
JSON message per (window, protocol, key) to the output topic.

Event time is the message's own event time (Kafka CreateTime, Pulsar eventTime) and,
when it has none, its publish time.

    magnetar spark submit unified_stream -- --topics orders,payments --output counts \\
        --window "1 minute" --watermark "30 seconds" --checkpoint /tmp/unified-ckpt
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

# ISO-8601 with milliseconds and the zone offset ("Z" for UTC): Spark's datetime pattern,
# whose offset letter is X repeated three times.
ISO_TIMESTAMP = "yyyy-MM-dd'T'HH:mm:ss.SSS" + "X" * 3

__all__ = ["counts_per_window", "as_messages", "build_query", "main"]


def counts_per_window(events: Any, window: str, watermark: str) -> Any:
    """``events`` (rows of the magnetar schema) → (windowStart, windowEnd, protocol, key, count)."""
    from pyspark.sql import functions as F

    timed = events.withColumn("eventTs", F.coalesce(F.col("eventTime"), F.col("publishTime")))
    return (timed.withWatermark("eventTs", watermark)
            .groupBy(F.window("eventTs", window).alias("w"), "protocol",
                     F.col("key").cast("string").alias("key"))
            .count()
            .select(F.col("w.start").alias("windowStart"), F.col("w.end").alias("windowEnd"),
                    "protocol", "key", "count"))


def as_messages(counts: Any) -> Any:
    """Counts → rows to write to a topic: key ``protocol/key``, value the row as JSON."""
    from pyspark.sql import functions as F

    return counts.select(
        F.concat_ws("/", "protocol", F.coalesce("key", F.lit(""))).alias("key"),
        F.to_json(F.struct(
            F.date_format("windowStart", ISO_TIMESTAMP).alias("windowStart"),
            F.date_format("windowEnd", ISO_TIMESTAMP).alias("windowEnd"),
            "protocol", "key", "count")).alias("value"),
    )


def build_query(session: Any, *, service_url: str, admin_url: str, topics: str, output: str,
                window: str, watermark: str, checkpoint: str, starting: str = "earliest",
                max_per_trigger: int | None = None) -> Any:
    """The job's streaming writer, ready to ``.start()`` (trigger left to the caller)."""
    reader = (session.readStream.format("magnetar")
              .option("serviceUrl", service_url).option("adminUrl", admin_url)
              .option("topics", topics).option("startingOffsets", starting))
    if max_per_trigger:
        reader = reader.option("maxEntriesPerTrigger", str(max_per_trigger))
    out = as_messages(counts_per_window(reader.load(), window, watermark))
    return (out.writeStream.format("magnetar").outputMode("append")
            .option("serviceUrl", service_url).option("adminUrl", admin_url)
            .option("topic", output).option("checkpointLocation", checkpoint))


def main(argv: Sequence[str] | None = None) -> int:
    from spark.jobs._common import add_connection_arguments, session

    parser = argparse.ArgumentParser(prog="unified_stream", description=__doc__.split("\n\n")[0])
    add_connection_arguments(parser)
    parser.add_argument("--topics", required=True, help="input topics, comma separated")
    parser.add_argument("--output", required=True, help="topic the window counts go to")
    parser.add_argument("--window", default="1 minute")
    parser.add_argument("--watermark", default="30 seconds")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument("--max-per-trigger", type=int, default=None)
    parser.add_argument("--available-now", action="store_true",
                        help="process what is stored, then stop (default: run until stopped)")
    args = parser.parse_args(argv)
    s = session("magnetar-unified-stream", args.master)
    writer = build_query(s, service_url=args.service_url, admin_url=args.admin_url, topics=args.topics,
                         output=args.output, window=args.window, watermark=args.watermark,
                         checkpoint=args.checkpoint, starting=args.starting_offsets,
                         max_per_trigger=args.max_per_trigger)
    query = (writer.trigger(availableNow=True) if args.available_now else writer).start()
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
