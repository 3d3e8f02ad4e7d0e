"""Configuration: Pulsar-style ``key=value`` files, environment and command-line overrides.

Theory of operation
-------------------
Every setting Magnetar understands is one :class:`Key`: its Pulsar name, a type, a
default (Pulsar's own default wherever Pulsar has the key, except where Magnetar
deliberately differs, e.g. binding to loopback), a validator and a one-line doc. The core
keys, the broker's and the Pulsar protocol's, are the rows of :data:`KEYS`; every other
protocol declares its own (its handler's ``config_keys``, see :mod:`gateway.config`), and
a configuration knows the keys of the protocols its ``messagingProtocols`` names, resolved
first (:func:`known_keys`), exactly as it knows the core keys. A value is resolved in this
order, later sources winning:

1. the built-in default (some defaults are derived from other keys, e.g. the metadata
   store and the bookie directories live under ``dataDirectory`` unless set);
2. the configuration file (``#`` comments, blank lines, whitespace trimmed; an empty
   value means "use the default", exactly like Pulsar);
3. the environment, the way Pulsar's container scripts apply it: ``PULSAR_PREFIX_<key>``
   sets any key, and a variable named exactly ``<key>`` overrides a key only when that
   key is present (uncommented) in the file being loaded;
4. explicit overrides (command-line flags and ``-c key=value``).

An unknown key is not an error: it is logged as a warning naming it and kept, as a
string, in :attr:`Config.unknown`; so is a key of a protocol that is not loaded (one
warning names a built-in protocol's keys together and says so). Keys that
Pulsar's and BookKeeper's own files set but that mean nothing to Magnetar (a JVM's heap,
DbLedgerStorage, the load balancer) are kept the same way; their warning says why. A value
that does not parse or validate raises :class:`ConfigError` naming the key, the value
and the expected form. The resulting :class:`Config` is immutable.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, NamedTuple

__all__ = [
    "ENV_PREFIX",
    "KEYS",
    "MAX_FRAME_SIZE",
    "MESSAGE_FRAME_PADDING",
    "MIN_FRAME_SIZE",
    "Config",
    "ConfigError",
    "Key",
    "Listener",
    "bool_key",
    "check_frame_holds_message",
    "enum_key",
    "float_key",
    "int_key",
    "known_keys",
    "listeners_key",
    "load_config",
    "parse_config_text",
    "parse_duration",
    "parse_advertised_listeners",
    "parse_listener",
    "port_key",
    "str_key",
]

log = logging.getLogger("magnetar.config")

#: Environment variables named ``PULSAR_PREFIX_<key>`` set ``<key>`` (Pulsar's convention).
ENV_PREFIX = "PULSAR_PREFIX_"

#: The range of ``nettyMaxFrameSizeBytes``: the bookie protocol's ``MIN_FRAME_SIZE`` and its
#: hard cap ``MAX_FRAME_SIZE`` (rust/bookie/src/proto.rs, exported by ``core._native``; a
#: test checks that they agree, so that reading a configuration needs no native module).
MIN_FRAME_SIZE = 4 * 1024
MAX_FRAME_SIZE = 16 * 1024 * 1024 + 1024
#: Room in one frame for what goes with a message of ``maxMessageSize``: Pulsar's
#: ``MESSAGE_SIZE_FRAME_PADDING`` (the Pulsar codec's ``FRAME_HEADER_ALLOWANCE``).
MESSAGE_FRAME_PADDING = 10 * 1024


class ConfigError(ValueError):
    """A configuration value (or file) that cannot be used; the message names the key."""


# --------------------------------------------------------------------------------------
# Value parsing


class Listener(NamedTuple):
    """One listener URL such as ``PLAINTEXT://127.0.0.1:9092``."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


_LISTENER_RE = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-_]*)://(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:/\[\]]*)):(?P<port>\d+)/?$"
)


def parse_listener(text: str) -> Listener:
    """Parse ``scheme://host:port`` (IPv6 hosts in brackets; an empty host means all addresses).

    >>> parse_listener("PLAINTEXT://127.0.0.1:9092")
    Listener(scheme='PLAINTEXT', host='127.0.0.1', port=9092)
    """
    m = _LISTENER_RE.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a listener URL of the form scheme://host:port")
    port = int(m.group("port"))
    if not 0 <= port <= 65535:
        raise ValueError(f"{text!r} has port {port} outside 0-65535")
    host = m.group("v6") if m.group("v6") is not None else m.group("host")
    return Listener(m.group("scheme"), host, port)


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>ms|s|m|h|d)?\s*$")


def parse_duration(text: str) -> float:
    """Parse a duration into seconds: a bare number is seconds; suffixes ms, s, m, h, d.

    >>> parse_duration("250ms"), parse_duration("2m"), parse_duration("1.5")
    (0.25, 120.0, 1.5)
    """
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a duration")
    return float(m.group("num")) * _DURATION_UNITS[m.group("unit") or "s"]


_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("is not a boolean")


def _parse_int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError("is not an integer") from None


def _parse_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("is not a finite number")
    return value


def _parse_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _parse_duration_value(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError:
        raise ValueError("is not a duration") from None


_PARSERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": _parse_int,
    "float": _parse_float,
    "bool": _parse_bool,
    "list": _parse_list,
    "duration": _parse_duration_value,
}

_FORMS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "list": "a comma-separated list",
    "duration": "a duration such as 30s, 250ms, 5m",
}


# --------------------------------------------------------------------------------------
# The table of keys


@dataclass(frozen=True, slots=True)
class Key:
    """One known configuration key.

    ``validate`` returns ``None`` when the parsed value is acceptable, else a short
    reason ("is out of range"); ``expected`` describes the accepted form for messages.
    ``derive`` computes the default from the other resolved values when the key is not
    set explicitly (e.g. paths under ``dataDirectory``). ``dynamic`` keys may be changed
    while the broker runs (``brokers update-dynamic-config``): only keys that every reader
    reads when it uses them, so that a change is honoured at once.
    """

    name: str
    type: str
    default: Any
    doc: str
    expected: str = ""
    validate: Callable[[Any], str | None] | None = None
    derive: Callable[[Mapping[str, Any]], Any] | None = None
    dynamic: bool = False

    def parse(self, raw: str) -> Any:
        """Parse and validate ``raw``; raise :class:`ConfigError` naming the key otherwise."""
        expected = self.expected or _FORMS[self.type]
        try:
            value = _PARSERS[self.type](raw)
        except ValueError as e:
            reason = str(e) if str(e).startswith("is ") else f"is not {_FORMS[self.type]}"
            raise ConfigError(f"{self.name}: {raw!r} {reason} (expected {expected})") from None
        if self.validate is not None:
            problem = self.validate(value)
            if problem is not None:
                raise ConfigError(f"{self.name}: {raw!r} {problem} (expected {expected})")
        return value


