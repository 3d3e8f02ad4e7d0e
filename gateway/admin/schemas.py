"""``/admin/v2/schemas/{tenant}/{namespace}/{topic}``: get (latest or a version), list
all versions, upload, delete, and the compatibility check, with Pulsar's JSON shapes."""

from __future__ import annotations

import base64
import json
from typing import Any

from starlette.requests import Request
from starlette.routing import Route

from core.format import pulsar_api_pb2 as pb
from core.naming import TopicName
from core.schema import IncompatibleSchemaError, is_compatible

from ._common import RestError, body_object, endpoint, json_body, namespace_of, path_int

__all__ = ["routes", "SCHEMA_TYPES"]

#: Pulsar's SchemaType names and the protocol's Schema.Type numbers.
SCHEMA_TYPES = {
    "NONE": 0, "STRING": 1, "JSON": 2, "PROTOBUF": 3, "AVRO": 4, "BOOLEAN": 5, "INT8": 6,
    "INT16": 7, "INT32": 8, "INT64": 9, "FLOAT": 10, "DOUBLE": 11, "DATE": 12, "TIME": 13,
    "TIMESTAMP": 14, "KEY_VALUE": 15, "INSTANT": 16, "LOCAL_DATE": 17, "LOCAL_TIME": 18,
    "LOCAL_DATE_TIME": 19, "PROTOBUF_NATIVE": 20,
}
_NAMES = {v: k for k, v in SCHEMA_TYPES.items()}
#: The types whose schema has no definition (Pulsar's ``SchemaType.isPrimitiveType``).
_PRIMITIVE = {"NONE", "BYTES", "STRING", "BOOLEAN", "INT8", "INT16", "INT32", "INT64", "FLOAT",
              "DOUBLE", "DATE", "TIME", "TIMESTAMP", "INSTANT", "LOCAL_DATE", "LOCAL_TIME",
              "LOCAL_DATE_TIME"}
_SIDES = ("key", "value")


def _key_value_json(data: bytes, properties: dict[str, str]) -> str | None:
    """A KeyValue schema as GetSchemaResponse's ``data`` gives it: ``{"key": ..., "value":
    ...}``, each side's definition as JSON ("" for a primitive type, which the
    ``key.schema.type``/``value.schema.type`` properties name; BYTES when they do not).
    ``data`` is the stored form: the key's definition, then the value's, each after its
    length as a 4-byte big-endian integer. None when it is not in that form."""
    parts: list[bytes] = []
    at = 0
    for _ in _SIDES:
        if len(data) < at + 4:
            return None
        size = int.from_bytes(data[at:at + 4], "big", signed=True)
        at += 4
        if size < 0 or len(data) < at + size:
            return None
        parts.append(data[at:at + size])
        at += size
    if at != len(data):
        return None
    out: dict[str, Any] = {}
    for side, part in zip(_SIDES, parts, strict=True):
        if properties.get(f"{side}.schema.type", "BYTES") in _PRIMITIVE:
            out[side] = ""
            continue
        try:
            out[side] = json.loads(part)
        except ValueError:
            return None
    return json.dumps(out, separators=(",", ":"))


def _key_value_data(text: str) -> bytes:
    """The stored form of a KeyValue schema uploaded as ``{"key": ..., "value": ...}`` (see
    :func:`_key_value_json`; a side given as "" is a primitive type's, with no definition)."""
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(side in doc for side in _SIDES):
        raise RestError(422, 'Invalid KEY_VALUE schema definition: {"key": ..., "value": ...} expected')
    out = b""
    for side in _SIDES:
        part = b"" if doc[side] == "" else json.dumps(doc[side], separators=(",", ":")).encode()
        out += len(part).to_bytes(4, "big") + part
    return out


def _schema_response(version: int, rec: dict[str, Any]) -> dict[str, Any]:
    """GetSchemaResponse: the definition as text (a KeyValue schema's as the JSON of its
    key's and value's, as Pulsar gives it; one that is not text, base64)."""
    data = base64.b64decode(rec["data"])
    text = _key_value_json(data, rec.get("properties", {})) \
        if int(rec["type"]) == SCHEMA_TYPES["KEY_VALUE"] else None
    if text is None:
        try:
            text = data.decode()
        except UnicodeDecodeError:
            text = base64.b64encode(data).decode()
    return {"version": version, "type": _NAMES.get(int(rec["type"]), str(rec["type"])),
            "timestamp": int(rec.get("timestamp", 0)), "data": text,
            "properties": dict(rec.get("properties", {}))}


