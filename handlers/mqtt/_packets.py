"""MQTT control packets (3.1.1 and 5.0) as typed events, and the v5 properties.

Names follow the specifications: MQTT Version 3.1.1 (OASIS Standard, 2014) section 3 and
MQTT Version 5.0 (OASIS Standard, 2019) section 3; property identifiers are 5.0's table
2.4 ("Properties"), reason codes its table 2.6.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "PacketType", "ReasonCode", "ConnectReturnCode", "Properties", "PROPERTY_TYPES",
    "PROPERTIES_ALLOWED", "Will", "Connect", "Connack", "Publish", "Puback", "Pubrec",
    "Pubrel", "Pubcomp", "SubscribeOption", "Subscribe", "Suback", "Unsubscribe", "Unsuback",
    "Pingreq", "Pingresp", "Disconnect", "Auth", "Packet", "PROTOCOL_LEVELS",
]


class PacketType(enum.IntEnum):
    """The fixed header's packet type (high nibble of its first byte), 5.0 table 2.1."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


#: Protocol name and level of each version (3.1.1 section 3.1.2.1-2, 5.0 section 3.1.2.1-2).
PROTOCOL_LEVELS: dict[int, str] = {3: "MQIsdp", 4: "MQTT", 5: "MQTT"}


class ReasonCode(enum.IntEnum):
    """MQTT 5.0 reason codes (table 2.6) that the broker sends or checks."""

    SUCCESS = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class ConnectReturnCode(enum.IntEnum):
    """MQTT 3.1.1 CONNACK return codes (section 3.2.2.3, table 3.1)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USER_NAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


class _Kind(enum.Enum):
    BYTE = "byte"
    U16 = "u16"
    U32 = "u32"
    VARINT = "varint"
    UTF8 = "utf8"
    BINARY = "binary"
    PAIR = "pair"


#: Property identifier -> (field of :class:`Properties`, wire type); 5.0 table 2.4.
PROPERTY_TYPES: dict[int, tuple[str, _Kind]] = {
    0x01: ("payload_format_indicator", _Kind.BYTE),
    0x02: ("message_expiry_interval", _Kind.U32),
    0x03: ("content_type", _Kind.UTF8),
    0x08: ("response_topic", _Kind.UTF8),
    0x09: ("correlation_data", _Kind.BINARY),
    0x0B: ("subscription_identifiers", _Kind.VARINT),
    0x11: ("session_expiry_interval", _Kind.U32),
    0x12: ("assigned_client_identifier", _Kind.UTF8),
    0x13: ("server_keep_alive", _Kind.U16),
    0x15: ("authentication_method", _Kind.UTF8),
    0x16: ("authentication_data", _Kind.BINARY),
    0x17: ("request_problem_information", _Kind.BYTE),
    0x18: ("will_delay_interval", _Kind.U32),
    0x19: ("request_response_information", _Kind.BYTE),
    0x1A: ("response_information", _Kind.UTF8),
    0x1C: ("server_reference", _Kind.UTF8),
    0x1F: ("reason_string", _Kind.UTF8),
    0x21: ("receive_maximum", _Kind.U16),
    0x22: ("topic_alias_maximum", _Kind.U16),
    0x23: ("topic_alias", _Kind.U16),
    0x24: ("maximum_qos", _Kind.BYTE),
    0x25: ("retain_available", _Kind.BYTE),
    0x26: ("user_properties", _Kind.PAIR),
    0x27: ("maximum_packet_size", _Kind.U32),
    0x28: ("wildcard_subscription_available", _Kind.BYTE),
    0x29: ("subscription_identifier_available", _Kind.BYTE),
    0x2A: ("shared_subscription_available", _Kind.BYTE),
}

PROPERTY_IDS: dict[str, int] = {name: pid for pid, (name, _) in PROPERTY_TYPES.items()}

#: Properties that may appear more than once (user properties; a PUBLISH's subscription ids).
REPEATABLE = frozenset({"user_properties", "subscription_identifiers"})

_WILL = frozenset({"payload_format_indicator", "message_expiry_interval", "content_type",
                   "response_topic", "correlation_data", "will_delay_interval", "user_properties"})
_ACK = frozenset({"reason_string", "user_properties"})

#: Which properties each packet may carry (5.0 section 3.x.2.2); "will" is the CONNECT
#: payload's will properties (3.1.3.2). Any other is a protocol error.
PROPERTIES_ALLOWED: dict[PacketType | str, frozenset[str]] = {
    PacketType.CONNECT: frozenset({
        "session_expiry_interval", "authentication_method", "authentication_data",
        "request_problem_information", "request_response_information", "receive_maximum",
        "topic_alias_maximum", "user_properties", "maximum_packet_size"}),
    "will": _WILL,
    PacketType.CONNACK: frozenset({
        "session_expiry_interval", "assigned_client_identifier", "server_keep_alive",
        "authentication_method", "authentication_data", "response_information",
        "server_reference", "reason_string", "receive_maximum", "topic_alias_maximum",
        "maximum_qos", "retain_available", "user_properties", "maximum_packet_size",
        "wildcard_subscription_available", "subscription_identifier_available",
        "shared_subscription_available"}),
    PacketType.PUBLISH: frozenset({
        "payload_format_indicator", "message_expiry_interval", "content_type",
        "response_topic", "correlation_data", "subscription_identifiers", "topic_alias",
        "user_properties"}),
    PacketType.PUBACK: _ACK,
    PacketType.PUBREC: _ACK,
    PacketType.PUBREL: _ACK,
    PacketType.PUBCOMP: _ACK,
    PacketType.SUBSCRIBE: frozenset({"subscription_identifiers", "user_properties"}),
    PacketType.SUBACK: _ACK,
    PacketType.UNSUBSCRIBE: frozenset({"user_properties"}),
    PacketType.UNSUBACK: _ACK,
    PacketType.DISCONNECT: frozenset({"session_expiry_interval", "server_reference",
                                      "reason_string", "user_properties"}),
    PacketType.AUTH: frozenset({"authentication_method", "authentication_data",
                                "reason_string", "user_properties"}),
}


@dataclass(frozen=True, slots=True, kw_only=True, repr=False)
class Properties:
    """An MQTT 5 property list; ``None`` (or empty) where a property is absent."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.present())
        return f"Properties({shown})"

    def present(self) -> list[str]:
        """The names of the properties set, in identifier order."""
        out = []
        for name in PROPERTY_IDS:
            value = getattr(self, name)
            if value is not None and value != ():
                out.append(name)
        return out