def _range(lo: float | None = None, hi: float | None = None) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if lo is not None and value < lo:
            return "is out of range"
        if hi is not None and value > hi:
            return "is out of range"
        return None

    return check


def _choice(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else "is not one of the accepted values"

    return check


def _nonempty(value: Any) -> str | None:
    return None if value else "is empty"


#: The URL schemes an advertised listener may give clients of the Pulsar protocol.
ADVERTISED_SCHEMES = ("pulsar", "pulsar+ssl")


def parse_advertised_listeners(items: Any) -> dict[str, dict[str, str]]:
    """Pulsar's ``advertisedListeners``: items ``name:pulsar://host:port`` and
    ``name:pulsar+ssl://host:port`` become ``{name: {scheme: url}}``, in the order given.
    Raises ValueError for an item of another form, or a name given two URLs of one scheme.

    >>> parse_advertised_listeners(["internal:pulsar://10.0.0.5:6650",
    ...                             "external:pulsar://broker.example.com:6650"])
    {'internal': {'pulsar': 'pulsar://10.0.0.5:6650'}, 'external': {'pulsar': 'pulsar://broker.example.com:6650'}}
    """
    out: dict[str, dict[str, str]] = {}
    for item in items:
        name, sep, url = item.partition(":")
        if not sep or not name or url.startswith("//"):
            raise ValueError(f"{item!r} is not name:pulsar://host:port")
        listener = parse_listener(url)
        if listener.scheme not in ADVERTISED_SCHEMES:
            raise ValueError(f"{item!r} has scheme {listener.scheme!r}, not pulsar or pulsar+ssl")
        urls = out.setdefault(name, {})
        if listener.scheme in urls:
            raise ValueError(f"listener {name!r} has two {listener.scheme}:// URLs")
        urls[listener.scheme] = str(listener)
    return out


def _advertised_listeners(value: Any) -> str | None:
    try:
        parse_advertised_listeners(value)
    except ValueError as e:
        return f"is refused: {e}"
    return None


def _listeners(value: Any) -> str | None:
    for item in value:
        try:
            parse_listener(item)
        except ValueError:
            return f"contains {item!r}, which is not a listener URL"
    return None


_METADATA_URL_RE = re.compile(r"^(?:sqlite:.+|memory:.*|zk:[^/\s]+(?:/.*)?)$")


#: Pulsar's subscription types, by name (``core.subscription.SubType``; kept here so that
#: reading a configuration imports nothing of the broker).
SUBSCRIPTION_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")


def _subscription_types(value: Any) -> str | None:
    for item in value:
        if item not in SUBSCRIPTION_TYPES:
            return f"contains {item!r}, which is not a subscription type"
    return None


def _metadata_url(value: Any) -> str | None:
    return None if _METADATA_URL_RE.match(value) else "is not a metadata store URL"


_ZK_SERVERS_RE = re.compile(r"^[^/\s,:]+:\d+(?:,[^/\s,:]+:\d+)*(?:/\S*)?$")


def _zk_servers(value: Any) -> str | None:
    if value == "" or _ZK_SERVERS_RE.match(value):
        return None
    return "is not a ZooKeeper connect string"


def _zk_key(name: str, doc: str) -> Key:
    """A ZooKeeper connect string under one of Pulsar's and BookKeeper's older names."""
    return Key(name, "str", "", doc, "host:port[,host:port][/chroot]", _zk_servers)


# The helpers below build the usual kinds of key; a protocol declares its own keys with
# them too (see gateway.config). Each names its accepted form in its error messages.


def port_key(name: str, default: int, doc: str) -> Key:
    """A TCP port, 0-65535."""
    return Key(name, "int", default, doc, "an integer port 0-65535", _range(0, 65535))


def _bounded(kind: str, noun: str, name: str, default: float, doc: str,
             lo: float | None, hi: float | None) -> Key:
    """A numeric key, its expected form naming the bounds (``an integer 1-16``)."""

    def show(v: float) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)

    if lo is not None and hi is not None:
        expected = f"{noun} {show(lo)}-{show(hi)}"
    elif lo is not None:
        expected = f"{noun} >= {show(lo)}"
    else:
        expected = noun
    return Key(name, kind, default, doc, expected, _range(lo, hi))


def int_key(name: str, default: int, doc: str, lo: int | None = None, hi: int | None = None) -> Key:
    """An integer, within ``lo``-``hi`` where given.

    >>> int_key("amqpChannelMax", 2047, "Channels per connection.", 1, 65535).parse("0")
    Traceback (most recent call last):
    gateway._config.ConfigError: amqpChannelMax: '0' is out of range (expected an integer 1-65535)
    """
    return _bounded("int", "an integer", name, default, doc, lo, hi)


def float_key(name: str, default: float, doc: str, lo: float | None = None,
              hi: float | None = None) -> Key:
    """A finite number, within ``lo``-``hi`` where given."""
    return _bounded("float", "a number", name, default, doc, lo, hi)


def bool_key(name: str, default: bool, doc: str) -> Key:
    """``true``/``false`` (also yes/no, on/off, 1/0)."""
    return Key(name, "bool", default, doc)


def str_key(name: str, default: str, doc: str) -> Key:
    """Any string."""
    return Key(name, "str", default, doc)


def enum_key(name: str, default: str, doc: str, *choices: str) -> Key:
    """One string of ``choices``."""
    return Key(name, "str", default, doc, "one of " + ", ".join(choices), _choice(*choices))


def listeners_key(name: str, default: Sequence[str], doc: str, scheme: str = "scheme") -> Key:
    """A comma-separated list of listener URLs ``scheme://host:port`` (read them with
    :meth:`Config.listeners`); ``scheme`` only names the form in messages."""
    return Key(name, "list", tuple(default), doc,
               f"a comma-separated list of {scheme}://host:port", _listeners)


def _dynamic(key: Key) -> Key:
    """``key``, changeable while the broker runs (Pulsar's ``@FieldContext(dynamic = true)``)."""
    return replace(key, dynamic=True)



def _derive_metadata_url(values: Mapping[str, Any]) -> str:
    # Pulsar's broker.conf names the store zookeeperServers, BookKeeper's zkServers; an
    # explicit metadataStoreUrl wins over both, as in Pulsar.
    for legacy in ("zookeeperServers", "zkServers"):
        if values.get(legacy):
            return "zk:" + values[legacy]
    return "sqlite:" + os.path.join(values["dataDirectory"], "metadata.db")


