"""A topic's subscriptions: list, create, delete, reset-cursor (by time or message id),
skip, skip-all (clear backlog), expire (one or all subscriptions), peek, and reading a
message by id or by position (examine-message). On a partitioned topic each operation
applies to every partition, as Pulsar does, except those Pulsar refuses there with 405
(reset-cursor to a message id, skip, peek, examine): a message id or position names one
partition's ledger, and a count of messages no one partition's."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from core.storage import Position
from core.topic import COMPACTION_CURSOR

from ._common import (
    LONG_MAX,
    LONG_MIN,
    RestError,
    body_object,
    endpoint,
    json_body,
    path_int,
    query_bool,
    query_int,
    topic_of,
)
from ._messages import entry_response
from .topics import DOMAINS, existing_namespace, load_topic, partition_targets

__all__ = ["routes"]

_MAX_ID = 0x7FFFFFFFFFFFFFFF


def _message_id(body: Any) -> tuple[str, Position | None]:
    """``("latest"|"earliest"|"position", position)`` from a MessageIdImpl body."""
    if body is None:
        return "latest", None
    data = body_object(body, "MessageId")
    try:
        ledger, entry = int(data.get("ledgerId", -1)), int(data.get("entryId", -1))
    except (TypeError, ValueError, OverflowError):
        raise RestError(400, "ledgerId and entryId must be integers") from None
    if not (LONG_MIN <= ledger <= LONG_MAX and LONG_MIN <= entry <= LONG_MAX):
        raise RestError(400, f"ledgerId and entryId must be between {LONG_MIN} and {LONG_MAX}")
    if ledger >= _MAX_ID and entry >= _MAX_ID:
        return "latest", None
    if ledger < 0:
        return "earliest", None
    return "position", Position(ledger, entry)


def _properties(body: Any) -> dict[str, str]:
    """A subscription's properties from a JSON object of strings (400 otherwise)."""
    if body is None:
        return {}
    if not isinstance(body, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in body.items()):
        raise RestError(400, "Subscription properties must be an object of string values")
    return dict(body)


def _expiry_age(request: Request) -> int:
    """The ``{seconds}`` of an expire-messages call: at least 0 (412 otherwise, as Pulsar
    answers)."""
    seconds = path_int(request, "seconds")
    if seconds < 0:
        raise RestError(412, "Expire time must be >= 0")
    return seconds