NO_PROPERTIES = Properties()


@dataclass(frozen=True, slots=True, kw_only=True)
class Will:
    """The will message a CONNECT carries (3.1.2.5-7, 3.1.3.2-4)."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True, kw_only=True)
class Connect:
    protocol_level: int = 4
    client_id: str = ""
    clean_start: bool = True
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True, kw_only=True)
class Connack:
    session_present: bool = False
    #: A 3.1.1 return code (:class:`ConnectReturnCode`) or a 5.0 reason code.
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True, kw_only=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True, kw_only=True)
class _PacketAck:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


class Puback(_PacketAck):
    __slots__ = ()


class Pubrec(_PacketAck):
    __slots__ = ()


class Pubrel(_PacketAck):
    __slots__ = ()


class Pubcomp(_PacketAck):
    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscribeOption:
    """One topic filter of a SUBSCRIBE and its options (5.0 section 3.8.3.1)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple[SubscribeOption, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True, kw_only=True)
class Suback:
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True, kw_only=True)
class Unsubscribe:
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True, kw_only=True)
class Unsuback:
    packet_id: int
    #: Empty in 3.1.1, which has no reason codes here.
    reason_codes: tuple[int, ...] = ()
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True, kw_only=True)
class Pingreq:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class Pingresp:
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True, kw_only=True)
class Auth:
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)


Packet = (Connect | Connack | Publish | Puback | Pubrec | Pubrel | Pubcomp | Subscribe | Suback
          | Unsubscribe | Unsuback | Pingreq | Pingresp | Disconnect | Auth)

PACKET_TYPES: dict[type, PacketType] = {
    Connect: PacketType.CONNECT, Connack: PacketType.CONNACK, Publish: PacketType.PUBLISH,
    Puback: PacketType.PUBACK, Pubrec: PacketType.PUBREC, Pubrel: PacketType.PUBREL,
    Pubcomp: PacketType.PUBCOMP, Subscribe: PacketType.SUBSCRIBE, Suback: PacketType.SUBACK,
    Unsubscribe: PacketType.UNSUBSCRIBE, Unsuback: PacketType.UNSUBACK,
    Pingreq: PacketType.PINGREQ, Pingresp: PacketType.PINGRESP,
    Disconnect: PacketType.DISCONNECT, Auth: PacketType.AUTH,
}