def _frame_for_message(message: int) -> int:
    """The bookie frame a message of ``message`` bytes needs, with the headers a Pulsar
    frame allows it. Pulsar's pairing: its broker gives its bookie client frames of
    maxMessageSize + MESSAGE_SIZE_FRAME_PADDING, and its bookkeeper.conf ships 5253120 =
    5 MiB + 10 KiB."""
    return message + MESSAGE_FRAME_PADDING


def _derive_frame_size(values: Mapping[str, Any]) -> int:
    return min(_frame_for_message(int(values["maxMessageSize"])), MAX_FRAME_SIZE)


def check_frame_holds_message(cfg: Config) -> None:
    """Where a broker runs: raise :class:`ConfigError` unless a bookie frame
    (``nettyMaxFrameSizeBytes``) holds a message of ``maxMessageSize`` with the headers a
    Pulsar frame allows it (:data:`MESSAGE_FRAME_PADDING`): each message is stored as one
    entry, in one frame, and a message the broker accepted but could never store would
    fail only when a client sends one."""
    frame, message = int(cfg["nettyMaxFrameSizeBytes"]), int(cfg["maxMessageSize"])
    need = _frame_for_message(message)
    if frame >= need:
        return
    if need > MAX_FRAME_SIZE:
        raise ConfigError(
            f"maxMessageSize: {message} needs bookie frames of {need} bytes (maxMessageSize + "
            f"{MESSAGE_FRAME_PADDING}), more than the {MAX_FRAME_SIZE} a frame may have "
            f"(nettyMaxFrameSizeBytes); set maxMessageSize to at most "
            f"{MAX_FRAME_SIZE - MESSAGE_FRAME_PADDING}")
    raise ConfigError(
        f"nettyMaxFrameSizeBytes: {frame} cannot hold a message of maxMessageSize ({message}) "
        f"and its headers: set it to at least {need} (maxMessageSize + "
        f"{MESSAGE_FRAME_PADDING}, as Pulsar pairs them), or lower maxMessageSize")


def _check_internal_listener(values: Mapping[str, Any]) -> None:
    listeners = parse_advertised_listeners(values["advertisedListeners"])
    if not listeners:
        return
    internal = values["internalListenerName"] or next(iter(listeners))
    if internal not in listeners:
        raise ConfigError(f"internalListenerName: {internal!r} is not one of advertisedListeners "
                          f"({', '.join(listeners)})")
    if "pulsar" not in listeners[internal]:
        raise ConfigError(f"advertisedListeners: the internal listener {internal!r} has no "
                          "pulsar:// URL")


def _check_configuration_store(values: Mapping[str, Any]) -> None:
    """Magnetar keeps tenants, namespaces and policies in its one metadata store, so a
    configuration store (Pulsar's configurationMetadataStoreUrl, or its older name
    configurationStoreServers) may only name that same store."""
    store = values["metadataStoreUrl"]
    for name, prefix in (("configurationMetadataStoreUrl", ""), ("configurationStoreServers", "zk:")):
        given = values[name]
        if given and prefix + given != store:
            raise ConfigError(
                f"{name}: {given!r} is not the metadata store ({store!r}); "
                "Magnetar keeps its configuration in the metadata store, so a separate "
                "configuration store is not supported (leave it empty or set it to the same "
                "store)")


