"""Theory of operation: the schema registry.

Each topic (a partitioned topic shares one, keyed by its base name) has a list of schema
versions kept in the metadata store at ``/schemas/<tenant>/<namespace>/<domain>/<name>``.
A producer or consumer that brings a schema gets the version of an identical one, or a
new version when the namespace's compatibility strategy accepts it against the latest
version (or every version, for the ``*_TRANSITIVE`` strategies); otherwise it is refused
with IncompatibleSchema. Byte payloads (schema type NONE) are never registered.

Compatibility for AVRO and JSON (whose definitions are Avro schemas too) follows Avro's
schema resolution, as Pulsar's Avro SchemaValidator does: a reader can read a writer's data
when every reader field missing from the writer has a default, and the types both have
resolve, down through arrays, maps, unions and nested records (Avro's promotions allowed;
enums and fixed types matched by unqualified name or alias, enums keeping every writer
symbol unless the reader has a default; record names, as in that validator, not
compared). BACKWARD means the new schema reads data of the old; FORWARD the old reads the
new; FULL both. A definition that is not an Avro schema, and other schema types, are
compatible only with an identical one.
"""

from __future__ import annotations

import base64
import json
import time
from typing import TYPE_CHECKING, Any

from core.format import pulsar_api_pb2 as pb
from core.metadata import BadVersionError
from core.naming import TopicName

if TYPE_CHECKING:
    from core.broker import BrokerService
    from core.topic import PersistentTopic

__all__ = ["SchemaRegistry", "IncompatibleSchemaError", "is_compatible", "STRATEGIES"]

STRATEGIES = (
    "ALWAYS_COMPATIBLE", "ALWAYS_INCOMPATIBLE", "BACKWARD", "FORWARD", "FULL",
    "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE", "NONE", "UNDEFINED",
)
DEFAULT_STRATEGY = "FULL"
_SCHEMA_NONE = pb.Schema.Type.Value("None")
_SCHEMA_AUTO_CONSUME = pb.Schema.Type.Value("AutoConsume")
_PROMOTIONS = {
    "int": {"long", "float", "double"}, "long": {"float", "double"}, "float": {"double"},
    "string": {"bytes"}, "bytes": {"string"},
}


class IncompatibleSchemaError(Exception):
    pass


_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = {"record": "record", "error": "record", "enum": "enum", "fixed": "fixed"}


class _NotAvroError(ValueError):
    """A definition that is not an Avro schema."""


def _full_name(name: str, namespace: str) -> str:
    """`name` qualified by `namespace` unless it is already a full name."""
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _parse(t: Any, namespace: str, names: dict[str, dict[str, Any]]) -> Any:
    """Avro schema `t` (decoded JSON) in the enclosing `namespace`, its named types
    resolved: a primitive as its name, a union as a list of branches, any other type as a
    dict of its parsed parts. `names` holds the named types defined so far by full name; a
    reference (recursive ones included) is the very dict of its definition."""
    if isinstance(t, str):
        if t in _PRIMITIVES:
            return t
        for full in (_full_name(t, namespace), t):
            if full in names:
                return names[full]
        raise _NotAvroError(f"undefined name {t}")
    if isinstance(t, list):
        return [_parse(branch, namespace, names) for branch in t]
    if not isinstance(t, dict):
        raise _NotAvroError(f"not a schema: {t!r}")
    kind = t.get("type")
    if isinstance(kind, str) and kind in _NAMED:
        name = t["name"]
        full = _full_name(name, str(t.get("namespace", namespace) or ""))
        space = full.rpartition(".")[0]
        node: dict[str, Any] = {
            "type": _NAMED[kind], "name": full.rpartition(".")[2], "full_name": full,
            "aliases": {_full_name(a, space) for a in t.get("aliases", [])},
        }
        names[full] = node
        if kind == "enum":
            node["symbols"] = list(t["symbols"])
            node["default"] = t.get("default")
        elif kind == "fixed":
            node["size"] = int(t["size"])
        else:
            node["fields"] = {f["name"]: {
                "aliases": list(f.get("aliases", [])), "has_default": "default" in f,
                "type": _parse(f["type"], space, names),
            } for f in t["fields"]}
        return node
    if kind == "array":
        return {"type": "array", "items": _parse(t["items"], namespace, names)}
    if kind == "map":
        return {"type": "map", "values": _parse(t["values"], namespace, names)}
    return _parse(kind, namespace, names)


