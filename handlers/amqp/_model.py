"""What AMQP 0-9-1 declares, and how a message finds its queues: exchanges, queues and
bindings of each virtual host, kept in the metadata store so durable ones outlive a
restart, and the exchange types' matching rules (direct, fanout, topic, headers).

Mapping: an exchange ``e`` of the vhost mapped to namespace ``t/ns`` is the topic
``persistent://t/ns/e``; what is published to it is stored there, whoever reads it. The
default exchange (``""``) is the topic ``amq.default``, every queue bound to it by its own
name. A queue ``q`` is the subscription ``amqp.q`` on the topic of every exchange from
which a chain of bindings reaches it, and the chains are its filters: a message on that
topic is the queue's when one chain matches its routing key and headers, link by link.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from urllib.parse import quote, unquote

from core.metadata import NotFoundError

__all__ = ["Binding", "ExchangeDecl", "QueueDecl", "VHost", "DEFAULT_EXCHANGE_TOPIC",
           "EXCHANGE_TYPES", "STANDARD_EXCHANGES", "queue_subscription", "topic_matches",
           "headers_match"]

DEFAULT_EXCHANGE_TOPIC = "amq.default"
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
#: The exchanges every vhost has, as RabbitMQ declares them (durable).
STANDARD_EXCHANGES = {"amq.direct": "direct", "amq.fanout": "fanout", "amq.topic": "topic",
                      "amq.headers": "headers", "amq.match": "headers"}
MAX_CHAIN = 8  # exchange-to-exchange hops followed back from a queue
ROOT = "/amqp/vhosts"


def queue_subscription(queue: str) -> str:
    """The subscription name a queue has on each topic it reads."""
    return f"amqp.{queue}"


@lru_cache(maxsize=4096)
def _words(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.split("."))


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Whether a topic exchange's binding key matches a routing key: words split by '.',
    '*' stands for exactly one word, '#' for zero or more."""
    if pattern == "#":
        return True
    p = _words(pattern)

    def closure(states: set[int]) -> set[int]:
        todo = list(states)
        while todo:
            i = todo.pop()
            if i < len(p) and p[i] == "#" and i + 1 not in states:
                states.add(i + 1)
                todo.append(i + 1)
        return states

    states = closure({0})
    for word in routing_key.split("."):
        nxt: set[int] = set()
        for i in states:
            if i < len(p):
                if p[i] == "#":
                    nxt.add(i)
                elif p[i] == "*" or p[i] == word:
                    nxt.add(i + 1)
        if not nxt:
            return False
        states = closure(nxt)
    return len(p) in states


def headers_match(arguments: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bool:
    """A headers exchange's rule: ``x-match`` all (the default) or any, over the binding's
    arguments not starting with ``x-``; an argument with no value (void) needs the header
    only to be there. ``all-with-x``/``any-with-x`` compare ``x-`` arguments too."""
    how = str(arguments.get("x-match", "all"))
    with_x = how.endswith("-with-x")
    wanted = {k: v for k, v in arguments.items()
              if k != "x-match" and (with_x or not k.startswith("x-"))}
    headers = headers or {}

    def one(k: str, v: Any) -> bool:
        if k not in headers:
            return False
        return v is None or _same(headers[k], v)

    if how.startswith("any"):
        return any(one(k, v) for k, v in wanted.items())
    return all(one(k, v) for k, v in wanted.items())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bytes):
        a = a.decode(errors="replace")
    if isinstance(b, bytes):
        b = b.decode(errors="replace")
    return bool(a == b)


@dataclass
class ExchangeDecl:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)

    def same_as(self, other: ExchangeDecl) -> bool:
        return (self.type, self.durable, self.auto_delete, self.internal) == \
            (other.type, other.durable, other.auto_delete, other.internal)


@dataclass
class QueueDecl:
    name: str
    durable: bool = False
    exclusive: bool = False
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)

    def same_as(self, other: QueueDecl) -> bool:
        return (self.durable, self.exclusive, self.auto_delete) == \
            (other.durable, other.exclusive, other.auto_delete) and \
            _comparable(self.arguments) == _comparable(other.arguments)


def _comparable(args: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.decode(errors="replace") if isinstance(v, bytes) else v)
            for k, v in args.items() if k.startswith("x-")}


@dataclass(frozen=True)
class Binding:
    source: str          # an exchange
    destination: str     # a queue or an exchange
    to_exchange: bool
    routing_key: str
    arguments: tuple[tuple[str, Any], ...] = ()

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.arguments)


def binding(source: str, destination: str, to_exchange: bool, routing_key: str,
            arguments: Mapping[str, Any] | None) -> Binding:
    return Binding(source, destination, to_exchange, routing_key,
                   tuple(sorted((k, _hashable(v)) for k, v in (arguments or {}).items())))