_KEY_LIST: tuple[Key, ...] = (
    # --- process, addresses, ports
    str_key("clusterName", "standalone", "Name of the cluster this broker belongs to."),
    port_key("brokerServicePort", 6650, "Port of the Pulsar binary protocol listener."),
    port_key("webServicePort", 8080, "Port of the admin REST API and /metrics."),
    int_key("httpMaxRequestSize", 10 * 1024 * 1024,
            "Largest admin request body, in bytes; a larger one is refused with 413 before it "
            "is read. -1 for no limit (Pulsar's default; Magnetar's bounds the memory one request "
            "may take, well above the largest schema or policies document).", -1),
    float_key("httpRequestBodyTimeoutInSeconds", 30.0,
              "Time an admin request's body may take to arrive after its headers; a slower one "
              "is answered 408 and its connection closed. 0 for no limit.", 0),
    Key("bindAddress", "str", "127.0.0.1",
        "Address every listener binds to (Pulsar binds 0.0.0.0; Magnetar binds loopback).",
        "a host name or IP address", _nonempty),
    str_key("advertisedAddress", "",
            "Host name or IP advertised to clients; empty means the bind address."),
    Key("advertisedListeners", "list", (),
        "Named addresses a lookup may answer with, for clients on other networks: "
        "name:pulsar://host:port[,name:pulsar+ssl://host:port,...]. A client names its "
        "listener (listenerName); others get internalListenerName's. Empty: one listener, "
        "internalListenerName (or 'internal'), at the advertised address.",
        "a comma-separated list of name:pulsar://host:port or name:pulsar+ssl://host:port",
        _advertised_listeners),
    str_key("internalListenerName", "",
            "The listener a lookup answers with when the client names none, and the broker's "
            "own URL; empty means the first of advertisedListeners."),
    Key("dataDirectory", "str", "data",
        "Directory under which Magnetar keeps its local metadata and bookie data.",
        "a directory path", _nonempty),
    Key("metadataStoreUrl", "str", "sqlite:data/metadata.db",
        "Metadata store: sqlite:PATH, memory:, or zk:host:port[,host:port]/chroot "
        "(default: sqlite:<dataDirectory>/metadata.db).",
        "sqlite:PATH, memory: or zk:host:port[,host:port][/chroot]", _metadata_url,
        _derive_metadata_url),
    _zk_key("zookeeperServers",
            "Pulsar's older name for the metadata store's ZooKeeper servers: used as "
            "zk:<value> when metadataStoreUrl is not set."),
    _zk_key("zkServers",
            "BookKeeper's name for the metadata store's ZooKeeper servers: used as "
            "zk:<value> when metadataStoreUrl and zookeeperServers are not set."),
    Key("configurationMetadataStoreUrl", "str", "",
        "Configuration store; Magnetar keeps configuration in the metadata store, so this "
        "may only be empty or name that store.",
        "sqlite:PATH, memory: or zk:host:port[,host:port][/chroot]",
        lambda v: None if v == "" else _metadata_url(v)),
    _zk_key("configurationStoreServers",
            "Older name of configurationMetadataStoreUrl, as ZooKeeper servers: empty or "
            "the metadata store's."),
    # --- Pulsar's WebSocket API (on webServicePort)
    bool_key("webSocketServiceEnabled", True,
             "Serve Pulsar's WebSocket API (/ws/v2/producer, /ws/v2/consumer, /ws/v2/reader) on "
             "webServicePort. True, as Pulsar's standalone.conf ships it; Pulsar's broker.conf "
             "ships false."),
    int_key("webSocketMaxTextFrameSize", 1048576,
            "Largest WebSocket message, in bytes; a larger one closes its session (1009).", 1024),
    int_key("webSocketSessionIdleTimeoutMillis", 300000,
            "A WebSocket session that sends and receives nothing for this long, in ms, is "
            "closed (1001); 0 never closes it.", 0),
    # --- protocols (each declares its own keys: see gateway.config)
    Key("messagingProtocols", "list", ("pulsar", "kafka", "amqp", "mqtt"),
        "Protocol handlers to load: pulsar, kafka, amqp, mqtt, or module:Class for your own. "
        "The keys of each one named here are keys like these.",
        "a comma-separated list of protocol names or module:Class"),
    # --- messages and connections
    int_key("maxMessageSize", 5242880, "Largest message (batch) payload accepted, in bytes.", 1024),
    int_key("keepAliveIntervalSeconds", 30, "Interval of protocol-level keep-alive pings.", 0),
    int_key("brokerShutdownTimeoutMs", 60000,
            "How long a shutdown (SIGINT, SIGTERM) may take before the process exits anyway: a "
            "client that stopped reading the answer being written to it cannot hold it up.", 1),
    int_key("maxPendingPublishRequestsPerConnection", 1000,
            "Publishes of one Pulsar connection awaiting their receipt before the broker reads "
            "nothing more from it (until half are answered); 0 for no limit.", 0),
    _dynamic(int_key("maxMessagePublishBufferSizeInMB", 512,
                     "Bytes of publishes, from every Pulsar connection, awaiting their receipt "
                     "before the broker reads no connection (until half is free); -1 for no "
                     "limit. A change applies at the next read from any connection.", -1)),
    # --- authentication and authorization
    bool_key("authenticationEnabled", False,
             "Require every client (Pulsar, Kafka, admin REST) to authenticate; with the token "
             "provider, by a JWT signed with tokenSecretKey or tokenPublicKey's private key "
             "(Kafka clients by SASL/PLAIN with the password token:<jwt>)."),
    Key("authenticationProviders", "list", (),
        "Authentication providers: only "
        "org.apache.pulsar.broker.authentication.AuthenticationProviderToken (token "
        "authentication) is available; a broker naming another refuses to start.",
        "a comma-separated list of provider class names"),
    str_key("tokenSecretKey", "",
            "The secret key (HS256, HS384, HS512) tokens are verified with: file:///path (the "
            "key's bytes, as tokens create-secret-key --output writes them), data:;base64,<key> "
            "or the key in base64."),
    str_key("tokenPublicKey", "",
            "The public key (RSA or EC, DER or PEM) tokens are verified with, when they are "
            "signed with a private key; in the same forms as tokenSecretKey."),
    enum_key("tokenPublicAlg", "RS256",
             "The algorithm family of tokenPublicKey: an RSA algorithm for an RSA key, an ES "
             "one for an EC key; tokens signed by that family are accepted.",
             "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"),
    str_key("tokenAuthClaim", "", "The token claim that holds the role; empty: sub."),
    str_key("tokenAudienceClaim", "",
            "The token claim that holds its audience; when set, a token must name "
            "tokenAudience there."),
    str_key("tokenAudience", "", "The audience that stands for this broker (see tokenAudienceClaim)."),
    str_key("anonymousUserRole", "",
            "The role of a client that presents no credentials; empty: such a client is refused."),
    int_key("authenticationRefreshCheckSeconds", 60,
            "How often a Pulsar connection's credentials are checked for expiry; once expired, "
            "the client is asked for fresh ones (AUTH_CHALLENGE) and closed if it cannot give "
            "them by the next check. 0: never checked.", 0),
    bool_key("authenticateMetricsEndpoint", False,
             "Require authentication (and, with authorization, a super-user) for /metrics."),
    bool_key("authorizationEnabled", False,
             "Check what each authenticated role may do: produce and consume need the "
             "namespace's or the topic's permission, administering a tenant needs its "
             "adminRoles; super-users may do anything. Needs authenticationEnabled."),
    Key("superUserRoles", "list", (),
        "Roles that may do anything: create tenants, administer every namespace, produce "
        "and consume everywhere.", "a comma-separated list of roles"),
    # --- topics
    bool_key("enablePersistentTopics", True,
             "Serve persistent topics; when false, a producer, consumer or admin request that "
             "would load one is refused (NotAllowed)."),
    bool_key("enableNonPersistentTopics", True,
             "Serve non-persistent topics; when false, likewise refused."),
    _dynamic(bool_key("allowAutoTopicCreation", True, "Create topics on first produce/subscribe.")),
    _dynamic(enum_key("allowAutoTopicCreationType", "non-partitioned",
                      "Kind of topic created automatically.", "partitioned", "non-partitioned")),
    _dynamic(int_key("defaultNumPartitions", 1,
                     "Partitions of an automatically created partitioned topic.", 1)),
    _dynamic(int_key("maxNumPartitionsPerPartitionedTopic", 0,
                     "Most partitions a partitioned topic may have (created, updated or "
                     "auto-created); 0 for no limit.", 0)),
    _dynamic(bool_key("allowAutoSubscriptionCreation", True,
                      "Create a durable subscription when a consumer subscribes to one that does "
                      "not exist (and a producer's initial subscription); when false, such a "
                      "subscribe fails with SubscriptionNotFound. Checked at each subscribe.")),
    _dynamic(int_key("maxTopicsPerNamespace", 0,
                     "Persistent topics (each partition counting one) a namespace may hold, where "
                     "it sets no limit itself; 0 for no limit. Checked as each topic is created.",
                     0)),
    int_key("maxProducersPerTopic", 0,
            "Producers one topic may have, where its namespace sets no limit; 0 for no limit.", 0),
    int_key("maxConsumersPerTopic", 0,
            "Consumers one topic may have, where its namespace sets no limit; 0 for no limit.", 0),
    int_key("maxConsumersPerSubscription", 0,
            "Consumers one subscription may have, where its namespace sets no limit; 0 for no "
            "limit.", 0),
    int_key("maxSubscriptionsPerTopic", 0,
            "Subscriptions one topic may have, where its namespace sets no limit; 0 for no "
            "limit.", 0),
    int_key("subscriptionExpirationTimeMinutes", 0,
            "Minutes a durable subscription may go unused (no consumer connected or active) "
            "before it is deleted, where neither the topic nor its namespace says; 0 keeps "
            "them.", 0),
    float_key("subscriptionExpiryCheckIntervalInMinutes", 5.0,
              "How often unused subscriptions are looked for.", 0.001),
    # --- inactive topics
    _dynamic(bool_key("brokerDeleteInactiveTopicsEnabled", False,
                      "Delete a topic that has been inactive (see brokerDeleteInactiveTopicsMode) for "
                      "brokerDeleteInactiveTopicsMaxInactiveDurationSeconds, where neither the topic "
                      "nor its namespace sets inactiveTopicPolicies. Pulsar's default is true; "
                      "Magnetar's is false, because Kafka clients and Spark jobs hold no producer or "
                      "subscription on a topic between uses, so Pulsar's rule would delete their "
                      "topics and data.")),
    _dynamic(bool_key("brokerDeleteInactivePartitionedTopicMetadataEnabled", False,
                      "When inactive topic deletion deletes a partition, also delete the "
                      "partitioned topic (its metadata and policies) once none of its partitions "
                      "is left. Off, a partitioned topic whose partitions were all deleted stays, "
                      "and its partitions are created again on use.")),
    float_key("brokerDeleteInactiveTopicsFrequencySeconds", 60.0,
              "How often loaded topics are checked for inactivity (read at start).", 0.001),
    _dynamic(enum_key("brokerDeleteInactiveTopicsMode", "delete_when_no_subscriptions",
                      "What counts as inactive: no producers, consumers or subscriptions "
                      "(delete_when_no_subscriptions), or no producers and no backlog on any "
                      "subscription (delete_when_subscriptions_caught_up; connected consumers are "
                      "disconnected).",
                      "delete_when_no_subscriptions", "delete_when_subscriptions_caught_up")),
    _dynamic(int_key("brokerDeleteInactiveTopicsMaxInactiveDurationSeconds", 0,
                     "How long a topic must stay inactive before it is deleted; 0 (Pulsar's unset) "
                     "takes brokerDeleteInactiveTopicsFrequencySeconds.", 0)),
    int_key("brokerServiceCompactionThresholdInBytes", 0,
            "Bytes published after a topic's last compaction (all of it, for a topic never "
            "compacted) that start a compaction, where neither the topic nor its namespace "
            "sets a compactionThreshold; 0 compacts only on request.", 0),
    float_key("brokerServiceCompactionMonitorIntervalInSeconds", 60.0,
              "How often topics are checked against their compaction threshold.", 0.001),
    int_key("compactionServiceThreads", 1,
            "Topics compacted at once, on request or by threshold; the others wait their "
            "turn.", 1),
    _dynamic(int_key("maxConcurrentLookupRequest", 50000,
                     "Pulsar lookups and partitioned-metadata requests being answered at once, "
                     "over every connection; past it one fails with TooManyRequests. Checked at "
                     "each request.", 1)),
    _dynamic(int_key("maxConcurrentTopicLoadRequest", 5000,
                     "Topics being loaded (their storage opened and state recovered) at once; "
                     "the others wait their turn.", 1)),
    _dynamic(Key("subscriptionTypesEnabled", "list", SUBSCRIPTION_TYPES,
                 "Subscription types consumers may use, where neither the topic nor its "
                 "namespace says. Checked at each subscribe: consumers already subscribed "
                 "stay.", "a comma-separated list of " + ", ".join(SUBSCRIPTION_TYPES),
                 _subscription_types)),
    _dynamic(bool_key("subscriptionKeySharedEnable", True,
                      "Allow Key_Shared subscriptions at all. Checked at each subscribe.")),
    _dynamic(int_key("dispatchThrottlingRatePerTopicInMsg", 0,
                     "Messages per second dispatched from one topic, where its namespace sets "
                     "no dispatch rate; 0 for no limit.", 0)),
    _dynamic(int_key("dispatchThrottlingRatePerTopicInByte", 0,
                     "Bytes per second dispatched from one topic, likewise; 0 for no limit.", 0)),
    _dynamic(int_key("dispatchThrottlingRatePerSubscriptionInMsg", 0,
                     "Messages per second dispatched to one subscription, where its namespace "
                     "sets no subscription dispatch rate; 0 for no limit.", 0)),
    _dynamic(int_key("dispatchThrottlingRatePerSubscriptionInByte", 0,
                     "Bytes per second dispatched to one subscription, likewise; 0 for no "
                     "limit.", 0)),
    _dynamic(int_key("dispatcherMaxReadBatchSize", 100,
                     "Most entries a subscription's dispatcher reads at once. A change applies "
                     "from each dispatcher's next read.", 1)),
    _dynamic(int_key("dispatcherMaxReadSizeBytes", 5 * 1024 * 1024,
                     "Most bytes of entries a subscription's dispatcher reads at once (from the "
                     "sizes of the entries it read before). A change applies from each "
                     "dispatcher's next read.", 1)),
    _dynamic(int_key("keySharedLookAheadMsgInReplayThresholdPerConsumer", 2000,
                     "Messages a Key_Shared subscription's replay set may hold per consumer while "
                     "its dispatcher reads new entries past replays no consumer can take now; 0 "
                     "for no limit of this kind. A change applies at each dispatcher's next such "
                     "read.", 0)),
    _dynamic(int_key("keySharedLookAheadMsgInReplayThresholdPerSubscription", 20000,
                     "Likewise, in all for the subscription; 0 for no limit of this kind.", 0)),
    _dynamic(int_key("maxPublishRatePerTopicInMessages", 0,
                     "Messages per second one topic accepts, where its namespace sets no "
                     "publish rate; 0 for no limit.", 0)),
    _dynamic(int_key("maxPublishRatePerTopicInBytes", 0,
                     "Bytes per second one topic accepts, likewise; 0 for no limit.", 0)),
    bool_key("brokerDeduplicationEnabled", False, "Message deduplication by producer sequence id."),
    int_key("brokerDeduplicationEntriesInterval", 1000,
            "Entries stored between two snapshots of a topic's deduplication state (also "
            "taken when the topic closes); a restart re-reads the entries after the last.", 1),
    int_key("brokerDeduplicationMaxNumberOfProducers", 10000,
            "Producers whose sequence ids a snapshot of the deduplication state keeps (the "
            "connected ones first, then the most recent).", 1),
    float_key("brokerDeduplicationProducerInactivityTimeoutMinutes", 360.0,
              "Minutes after a producer disconnected that its deduplication state is "
              "dropped (checked every third of it): a producer coming back later starts "
              "its sequence anew.", 0.001),
    bool_key("enableReplicatedSubscriptions", True,
             "Honour a consumer's request to replicate its subscription's state: the "
             "subscription is marked replicated (isReplicated in its stats)."),
    int_key("maxUnackedMessagesPerConsumer", 50000,
            "Unacknowledged messages a Shared or Key_Shared consumer may hold before it gets no "
            "more (until it is down to half); 0 for no limit.", 0),
    int_key("maxUnackedMessagesPerSubscription", 200000,
            "Unacknowledged messages a Shared or Key_Shared subscription may hold before it "
            "delivers no more (until it is down to half); 0 for no limit.", 0),
    bool_key("delayedDeliveryEnabled", True,
             "Hold messages with a delivery time back until then, on every subscription type "
             "(namespaces and topics that set no delayedDelivery policy); when false, they "
             "are delivered at once."),
    bool_key("schemaValidationEnforced", False,
             "Refuse producers without a schema on topics that have one (in every namespace)."),
    _dynamic(bool_key("isAllowAutoUpdateSchemaEnabled", True,
                      "Let producers register a new, compatible schema version (namespaces that "
                      "set nothing); when false, a producer's schema must be one the topic has. "
                      "Checked as each producer is created.")),
    enum_key("schemaCompatibilityStrategy", "FULL",
             "Schema compatibility strategy of namespaces that set none (UNDEFINED).",
             "ALWAYS_COMPATIBLE", "ALWAYS_INCOMPATIBLE", "BACKWARD", "FORWARD", "FULL",
             "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE"),
    # --- retention, TTL, backlog quota
    int_key("defaultRetentionTimeInMinutes", 0,
            "Keep acknowledged messages this long; 0 none, -1 forever.", -1),
    int_key("defaultRetentionSizeInMB", 0,
            "Keep up to this much acknowledged data; 0 none, -1 unlimited.", -1),
    int_key("ttlDurationDefaultInSeconds", 0, "Expire unacknowledged messages after; 0 never.", 0),
    float_key("messageExpiryCheckIntervalInMinutes", 5.0,
              "How often messages past their TTL are expired.", 0.001),
    float_key("retentionCheckIntervalInSeconds", 120.0,
              "How often ledgers that every cursor passed and retention no longer needs are deleted.", 1.0),
    float_key("messageExpiryCheckIntervalInSeconds", 0.0,
              "Magnetar's finer TTL check period; 0 uses messageExpiryCheckIntervalInMinutes.", 0.0),
    float_key("backlogQuotaDefaultLimitGB", -1.0, "Default backlog quota per topic; -1 unlimited."),
    bool_key("backlogQuotaCheckEnabled", True, "Enforce backlog quotas periodically."),
    float_key("backlogQuotaCheckIntervalInSeconds", 60.0,
              "How often backlog quotas are enforced.", 0.001),
    enum_key("backlogQuotaDefaultRetentionPolicy", "producer_request_hold",
             "What happens when the backlog quota is exceeded.",
             "producer_request_hold", "producer_exception", "consumer_backlog_eviction"),
    # --- managed ledger
    int_key("managedLedgerDefaultEnsembleSize", 1, "Bookies a ledger is striped over (E).", 1),
    int_key("managedLedgerDefaultWriteQuorum", 1, "Copies written of each entry (Qw).", 1),
    int_key("managedLedgerDefaultAckQuorum", 1, "Copies acknowledged before success (Qa).", 1),
    int_key("managedLedgerMaxEntriesPerLedger", 50000, "Roll the ledger over after this many entries.", 1),
    int_key("managedLedgerMinLedgerRolloverTimeMinutes", 10,
            "A ledger is not rolled over before it is this old.", 0),
    int_key("managedLedgerMaxLedgerRolloverTimeMinutes", 240,
            "A ledger this old is rolled over (at its next write or retention check); 0 never.", 0),
    int_key("managedLedgerInactiveLedgerRolloverTimeSeconds", 0,
            "A ledger that received no entry for this long is rolled over (at the retention "
            "check); 0 never.", 0),
    int_key("managedLedgerMaxSizePerLedgerMbytes", 2048, "Roll the ledger over at this size.", 1),
    float_key("managedLedgerDefaultMarkDeleteRateLimit", 1.0,
              "Mark-delete persistence operations per second per cursor; 0 unlimited.", 0.0),
    int_key("managedLedgerCacheSizeMB", 256,
            "Memory for recently added entries, shared by all topics, so tailing consumers are "
            "served without reading the bookies (0: no cache).", 0),
    float_key("managedLedgerCacheEvictionWatermark", 0.9,
              "Once the cache is over its size, it is evicted down to this fraction of it, so "
              "that the adds that follow find room.", 0.0, 1.0),
    int_key("managedLedgerCacheEvictionTimeThresholdMillis", 1000,
            "Cached entries older than this are evicted.", 0),
    int_key("bookkeeperClientTimeoutInSeconds", 30,
            "Timeout of a storage (bookie) request made by the broker, in seconds.", 1),
    # --- bookie
    port_key("bookiePort", 3181, "Port of the (first) bookie server."),
    int_key("standaloneBookies", 1, "Bookies started inside the standalone process.", 1, 16),
    bool_key("journalSyncData", True,
             "Sync the journal to disk (fdatasync) before acknowledging an add."),
    bool_key("journalFlushWhenQueueEmpty", True,
             "Write the journal as soon as its queue runs dry instead of waiting "
             "journalMaxGroupWaitMSec: the write in progress is the batching window "
             "(BookKeeper defaults to false; Magnetar to true for latency)."),
    int_key("journalPreAllocSizeMB", 16,
            "Extend the journal file with zeros this far ahead of the write position while the "
            "journal is idle, so a group "
            "commit's fdatasync needs no file-system metadata commit (0: off).", 0),
    int_key("flushEntrylogBytes", 64 << 20,
            "Flush ledger storage once this many bytes were added since the last flush, so it is "
            "written back steadily rather than all at a journal rotation (BookKeeper defaults to "
            "0, off; Magnetar to 64 MiB). 0: only at rotations and every flushInterval.", 0),
    int_key("flushInterval", 60000,
            "Milliseconds between checkpoints of ledger storage while the journal moves (besides "
            "those at journal rotations and per flushEntrylogBytes); bounds how much journal a "
            "restart replays.", 1),
    str_key("journalDirectory", "",
            "Directory of a bookie's journal, best on a disk of its own; empty: under "
            "dataDirectory. A standalone's bookie N uses its subdirectory N."),
    Key("ledgerDirectories", "list", (),
        "Directories of a bookie's entry logs and indexes, each best on a disk of its own; "
        "each ledger lives wholly in one of them. Empty: under dataDirectory. A "
        "standalone's bookie N uses subdirectory N of each.",
        "a comma-separated list of directory paths"),
    Key("indexDirectories", "list", (),
        "Where ledger indexes go: empty, or the same list as ledgerDirectories (an index "
        "is kept beside its ledger's entry log).",
        "a comma-separated list of directory paths"),
    bool_key("autoRecoveryDaemonEnabled", True,
             "Restore the copies a lost bookie held: one broker at a time audits the bookies "
             "and re-replicates the closed ledgers of a lost one onto others."),
    int_key("lostBookieRecoveryDelay", 0,
            "Seconds a bookie must be gone before it counts as lost and its ledgers are "
            "re-replicated.", 0),
    int_key("rereplicationEntryBatchSize", 100,
            "Entries copied at a time when a ledger is re-replicated.", 1),
    int_key("gcWaitTime", 900000,
            "Milliseconds between a bookie's garbage collections, which delete the ledgers it "
            "holds that the metadata store no longer lists (a delete it missed while down); "
            "0 turns them off.", 0),
    int_key("gcOverreplicatedLedgerWaitTime", 86400000,
            "Milliseconds between a bookie's checks for ledgers whose record no longer names "
            "it (its place was given to another bookie while it was away), which it then "
            "deletes; 0 turns them off.", 0),
    int_key("journalMaxBackups", 0,
            "Journal files kept, newest first, once a checkpoint no longer needs them "
            "(BookKeeper defaults to 5; Magnetar to 0).", 0),
    int_key("journalMaxGroupWaitMSec", 2, "Longest wait to group journal writes into one sync.", 0),
    int_key("journalBufferedWritesThreshold", 524288,
            "Bytes buffered before a grouped journal write is flushed early.", 0),
    int_key("journalMaxSizeMB", 2048, "Roll the journal file over at this size.", 1),
    replace(int_key("nettyMaxFrameSizeBytes", _frame_for_message(5242880),
                    "Longest frame, in bytes, of the bookie protocol: a bookie closes a connection "
                    "that sends a longer one, and a broker sends none (a batch of adds goes as "
                    "several frames; an entry larger than one frame holds is refused). Default: "
                    "maxMessageSize + 10240, Pulsar's pairing (BookKeeper's own default is "
                    "5242880, which a message of 5 MiB and its headers do not fit); a broker "
                    "refuses to start with less than that.", MIN_FRAME_SIZE, MAX_FRAME_SIZE),
            derive=_derive_frame_size),
    # --- logging
    enum_key("logLevel", "info", "Log level.", "trace", "debug", "info", "warning", "warn",
             "error", "critical"),
    enum_key("logFormat", "text", "Log format: text lines or JSON lines.", "text", "json"),
)