def _kind(t: Any) -> str:
    """The Avro type of parsed schema `t`: a primitive's name, "union", or its ``type``."""
    if isinstance(t, list):
        return "union"
    return t if isinstance(t, str) else str(t["type"])


def _names_match(reader: dict[str, Any], writer: dict[str, Any]) -> bool:
    """Whether enum or fixed types match: the same unqualified name, or a reader alias naming
    the writer. (Avro's validator, which Pulsar uses, never compares record names.)"""
    return bool(reader["name"] == writer["name"] or writer["full_name"] in reader["aliases"])


def _readable(reader: Any, writer: Any, seen: dict[tuple[int, int], bool]) -> bool:
    """Whether data written with parsed schema `writer` can be read with parsed schema
    `reader`, by Avro's schema resolution. `seen` holds the record pairs already compared,
    a pair still being compared (a recursive record) counting as readable."""
    if isinstance(writer, list):
        return all(_readable(reader, branch, seen) for branch in writer)
    if isinstance(reader, list):
        return any(_readable(branch, writer, seen) for branch in reader)
    rk, wk = _kind(reader), _kind(writer)
    if rk != wk:
        return rk in _PROMOTIONS.get(wk, set())
    if rk in _PRIMITIVES:
        return True
    if rk == "array":
        return _readable(reader["items"], writer["items"], seen)
    if rk == "map":
        return _readable(reader["values"], writer["values"], seen)
    if rk == "record":
        pair = (id(reader), id(writer))
        if pair not in seen:
            seen[pair] = True
            seen[pair] = _fields_readable(reader["fields"], writer["fields"], seen)
        return seen[pair]
    if not _names_match(reader, writer):
        return False
    if rk == "fixed":
        return bool(reader["size"] == writer["size"])
    return reader["default"] in reader["symbols"] or set(writer["symbols"]) <= set(reader["symbols"])


def _fields_readable(reader: dict[str, Any], writer: dict[str, Any],
                     seen: dict[tuple[int, int], bool]) -> bool:
    """Whether a record with `reader` fields reads one with `writer` fields: each reader field
    is in the writer (by its name or an alias) with a readable type, or has a default."""
    for name, field in reader.items():
        match = next((writer[n] for n in [name, *field["aliases"]] if n in writer), None)
        if match is None:
            if not field["has_default"]:
                return False
        elif not _readable(field["type"], match["type"], seen):
            return False
    return True


def _can_read(reader: bytes, writer: bytes) -> bool:
    """Whether schema `reader` can read data written with schema `writer` (Avro definitions;
    one that is not an Avro schema reads only data of an identical definition)."""
    try:
        parsed = [_parse(json.loads(d), "", {}) for d in (reader, writer)]
    except (ValueError, KeyError, TypeError, AttributeError):
        return reader == writer
    return _readable(parsed[0], parsed[1], {})


def _protobuf_root(definition: bytes) -> str | None:
    """The root message's full name of a ProtobufNative schema (None if unreadable)."""
    try:
        root = json.loads(definition).get("rootMessageTypeName")
    except (ValueError, AttributeError):
        return None
    return root if isinstance(root, str) else None


