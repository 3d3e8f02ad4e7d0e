"""What a Kafka client's role may do, as Kafka-on-Pulsar maps Kafka's operations onto
Pulsar's permissions: writing a topic (Produce) needs ``produce``, reading it (Fetch,
offsets of a group) ``consume``, describing it (Metadata, DescribeTopicPartitions,
ListOffsets, DescribeConfigs) either; creating, deleting, growing, truncating or
reconfiguring it (CreateTopics, DeleteTopics, CreatePartitions, DeleteRecords,
AlterConfigs, IncrementalAlterConfigs) the tenant's admin; a super-user or the
tenant's admin may do anything. A refused topic answers TOPIC_AUTHORIZATION_FAILED.
Everything is allowed while authorization is off."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from core.broker import NamespaceNotFoundError, TopicNotFoundError
from core.naming import InvalidNameError
from handlers.kafka._codec import RequestReceived
from handlers.kafka._errors import ErrorCode, RemoteProtocolError

if TYPE_CHECKING:
    from handlers.kafka._handler import KafkaProtocolHandler

__all__ = ["PRODUCE", "CONSUME", "DESCRIBE", "MANAGE", "TopicAuthorizationFailed", "allowed", "check",
           "topic_error"]

log = logging.getLogger(__name__)

PRODUCE = ("produce",)
CONSUME = ("consume",)
DESCRIBE = ("produce", "consume")
#: Only the tenant's admin (or a super-user): no permission grants it.
MANAGE: tuple[str, ...] = ()


class TopicAuthorizationFailed(Exception):
    """The request's role may not do this to the topic (TOPIC_AUTHORIZATION_FAILED)."""


def allowed(h: KafkaProtocolHandler, req: RequestReceived, kafka_topic: str,
            actions: tuple[str, ...]) -> bool:
    """Whether ``req``'s principal may do one of ``actions`` to ``kafka_topic``. A name
    that is no topic name is allowed here: it fails as it would otherwise."""
    auth = h.broker.auth
    if not auth.authorization_enabled:
        return True
    try:
        name = h.topics.topic_name(kafka_topic)
    except InvalidNameError:
        return True
    return bool(auth.allows(name, req.principal, *actions))


def check(h: KafkaProtocolHandler, req: RequestReceived, kafka_topic: str,
          actions: tuple[str, ...]) -> None:
    """Raise :class:`TopicAuthorizationFailed` unless :func:`allowed`."""
    if not allowed(h, req, kafka_topic, actions):
        raise TopicAuthorizationFailed(f"Not authorized to access topic {kafka_topic}")


def topic_error(exc: BaseException) -> int:
    """The Kafka error code a failed topic lookup or access answers."""
    match exc:
        case InvalidNameError():
            return ErrorCode.INVALID_TOPIC_EXCEPTION
        case TopicNotFoundError() | NamespaceNotFoundError():
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        case RemoteProtocolError():
            return exc.code
        case TopicAuthorizationFailed():
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    log.warning("kafka: request failed: %r", exc)
    return ErrorCode.UNKNOWN_SERVER_ERROR