#: Every core key, by name, in table order: the keys of the broker and of Pulsar's protocol.
#: Another protocol's keys are its own (see gateway.config); :attr:`Config.keys` has both.
KEYS: Mapping[str, Key] = MappingProxyType({k.name: k for k in _KEY_LIST})


def known_keys(protocols: Iterable[str]) -> Mapping[str, Key]:
    """The keys of a configuration that loads ``protocols``: the core keys, then each
    protocol's own (its handler's ``config_keys``), in the order named.

    Raises :class:`ConfigError` for a protocol that cannot be loaded, and for a key that
    would have two owners (a core key, or a key of another protocol named), naming both; a
    protocol's key may not be dynamic, as the runtime configuration changes core keys only.
    """
    from gateway._plugins import protocol_keys

    table = dict(KEYS)
    owners: dict[str, str] = {}
    for protocol in dict.fromkeys(protocols):
        for key in protocol_keys(protocol):
            if key.name in KEYS:
                raise ConfigError(f"{key.name}: declared by protocol {protocol!r}, but it is a "
                                  "core key; a key has one owner")
            if key.name in owners:
                first = owners[key.name]
                if first == protocol:
                    raise ConfigError(f"{key.name}: declared twice by protocol {protocol!r}")
                raise ConfigError(f"{key.name}: declared by protocol {first!r} and by protocol "
                                  f"{protocol!r}; a key has one owner")
            if key.dynamic:
                raise ConfigError(f"{key.name}: declared dynamic by protocol {protocol!r}, but "
                                  "only core keys can change while the broker runs")
            table[key.name] = key
            owners[key.name] = protocol
    return MappingProxyType(table)


