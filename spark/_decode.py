"""``decodeSchema=true``: a topic's JSON or Avro schema as extra columns.

The topic's schema (from the schema registry, via the admin REST API) is a record; each
field becomes a column after the fixed ones. Primitive Avro types map onto Spark's
(``int`` → int, ``long`` → bigint, ``float``, ``double``, ``boolean``, ``string``,
``bytes`` → binary; ``["null", T]`` → a nullable T); any other field type (records,
arrays, maps, enums) is carried as its JSON text. A value that does not decode under the
schema yields nulls in those columns, never a failed task.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Decoder", "decoder_for"]

_PRIMITIVES = {
    "string": ("string", "string"), "int": ("int", "int32"), "long": ("bigint", "int64"),
    "float": ("float", "float32"), "double": ("double", "float64"), "boolean": ("boolean", "bool_"),
    "bytes": ("binary", "binary"),
}


def _field_type(avro: Any) -> tuple[str, str, bool]:
    """(Spark DDL type, pyarrow type name, carried as JSON text) of an Avro field type."""
    if isinstance(avro, list):
        rest = [t for t in avro if t != "null"]
        if len(rest) == 1:
            return _field_type(rest[0])
        return "string", "string", True
    if isinstance(avro, dict) and "logicalType" not in avro and avro.get("type") in _PRIMITIVES:
        return _field_type(avro["type"])
    if isinstance(avro, str) and avro in _PRIMITIVES:
        spark, arrow = _PRIMITIVES[avro]
        return spark, arrow, False
    return "string", "string", True


@dataclass(frozen=True)
class Decoder:
    """How to turn a value into the schema's columns; picklable, built on the driver."""

    kind: str  # "JSON" or "AVRO"
    definition: str
    fields: tuple[tuple[str, str, str, bool], ...]  # (name, spark type, arrow type, as JSON text)

    @property
    def ddl(self) -> str:
        return ", ".join(f"`{name}` {spark}" for name, spark, _, _ in self.fields)

    def arrow_types(self, pa: Any) -> list[Any]:
        return [getattr(pa, arrow)() for _, _, arrow, _ in self.fields]

    def decode(self, value: bytes | None, state: dict[str, Any]) -> list[Any]:
        """The field values of one message (all None when it does not decode)."""
        if value is None:
            return [None] * len(self.fields)
        try:
            if self.kind == "AVRO":
                import fastavro

                parsed = state.get("avro")
                if parsed is None:
                    parsed = state["avro"] = fastavro.parse_schema(json.loads(self.definition))
                record = fastavro.schemaless_reader(io.BytesIO(value), parsed)
            else:
                record = json.loads(value)
            if not isinstance(record, dict):
                raise ValueError("not a record")
        except Exception:  # noqa: BLE001 - any undecodable value becomes nulls
            return [None] * len(self.fields)
        out = []
        for name, _, arrow, as_json in self.fields:
            v = record.get(name)
            if v is not None and as_json:
                v = json.dumps(v, default=str)
            elif v is not None and arrow == "binary" and isinstance(v, str):
                v = v.encode()
            out.append(v)
        return out


def decoder_for(kind: str, definition: str, reserved: set[str]) -> Decoder:
    """A Decoder for a JSON/AVRO schema definition; ValueError for any other schema."""
    if kind not in ("JSON", "AVRO"):
        raise ValueError(f"decodeSchema handles JSON and AVRO topic schemas, not {kind}")
    try:
        doc = json.loads(definition)
    except ValueError:
        raise ValueError("the topic's schema definition is not JSON") from None
    if not isinstance(doc, dict) or doc.get("type") != "record" or not isinstance(doc.get("fields"), list):
        raise ValueError("decodeSchema needs a record schema")
    fields = []
    for f in doc["fields"]:
        name = str(f.get("name"))
        if name in reserved:
            raise ValueError(f"schema field {name!r} has the name of a fixed column")
        spark, arrow, as_json = _field_type(f.get("type"))
        fields.append((name, spark, arrow, as_json))
    return Decoder(kind, definition, tuple(fields))