def routes(broker: Any) -> list[Route]:
    async def topics_of(request: Request) -> list[Any]:
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        return [await load_topic(broker, t) for t in partition_targets(broker, name)]

    async def subs_of(request: Request) -> list[Any]:
        sub_name = str(request.path_params["subscription"])
        found = []
        for topic in await topics_of(request):
            sub = topic.subscriptions.get(sub_name)
            if sub is None:
                raise RestError(404, "Subscription not found")
            found.append(sub)
        return found

    def refuse_partitioned(request: Request, reason: str) -> None:
        """405 on a partitioned topic's base name, as Pulsar answers there: only its
        partitions hold messages."""
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        if name.partition_index < 0 and broker.policies.partitions(name):
            raise RestError(405, reason)

    async def refuse_non_persistent(request: Request, reason: str) -> None:
        """405 on a non-persistent topic that exists: it keeps no backlog to skip, expire or
        peek. Pulsar refuses expiry and peek there so; its skip and skip-all fail there too,
        with an internal error (they take the topic for a persistent one)."""
        if not topic_of(request).persistent:
            await topics_of(request)  # 404 first for a topic that does not exist
            raise RestError(405, reason)

    def end_of(topic: Any) -> Position:
        last = topic.ml.last_confirmed()
        return Position(last.ledger_id, last.entry_id + 1) if last else Position(0, 0)

    @endpoint
    async def list_subscriptions(request: Request) -> Any:
        names: set[str] = set()
        for topic in await topics_of(request):
            names.update(topic.subscriptions)
            if topic.compaction_subscription is not None:
                names.add(COMPACTION_CURSOR)
        return sorted(names)

    @endpoint
    async def create_subscription(request: Request) -> Any:
        body = await json_body(request, required=False)
        kind, pos = _message_id(body)
        properties = _properties((body or {}).get("properties") if isinstance(body, dict) else None)
        sub_name = str(request.path_params["subscription"])
        # Pulsar creates a missing topic here when auto-creation allows it, as a subscribe does
        name = topic_of(request)
        existing_namespace(broker, name.namespace_name)
        await broker.partitioned_metadata(name)
        topics = [await broker.get_topic(t) for t in partition_targets(broker, name)]
        if any(sub_name in t.subscriptions for t in topics):
            raise RestError(409, "Subscription already exists for topic")
        for topic in topics:
            sub = await topic.create_subscription(sub_name, pos, earliest=kind == "earliest")
            if properties:
                await sub.cursor.set_properties(properties)
        return None

    @endpoint
    async def get_properties(request: Request) -> Any:
        subs = await subs_of(request)
        return subs[0].cursor.properties() if subs else {}

    @endpoint
    async def set_properties(request: Request) -> Any:
        properties = _properties(await json_body(request, required=False) or {})
        for sub in await subs_of(request):
            await sub.cursor.set_properties(properties)
        return None

    @endpoint
    async def delete_subscription(request: Request) -> Any:
        if request.path_params["subscription"] == COMPACTION_CURSOR:
            # As Pulsar does, deleting the compactor's subscription drops the compacted
            # view with it (compaction can run again); it has no consumers to refuse for.
            topics = [t for t in await topics_of(request) if t.compaction_subscription is not None]
            if not topics:
                raise RestError(404, "Subscription not found")
            for topic in topics:
                await topic.delete_compaction()
            return None
        subs = await subs_of(request)
        force = query_bool(request, "force")
        if not force and any(s.consumers for s in subs):
            raise RestError(412, "Subscription has active connected consumers")
        for sub in subs:
            sub.disconnect_consumers()
            await sub.topic.unsubscribe(sub.name)
        return None

    @endpoint
    async def reset_by_time(request: Request) -> Any:
        ts = path_int(request, "timestamp", lo=0)
        for sub in await subs_of(request):
            pos = await sub.topic.ml.find_by_publish_time(ts)
            await sub.reset_to(pos if pos is not None else end_of(sub.topic))
            sub.disconnect_consumers()
        return None

    @endpoint
    async def reset_by_id(request: Request) -> Any:
        kind, pos = _message_id(await json_body(request))
        refuse_partitioned(request, "Reset-cursor at position is not allowed for partitioned-topic")
        excluded = query_bool(request, "isExcluded")
        for sub in await subs_of(request):
            topic = sub.topic
            if kind == "latest":
                target = end_of(topic)
            elif kind == "earliest":
                target = topic.ml.first_position() or Position(0, 0)
            else:
                assert pos is not None
                target = Position(pos.ledger_id, pos.entry_id + 1) if excluded else pos
            await sub.reset_to(target)
            sub.disconnect_consumers()
        return None

    @endpoint
    async def skip(request: Request) -> Any:
        n = path_int(request, "count")
        refuse_partitioned(request, "Skip messages on a partitioned topic is not allowed")
        if n < 0:
            raise RestError(412, "Number of messages to skip must be >= 0")
        await refuse_non_persistent(request, "Skip messages on a non-persistent topic is not allowed")
        for sub in await subs_of(request):
            await sub.skip(n)
        return None

    @endpoint
    async def skip_all(request: Request) -> Any:
        await refuse_non_persistent(request, "Skip all messages on a non-persistent topic is not allowed")
        for sub in await subs_of(request):
            await sub.clear_backlog()
        return None

    @endpoint
    async def expire(request: Request) -> Any:
        seconds = _expiry_age(request)
        await refuse_non_persistent(request, "Expire messages on a non-persistent topic is not allowed")
        for sub in await subs_of(request):
            await sub.expire(seconds)
        return None

    @endpoint
    async def expire_all(request: Request) -> Any:
        seconds = _expiry_age(request)
        await refuse_non_persistent(
            request, "Expire messages for all subscriptions on a non-persistent topic is not allowed")
        for topic in await topics_of(request):
            for sub in list(topic.subscriptions.values()):
                await sub.expire(seconds)
        return None

    @endpoint
    async def peek(request: Request) -> Any:
        n = path_int(request, "position")
        refuse_partitioned(request, "Peek messages on a partitioned topic is not allowed")
        if n < 1:
            raise RestError(412, "Message position must be >= 1")
        await refuse_non_persistent(request, "Peek messages on a non-persistent topic is not allowed")
        subs = await subs_of(request)
        got = await subs[0].unacked_entries(n)
        if len(got) < n:
            raise RestError(404, f"No message found at position {n}")
        return entry_response(got[n - 1])

    @endpoint
    async def message_by_id(request: Request) -> Any:
        topic = await load_topic(broker, topic_of(request))
        pos = Position(path_int(request, "ledger", lo=0), path_int(request, "entry", lo=0))
        got = await topic.ml.read_entries(pos, 1)
        if not got or got[0].position != pos:
            raise RestError(404, f"Message not found: {pos}")
        return entry_response(got[0])

    @endpoint
    async def examine(request: Request) -> Any:
        refuse_partitioned(request, "Examine messages on a partitioned topic is not allowed, "
                                    "please try examine message on specific topic partition")
        topic = await load_topic(broker, topic_of(request))
        initial = request.query_params.get("initialPosition", "latest").lower()
        if initial not in ("earliest", "latest"):
            raise RestError(400, "initialPosition must be earliest or latest")
        n = query_int(request, "messagePosition", 1)
        assert n is not None
        if n < 1:
            raise RestError(412, "messagePosition must be >= 1")
        last = topic.ml.last_confirmed()
        first = topic.ml.first_position()
        if last is None or first is None:
            raise RestError(404, "Topic has no messages")
        if initial == "earliest":
            got = await topic.ml.read_entries(first, n)
            if len(got) < n:
                raise RestError(404, f"No message found at position {n}")
            return entry_response(got[n - 1])
        pos: Position | None = last
        for _ in range(n - 1):
            pos = topic.previous_position(pos)
            if pos is None or pos < first:
                break
        if pos is None or pos < first:
            raise RestError(404, f"No message found at position {n}")
        got = await topic.ml.read_entries(pos, 1)
        if not got:
            raise RestError(404, f"No message found at position {n}")
        return entry_response(got[0])

    out: list[Route] = []
    for domain in DOMAINS:
        t = f"/admin/v2/{domain}/{{tenant}}/{{namespace}}/{{topic}}"
        s = f"{t}/subscription/{{subscription}}"
        out += [
            Route(f"{t}/subscriptions", list_subscriptions, methods=["GET"]),
            Route(s, create_subscription, methods=["PUT"]),
            Route(s, delete_subscription, methods=["DELETE"]),
            Route(f"{s}/properties", get_properties, methods=["GET"]),
            Route(f"{s}/properties", set_properties, methods=["PUT"]),
            Route(f"{s}/resetcursor/{{timestamp}}", reset_by_time, methods=["POST"]),
            Route(f"{s}/resetcursor", reset_by_id, methods=["POST"]),
            Route(f"{s}/skip/{{count}}", skip, methods=["POST"]),
            Route(f"{s}/skip_all", skip_all, methods=["POST"]),
            Route(f"{s}/expireMessages/{{seconds}}", expire, methods=["POST"]),
            Route(f"{t}/all_subscription/expireMessages/{{seconds}}", expire_all, methods=["POST"]),
            Route(f"{s}/position/{{position}}", peek, methods=["GET"]),
            Route(f"{t}/ledger/{{ledger}}/entry/{{entry}}", message_by_id, methods=["GET"]),
            Route(f"{t}/examinemessage", examine, methods=["GET"]),
        ]
    return out