# --------------------------------------------------------------------------------------
# The file format


# Keys that Pulsar's and BookKeeper's own files (and guides written for them) set, but
# that have no meaning for Magnetar: what the warning about each says instead of
# "unknown". Matched by exact name, or by prefix for the entries ending in "*".
_NOT_APPLICABLE = {
    "PULSAR_MEM": "a JVM memory setting (pulsar_env.sh); Magnetar runs no JVM, and "
                  "managedLedgerCacheSizeMB bounds its entry cache",
    "PULSAR_GC": "a JVM setting (pulsar_env.sh); Magnetar runs no JVM",
    "ledgerStorageClass": "Magnetar's bookies have one ledger storage: an entry log and "
                          "index per ledger",
    "dbStorage_*": "a setting of BookKeeper's DbLedgerStorage, which Magnetar's bookies "
                   "do not use (they keep an entry log and index per ledger)",
    "loadBalancer*": "one Magnetar broker serves every topic itself; there is "
                     "no load balancer moving topics between brokers",
    "batchingMaxMessages": "a producer setting: set it in the client (batching_max_messages)",
    "batchingMaxPublishDelayMicros": "a producer setting: set it in the client "
                                     "(batching_max_publish_delay_ms)",
    "maxBatchSize": "a producer setting: set it in the client (batching_max_messages)",
    "delayedDeliveryTickTimeMillis": "the granularity of Pulsar's delayed-delivery tracker; "
                                     "Magnetar keeps each delivery time exactly",
    "brokerClient*": "the credentials a Pulsar broker presents when it calls other brokers "
                     "as a client; a Magnetar broker makes no such calls",
    "maxConcurrentNonPersistentMessagePerConnection":
        "Pulsar's bound on a connection's non-persistent publishes in flight, past which it "
        "drops them; Magnetar hands each one to the subscriptions before it answers it or "
        "reads the next, so none is ever in flight and none is dropped",
}


