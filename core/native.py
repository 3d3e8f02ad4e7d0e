"""The Rust core's protocol codecs that handlers call on their hot paths: Pulsar's frame
scans and encoders, and the Kafka record batch ↔ entry conversions. Everything else the
native module holds (ledgers, bookies, the bridge) is reached through :mod:`core.storage`."""

from __future__ import annotations

from core._native import (
    encode_pulsar_messages,
    encode_pulsar_send_receipts,
    kafka_batch_from_entry,
    kafka_entry_from_batch,
    scan_pulsar_acks,
    scan_pulsar_send,
    scan_pulsar_sends,
)

__all__ = ["encode_pulsar_messages", "encode_pulsar_send_receipts", "kafka_batch_from_entry",
           "kafka_entry_from_batch", "scan_pulsar_acks", "scan_pulsar_send", "scan_pulsar_sends"]
