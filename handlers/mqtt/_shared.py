"""Shared subscriptions: ``$share/{ShareName}/{filter}`` (MQTT 5.0 section 4.8.2; accepted
from 3.1.1 clients too, as Mosquitto does).

Theory of operation
-------------------
Every session subscribed with the same share name and filter is a member of one group,
and the group is one Shared subscription of the core, named :attr:`ShareFilter.subscription`,
on each topic the filter matches: each member session attaches a consumer to it. The
core's Shared dispatcher then gives each message to one consumer with permits, in turn,
so a message reaches exactly one member; what a member was sent and had not acknowledged
when its connection ended goes back to the subscription and on to another member (the
core returns a closed consumer's unacknowledged messages). The subscription is durable
when the member that creates it has a persistent session, so that a group whose members
are all away keeps its messages; it is deleted when no session holds the filter any more.
Retained messages are not sent on a shared subscribe (section 4.8.2), and No Local on a
shared subscription is a protocol error (MQTT-3.8.3-4).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.routing import mqtt_filter_error

__all__ = ["SHARE_PREFIX", "ShareFilter", "parse_share"]

SHARE_PREFIX = "$share/"


@dataclass(frozen=True, slots=True)
class ShareFilter:
    """A shared subscription's filter, split: ``$share/{share_name}/{topic_filter}``."""

    share_name: str
    topic_filter: str

    @property
    def subscription(self) -> str:
        """The core subscription the group's members consume together."""
        return f"mqtt-share:{self.share_name}/{self.topic_filter}"


def parse_share(topic_filter: str) -> ShareFilter | str | None:
    """None for a filter that is not shared; else its :class:`ShareFilter`, or why it is
    not a valid one (5.0 section 4.8.2: a ShareName of at least one character without
    ``/``, ``+`` or ``#``, then ``/`` and a topic filter)."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    share_name, slash, inner = topic_filter[len(SHARE_PREFIX):].partition("/")
    if not share_name or "+" in share_name or "#" in share_name:
        return "a share name is at least one character, without '+' or '#'"
    if not slash:
        return "a shared subscription names a topic filter after its share name"
    why = mqtt_filter_error(inner)
    if why is not None:
        return why
    return ShareFilter(share_name, inner)