def not_applicable(name: str) -> str | None:
    """Why ``name``, a key Pulsar or BookKeeper knows, means nothing to Magnetar; None for
    a key that is simply unknown."""
    for pattern, why in _NOT_APPLICABLE.items():
        if name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            return why
    return None


def _keys_of_protocols_not_loaded(unknown: Mapping[str, str],
                                   loaded: Iterable[str]) -> dict[str, list[str]]:
    """Of the ``unknown`` keys, those that a built-in protocol which is not ``loaded``
    declares, by protocol."""
    from gateway._plugins import BUILTIN_PROTOCOLS, protocol_keys

    out: dict[str, list[str]] = {}
    for protocol in BUILTIN_PROTOCOLS:
        if protocol not in loaded:
            names = [key.name for key in protocol_keys(protocol) if key.name in unknown]
            if names:
                out[protocol] = names
    return out


def parse_config_text(text: str, source: str = "<string>") -> dict[str, str]:
    """Parse Pulsar's ``key=value`` properties text into raw strings.

    ``#`` starts a comment line, blank lines are skipped, key and value are trimmed, a
    later line wins. A non-blank line without ``=`` is an error naming the line.
    """
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("!"):
            continue
        key, sep, value = stripped.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{source}:{lineno}: expected key=value, got {stripped!r}")
        out[key] = value.strip()
    return out