def is_compatible(strategy: str, new: tuple[int, bytes], old: list[tuple[int, bytes]]) -> bool:
    """Whether schema `new` (type, definition) may follow the versions `old` (oldest first)."""
    if strategy in ("ALWAYS_COMPATIBLE", "NONE") or not old:
        return True
    if strategy == "ALWAYS_INCOMPATIBLE":
        return False
    against = old if strategy.endswith("_TRANSITIVE") else old[-1:]
    base = strategy.removesuffix("_TRANSITIVE")
    for otype, odef in against:
        if otype != new[0]:
            return False
        if new[0] == pb.Schema.ProtobufNative:
            # Pulsar checks only that the root message stays the same, whatever the strategy
            root = _protobuf_root(odef)
            if (root is None or root != _protobuf_root(new[1])) and odef != new[1]:
                return False
            continue
        if new[0] not in (pb.Schema.Avro, pb.Schema.Json):
            if odef != new[1]:
                return False
            continue
        if base in ("BACKWARD", "FULL") and not _can_read(new[1], odef):
            return False
        if base in ("FORWARD", "FULL") and not _can_read(odef, new[1]):
            return False
    return True


def _version_bytes(v: int) -> bytes:
    return v.to_bytes(8, "big", signed=True)


class SchemaRegistry:
    def __init__(self, broker: BrokerService):
        self.broker = broker

    @staticmethod
    def path(name: TopicName) -> str:
        return f"/schemas/{name.partitioned_topic.storage_name}"

    def versions(self, name: TopicName) -> tuple[list[dict[str, Any]], int]:
        got = self.broker.metadata.get(self.path(name))
        if got is None:
            return [], -1
        return json.loads(got[0]), got[1]

    @staticmethod
    def to_pb(rec: dict[str, Any]) -> pb.Schema:
        return pb.Schema(
            name=rec.get("name", ""), type=rec["type"],
            schema_data=base64.b64decode(rec["data"]),
            properties=[pb.KeyValue(key=k, value=v) for k, v in rec.get("properties", {}).items()],
        )

    def get(self, name: TopicName, version: bytes | None) -> tuple[pb.Schema, bytes] | None:
        recs, _ = self.versions(name)
        live = [(i, r) for i, r in enumerate(recs) if not r.get("deleted")]
        if not live:
            return None
        if version:
            i = int.from_bytes(version, "big", signed=True)
            if not 0 <= i < len(recs) or recs[i].get("deleted"):
                return None
            return self.to_pb(recs[i]), _version_bytes(i)
        i, rec = live[-1]
        return self.to_pb(rec), _version_bytes(i)

    def strategy(self, topic_name: TopicName) -> str:
        """The topic's own ``schemaCompatibilityStrategy`` policy, else its namespace's,
        else the broker's (UNDEFINED at a level passes to the next, as in Pulsar)."""
        store = self.broker.policies
        for pol in (store.topic_policies(topic_name), store.get_namespace(topic_name.namespace_name) or {}):
            s = str(pol.get("schema_compatibility_strategy") or "UNDEFINED")
            if s != "UNDEFINED":
                return s
        return str(self.broker.config.get("schemaCompatibilityStrategy", DEFAULT_STRATEGY))

    def validation_enforced(self, policies: dict[str, Any]) -> bool:
        """Whether producers without a schema are refused on topics that have one: the
        broker's ``schemaValidationEnforced`` or the topic's or namespace's policy (in
        `policies`)."""
        return bool(self.broker.config.get("schemaValidationEnforced")
                    or policies.get("schema_validation_enforced"))

    def auto_update_allowed(self, policies: dict[str, Any]) -> bool:
        """Whether a producer may register a new (compatible) schema version: the
        namespace's ``is_allow_auto_update_schema`` (in `policies`), else the broker's
        ``isAllowAutoUpdateSchemaEnabled``."""
        value = policies.get("is_allow_auto_update_schema")
        if value is None:
            value = self.broker.config.get("isAllowAutoUpdateSchemaEnabled", True)
        return bool(value)

    @staticmethod
    def _version_in(recs: list[dict[str, Any]], schema: pb.Schema) -> bytes | None:
        """The version among `recs` (live ones) holding exactly `schema`, if any."""
        for i, r in enumerate(recs):
            if not r.get("deleted") and r["type"] == schema.type and \
                    base64.b64decode(r["data"]) == schema.schema_data:
                return _version_bytes(i)
        return None

    async def add_or_check(self, topic: PersistentTopic, schema: pb.Schema | None) -> bytes:
        """The version of a producer's `schema` on the topic (None: it brings none),
        registering it if compatible, as Pulsar admits producers: one without a schema is
        refused on a topic with one where validation is enforced; one with a schema the
        topic lacks, where auto update is off."""
        name = topic.name
        if schema is None or schema.type == _SCHEMA_NONE:
            if self.validation_enforced(topic.policies) and self.get(name, None) is not None:
                raise IncompatibleSchemaError("Producers cannot connect or send message without "
                                              "a schema to topics with a schema")
            return b""
        if not self.auto_update_allowed(topic.policies):
            version = self._version_in(self.versions(name)[0], schema)
            if version is None:
                raise IncompatibleSchemaError("Schema not found and schema auto updating is disabled.")
            return version
        return await self.register(name, schema)

    def delete_all(self, name: TopicName) -> int:
        """Mark every version deleted (producers may then bring any schema); returns the
        latest version number, -1 when there was none."""
        while True:
            recs, version = self.versions(name)
            if not recs:
                return -1
            for r in recs:
                r["deleted"] = True
            try:
                self.broker.metadata.put(self.path(name), json.dumps(recs).encode(), version)
            except BadVersionError:
                continue
            return len(recs) - 1

    async def register(self, name: TopicName, schema: pb.Schema) -> bytes:
        """The version of `schema` on the topic `name`, registering it if compatible."""
        if schema.type == _SCHEMA_NONE:
            return b""
        while True:
            recs, version = self.versions(name)
            found = self._version_in(recs, schema)
            if found is not None:
                return found
            live = [(r["type"], base64.b64decode(r["data"])) for r in recs if not r.get("deleted")]
            strategy = self.strategy(name)
            if not is_compatible(strategy, (schema.type, schema.schema_data), live):
                raise IncompatibleSchemaError(
                    f"Schema of type {pb.Schema.Type.Name(schema.type)} is incompatible with the "
                    f"topic's schema under strategy {strategy}")
            recs.append({
                "name": schema.name, "type": schema.type,
                "data": base64.b64encode(schema.schema_data).decode(),
                "properties": {kv.key: kv.value for kv in schema.properties},
                "timestamp": int(time.time() * 1000),
            })
            try:
                self.broker.metadata.put(self.path(name), json.dumps(recs).encode(), version)
            except BadVersionError:
                continue
            return _version_bytes(len(recs) - 1)

    async def check_consumer(self, topic: PersistentTopic, schema: pb.Schema) -> None:
        """Admit a consumer's ``schema`` as Pulsar does: on an idle topic (no schema, no
        producer, no consumer, nothing ever stored) it becomes the topic's schema;
        otherwise it is only checked, never registered. It must be able to read the
        latest version under the BACKWARD, FORWARD, FORWARD_TRANSITIVE and FULL
        strategies, and follow every version under the others; a topic with no live
        schema has nothing to check it against and refuses it."""
        if schema.type in (_SCHEMA_NONE, _SCHEMA_AUTO_CONSUME):  # bytes, or whatever there is
            return
        name = topic.name
        live = [(r["type"], base64.b64decode(r["data"])) for r in self.versions(name)[0]
                if not r.get("deleted")]
        idle = not topic.producers and topic.ml.last_confirmed() is None and not any(
            sub.consumers for sub in topic.subscriptions.values())
        if not live and idle:
            await self.register(name, schema)
            return
        if not live:
            raise IncompatibleSchemaError("Topic does not have schema to check")
        if (schema.type, schema.schema_data) in live:
            return
        strategy = self.strategy(name)
        if strategy in ("BACKWARD", "FORWARD", "FORWARD_TRANSITIVE", "FULL"):
            ok = is_compatible("BACKWARD", (schema.type, schema.schema_data), live[-1:])
        else:
            ok = is_compatible(strategy, (schema.type, schema.schema_data), live)
        if not ok:
            raise IncompatibleSchemaError(
                f"Consumer schema of type {pb.Schema.Type.Name(schema.type)} cannot read the "
                f"topic's schema under strategy {strategy}")