def _hashable(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def _plain(v: Any) -> Any:
    """A field-table value as JSON can hold it."""
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return str(v)


class VHost:
    """One virtual host: its exchanges, queues and bindings, and their metadata-store
    copies (under ``/amqp/vhosts/{vhost}``)."""

    def __init__(self, name: str, metadata: Any):
        self.name = name
        self.md = metadata
        self.exchanges: dict[str, ExchangeDecl] = {}
        self.queues: dict[str, QueueDecl] = {}
        self.bindings: set[Binding] = set()
        #: queues with ``x-overflow`` reject-publish and a length limit, checked at publish
        self.publish_limited: set[str] = set()
        for n, t in STANDARD_EXCHANGES.items():
            self.exchanges[n] = ExchangeDecl(n, t)
        self.exchanges[""] = ExchangeDecl("", "direct")

    # -- the store -----------------------------------------------------------------------

    @property
    def _path(self) -> str:
        return f"{ROOT}/{quote(self.name, safe='')}"

    def load(self) -> None:
        for kind in ("exchanges", "queues"):
            for child in self.md.children(f"{self._path}/{kind}"):
                got = self.md.get(f"{self._path}/{kind}/{child}")
                if got is None:
                    continue
                doc = json.loads(got[0])
                name = unquote(child)
                if kind == "exchanges":
                    self.exchanges[name] = ExchangeDecl(name, doc["type"], True,
                                                        doc.get("auto_delete", False),
                                                        doc.get("internal", False),
                                                        doc.get("arguments", {}))
                else:
                    self.queues[name] = QueueDecl(name, doc.get("durable", True),
                                                  doc.get("exclusive", False),
                                                  doc.get("auto_delete", False),
                                                  doc.get("arguments", {}))
        got = self.md.get(f"{self._path}/bindings")
        if got is not None:
            for b in json.loads(got[0]):
                self.bindings.add(binding(b["source"], b["destination"], b["to_exchange"],
                                          b["routing_key"], b.get("arguments")))

    def save_exchange(self, e: ExchangeDecl) -> None:
        if e.durable:
            doc = {"type": e.type, "auto_delete": e.auto_delete, "internal": e.internal,
                   "arguments": _plain(e.arguments)}
            self.md.put(f"{self._path}/exchanges/{quote(e.name, safe='')}", json.dumps(doc).encode())

    def save_queue(self, q: QueueDecl) -> None:
        """Every queue is stored, transient ones too, so that a restart finds the
        subscriptions of those it must drop."""
        doc = {"durable": q.durable, "exclusive": q.exclusive, "auto_delete": q.auto_delete,
               "arguments": _plain(q.arguments)}
        self.md.put(f"{self._path}/queues/{quote(q.name, safe='')}", json.dumps(doc).encode())

    def forget(self, kind: str, name: str) -> None:
        """Drop a declaration's stored copy (none for a transient exchange)."""
        try:
            self.md.delete(f"{self._path}/{kind}/{quote(name, safe='')}")
        except NotFoundError:
            pass

    def save_bindings(self) -> None:
        durable = [b for b in self.bindings if self._durable(b)]
        doc = [{"source": b.source, "destination": b.destination, "to_exchange": b.to_exchange,
                "routing_key": b.routing_key, "arguments": _plain(b.args)} for b in durable]
        self.md.put(f"{self._path}/bindings", json.dumps(doc).encode())

    def _durable(self, b: Binding) -> bool:
        src = self.exchanges.get(b.source)
        if b.to_exchange:
            dst_e = self.exchanges.get(b.destination)
            return bool(src and src.durable and dst_e and dst_e.durable)
        dst_q = self.queues.get(b.destination)
        return bool(src and src.durable and dst_q and dst_q.durable)

    # -- routing -------------------------------------------------------------------------

    def into(self, destination: str, to_exchange: bool) -> list[Binding]:
        return [b for b in self.bindings
                if b.destination == destination and b.to_exchange == to_exchange]

    def chains(self, queue: str) -> dict[str, list[tuple[Binding, ...]]]:
        """For each exchange from which bindings reach ``queue``, the chains of bindings
        (first link on that exchange, last into the queue). The default exchange's
        binding by the queue's name is implicit."""
        out: dict[str, list[tuple[Binding, ...]]] = {
            "": [(Binding("", queue, False, queue),)]}
        todo: list[tuple[Binding, ...]] = [(b,) for b in self.into(queue, False)]
        while todo:
            chain = todo.pop()
            first = chain[0]
            if first.source not in self.exchanges:
                continue
            out.setdefault(first.source, []).append(chain)
            if len(chain) < MAX_CHAIN:
                for b in self.into(first.source, True):
                    if all(b.source != c.source for c in chain):
                        todo.append((b, *chain))
        return out

    def link_matches(self, b: Binding, routing_key: str, headers: Mapping[str, Any] | None) -> bool:
        e = self.exchanges.get(b.source)
        kind = e.type if e is not None else "direct"
        if kind == "fanout":
            return True
        if kind == "topic":
            return topic_matches(b.routing_key, routing_key)
        if kind == "headers":
            return headers_match(b.args, headers)
        return b.routing_key == routing_key

    def chain_matches(self, chain: tuple[Binding, ...], routing_key: str,
                      headers: Mapping[str, Any] | None) -> bool:
        return all(self.link_matches(b, routing_key, headers) for b in chain)

    def routes(self, exchange: str, routing_key: str,
               headers: Mapping[str, Any] | None) -> Iterator[str]:
        """The queues a message published to ``exchange`` reaches (for ``mandatory``)."""
        if exchange == "":
            if routing_key in self.queues:
                yield routing_key
            return
        seen_q: set[str] = set()
        seen_e: set[str] = set()
        frontier = [exchange]
        while frontier:
            src = frontier.pop()
            if src in seen_e:
                continue
            seen_e.add(src)
            for b in self.bindings:
                if b.source != src or not self.link_matches(b, routing_key, headers):
                    continue
                if b.to_exchange:
                    frontier.append(b.destination)
                elif b.destination not in seen_q and b.destination in self.queues:
                    seen_q.add(b.destination)
                    yield b.destination