# --------------------------------------------------------------------------------------
# The resolved configuration


class Config:
    """Resolved, immutable configuration; attribute access by Pulsar key name.

    >>> cfg = load_config(None, {"brokerServicePort": "6651"}, environ={})
    >>> cfg.brokerServicePort, cfg.get("kafkaTenant"), cfg.is_set("kafkaTenant")
    (6651, 'public', False)

    Its keys are the core keys and those of the protocols it loads (``kafkaTenant`` is the
    Kafka protocol's): :attr:`keys`.
    """

    __slots__ = ("_values", "_explicit", "_unknown", "_path", "_keys")

    _values: Mapping[str, Any]
    _explicit: frozenset[str]
    _unknown: Mapping[str, str]
    _path: str | None
    _keys: Mapping[str, Key]

    def __init__(
        self,
        values: Mapping[str, Any],
        explicit: frozenset[str] = frozenset(),
        unknown: Mapping[str, str] | None = None,
        path: str | None = None,
        keys: Mapping[str, Key] = KEYS,
    ) -> None:
        object.__setattr__(self, "_values", MappingProxyType(dict(values)))
        object.__setattr__(self, "_explicit", frozenset(explicit))
        object.__setattr__(self, "_unknown", MappingProxyType(dict(unknown or {})))
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_keys", MappingProxyType(dict(keys)))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"unknown configuration key {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Config is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Config is immutable")

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __repr__(self) -> str:
        changed = {k: self._values[k] for k in sorted(self._explicit)}
        return f"Config(path={self._path!r}, set={changed!r})"

    def get(self, key: str, default: Any = None) -> Any:
        """The value of a known key, else the raw string of an unknown one, else ``default``."""
        if key in self._values:
            return self._values[key]
        return self._unknown.get(key, default)

    def is_set(self, key: str) -> bool:
        """Whether ``key`` was given by the file, the environment or an override."""
        return key in self._explicit

    def as_dict(self) -> dict[str, Any]:
        """A copy of every known key's value."""
        return dict(self._values)

    @property
    def keys(self) -> Mapping[str, Key]:
        """Every key this configuration knows, by name, in order: the core keys
        (:data:`KEYS`), then those of each protocol it loads."""
        return self._keys

    @property
    def unknown(self) -> Mapping[str, str]:
        """Keys that are not in :attr:`keys`, with their raw values."""
        return self._unknown

    @property
    def path(self) -> str | None:
        """The file this configuration was loaded from, if any."""
        return self._path

    def listeners(self, key: str) -> list[Listener]:
        """The parsed listener URLs of a list-of-listeners key such as ``kafkaListeners``."""
        return [parse_listener(item) for item in self._values[key]]


def _env_overrides(environ: Mapping[str, str], file_keys: frozenset[str]) -> dict[str, str]:
    plain: dict[str, str] = {}
    prefixed: dict[str, str] = {}
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            prefixed[name[len(ENV_PREFIX):]] = environ[name]
        elif name in file_keys:
            plain[name] = environ[name]
    plain.update(prefixed)
    return plain


def load_config(
    path: str | None,
    overrides: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Load the configuration: defaults, then ``path``, then the environment, then ``overrides``.

    The keys are the core ones and those of the protocols ``messagingProtocols`` names
    (resolved first, from the same sources), see :func:`known_keys`. ``environ`` defaults
    to :data:`os.environ`. Raises :class:`ConfigError` for an unreadable file, a malformed
    line, a value that does not parse or validate, a protocol that cannot be loaded, or a
    key that two of them declare.
    """
    if environ is None:
        environ = os.environ
    raw: dict[str, str] = {}
    file_keys: frozenset[str] = frozenset()
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ConfigError(f"cannot read configuration file {path}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"configuration file {path} is not UTF-8 text: {e}") from None
        raw.update(parse_config_text(text, path))
        file_keys = frozenset(raw)
    raw.update(_env_overrides(environ, file_keys))
    raw.update({k.strip(): v.strip() for k, v in (overrides or {}).items()})

    protocols_key = KEYS["messagingProtocols"]
    protocols_text = raw.get(protocols_key.name, "")
    protocols = protocols_key.parse(protocols_text) if protocols_text else protocols_key.default
    keys = known_keys(protocols)

    values: dict[str, Any] = {}
    explicit: set[str] = set()
    unknown: dict[str, str] = {}
    for name, text in raw.items():
        key = keys.get(name)
        if key is None:
            unknown[name] = text
            continue
        if text == "":
            continue
        values[name] = key.parse(text)
        explicit.add(name)
    _warn_unknown(unknown, protocols)

    for key in keys.values():
        if key.name not in values and key.derive is None:
            values[key.name] = key.default
    for key in keys.values():
        if key.name not in values and key.derive is not None:
            values[key.name] = key.derive(values)
    _check_configuration_store(values)
    _check_internal_listener(values)
    ordered = {name: values[name] for name in keys}
    return Config(ordered, frozenset(explicit), unknown, path, keys)


def _warn_unknown(unknown: Mapping[str, str], protocols: Iterable[str]) -> None:
    """Log the keys that are ignored: one line for each protocol not loaded whose keys are
    set, then one for each other key, saying why where it is known."""
    not_loaded = _keys_of_protocols_not_loaded(unknown, protocols) if unknown else {}
    for protocol, names in not_loaded.items():
        log.warning("configuration keys of protocol %s ignored, as messagingProtocols does not "
                    "load it: %s", protocol, ", ".join(names),
                    extra={"protocol": protocol, "keys": names})
    of_protocols = {name for names in not_loaded.values() for name in names}
    for name in sorted(unknown):
        if name in of_protocols:
            continue
        why = not_applicable(name)
        if why is None:
            log.warning("unknown configuration key %r ignored", name, extra={"key": name})
        else:
            log.warning("configuration key %r ignored: %s", name, why, extra={"key": name})