def _payload(body: Any) -> pb.Schema:
    data = body_object(body, "PostSchemaPayload")
    kind = str(data.get("type", "")).upper()
    if kind not in SCHEMA_TYPES:
        raise RestError(422, f"Invalid schema type {data.get('type')!r}")
    schema = data.get("schema", "")
    if not isinstance(schema, str):
        raise RestError(400, "schema must be a string")
    props = data.get("properties") or {}
    if not isinstance(props, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
        raise RestError(400, "properties must map strings to strings")
    if kind in ("AVRO", "JSON", "PROTOBUF"):
        try:
            json.loads(schema)
        except ValueError:
            raise RestError(422, f"Invalid {kind} schema definition") from None
    # as Pulsar stores an uploaded KeyValue schema: in the form its clients register it in
    stored = _key_value_data(schema) if kind == "KEY_VALUE" else schema.encode()
    return pb.Schema(name="", type=pb.Schema.Type.Name(SCHEMA_TYPES[kind]), schema_data=stored,
                     properties=[pb.KeyValue(key=k, value=v) for k, v in props.items()])


def routes(broker: Any) -> list[Route]:
    registry = broker.schemas

    def topic_name(request: Request) -> TopicName:
        ns = namespace_of(request)
        if broker.policies.get_namespace(ns) is None:
            raise RestError(404, "Namespace does not exist")
        return TopicName.parse(f"persistent://{ns}/{request.path_params['topic']}")

    def live(name: TopicName) -> list[tuple[int, dict[str, Any]]]:
        recs, _ = registry.versions(name)
        return [(i, r) for i, r in enumerate(recs) if not r.get("deleted")]

    @endpoint
    async def get_latest(request: Request) -> Any:
        found = live(topic_name(request))
        if not found:
            raise RestError(404, "Schema not found")
        return _schema_response(*found[-1])

    @endpoint
    async def get_version(request: Request) -> Any:
        name = topic_name(request)
        version = path_int(request, "version")
        recs, _ = registry.versions(name)
        if not 0 <= version < len(recs) or recs[version].get("deleted"):
            raise RestError(404, "Schema not found")
        return _schema_response(version, recs[version])

    @endpoint
    async def get_all(request: Request) -> Any:
        return {"getSchemaResponses": [_schema_response(i, r) for i, r in live(topic_name(request))]}

    @endpoint
    async def upload(request: Request) -> Any:
        name = topic_name(request)
        schema = _payload(await json_body(request))
        try:
            version = await registry.register(name, schema)
        except IncompatibleSchemaError as exc:
            raise RestError(409, str(exc)) from None
        return {"version": {"version": int.from_bytes(version, "big", signed=True) if version else -1}}

    @endpoint
    async def delete(request: Request) -> Any:
        # DeleteSchemaResponse: a plain number, unlike the upload's nested SchemaVersion
        return {"version": registry.delete_all(topic_name(request))}

    @endpoint
    async def compatibility(request: Request) -> Any:
        name = topic_name(request)
        schema = _payload(await json_body(request))
        strategy = registry.strategy(name)
        old = [(int(r["type"]), base64.b64decode(r["data"])) for _, r in live(name)]
        ok = is_compatible(strategy, (schema.type, schema.schema_data), old)
        return {"compatibility": ok, "schemaCompatibilityStrategy": strategy}

    base = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"
    return [
        Route(f"{base}/schema", get_latest, methods=["GET"]),
        Route(f"{base}/schema", upload, methods=["POST"]),
        Route(f"{base}/schema", delete, methods=["DELETE"]),
        Route(f"{base}/schema/{{version}}", get_version, methods=["GET"]),
        Route(f"{base}/schemas", get_all, methods=["GET"]),
        Route(f"{base}/compatibility", compatibility, methods=["POST"]),
    ]
