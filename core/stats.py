"""Broker-wide counters that the metrics endpoint and admin stats read."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BrokerStats"]


@dataclass
class BrokerStats:
    in_entries: int = 0
    in_messages: int = 0
    in_bytes: int = 0
    out_messages: int = 0
    out_bytes: int = 0

    def record_publish(self, entries: int, messages: int, size: int) -> None:
        self.in_entries += entries
        self.in_messages += messages
        self.in_bytes += size

    def record_dispatch(self, messages: int, size: int) -> None:
        self.out_messages += messages
        self.out_bytes += size
