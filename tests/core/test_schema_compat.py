"""Schema compatibility strategies, as a table: which new schema each strategy accepts after
which history (Avro's resolution rules on record fields)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.format import pulsar_api_pb2 as pb
from core.schema import STRATEGIES, is_compatible

AVRO, JSON, STRING = pb.Schema.Avro, pb.Schema.Json, pb.Schema.String


def record(*fields: tuple) -> bytes:
    """An Avro record schema; a field is (name, type) or (name, type, default)."""
    out = []
    for f in fields:
        d = {"name": f[0], "type": f[1]}
        if len(f) > 2:
            d["default"] = f[2]
        out.append(d)
    return json.dumps({"type": "record", "name": "R", "fields": out}).encode()


A = record(("a", "int"))
A_B_DEFAULT = record(("a", "int"), ("b", "string", ""))
A_B = record(("a", "int"), ("b", "string"))
A_LONG = record(("a", "long"))
X = record(("x", "string"))
Y = record(("y", "int"))

CASES = [
    # strategy, history (oldest first), new, accepted
    ("BACKWARD", [A], A_B_DEFAULT, True),        # the new reader defaults the added field
    ("BACKWARD", [A], A_B, False),               # ...and cannot without a default
    ("FORWARD", [A], A_B, True),                 # the old reader skips the added field
    ("FORWARD", [A_B], A, False),                # the old reader misses b, which has no default
    ("FULL", [A], A_B_DEFAULT, True),
    ("FULL", [A], A_B, False),
    ("FULL", [A_B_DEFAULT], A, True),
    ("BACKWARD", [A], A_LONG, True),             # int is promoted to long
    ("FORWARD", [A], A_LONG, False),             # long is not narrowed to int
    ("BACKWARD", [X, Y], Y, True),               # only the latest version counts...
    ("BACKWARD_TRANSITIVE", [X, Y], Y, False),   # ...or every one of them
    ("FORWARD", [X, A_B_DEFAULT], A, True),
    ("FORWARD_TRANSITIVE", [X, A_B_DEFAULT], A, False),
    ("FULL", [X, A], A_B_DEFAULT, True),
    ("FULL_TRANSITIVE", [X, A], A_B_DEFAULT, False),
    ("FULL_TRANSITIVE", [A, A_B_DEFAULT], A, True),
    ("ALWAYS_COMPATIBLE", [A], X, True),
    ("NONE", [A], X, True),
    ("ALWAYS_INCOMPATIBLE", [A], A, False),
]


@pytest.mark.parametrize("strategy, history, new, accepted", CASES)
def test_strategy_accepts_what_avro_resolution_allows(strategy, history, new, accepted):
    old = [(AVRO, d) for d in history]
    assert is_compatible(strategy, (AVRO, new), old) is accepted


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_first_schema_is_always_accepted(strategy):
    assert is_compatible(strategy, (AVRO, A), [])


@pytest.mark.parametrize("strategy", ["BACKWARD", "FORWARD", "FULL", "FULL_TRANSITIVE"])
def test_a_different_schema_type_is_refused(strategy):
    assert not is_compatible(strategy, (JSON, A), [(AVRO, A)])


def test_other_schema_types_are_compatible_only_when_identical():
    assert is_compatible("FULL", (STRING, b""), [(STRING, b"")])
    assert not is_compatible("FULL", (STRING, b"x"), [(STRING, b"")])


def rec(name: str, *fields: tuple, **attrs: Any) -> dict[str, Any]:
    """A named Avro record type; a field is (name, type) or (name, type, default)."""
    return {"type": "record", "name": name, **attrs, "fields": [
        {"name": f[0], "type": f[1], **({"default": f[2]} if len(f) > 2 else {})} for f in fields]}


def one(t: Any, *more: tuple) -> bytes:
    """Record R whose field f has type `t` (followed by fields `more`)."""
    return json.dumps(rec("R", ("f", t), *more)).encode()


def array_of(items: Any) -> dict[str, Any]:
    return {"type": "array", "items": items}


def map_of(values: Any) -> dict[str, Any]:
    return {"type": "map", "values": values}


def enum(*symbols: str, **attrs: Any) -> dict[str, Any]:
    return {"type": "enum", "name": "E", "symbols": list(symbols), **attrs}


def fixed(name: str, size: int) -> dict[str, Any]:
    return {"type": "fixed", "name": name, "size": size}


def node(value: str, *more: tuple) -> bytes:
    """A recursive linked-list record: Node's next is null or another Node."""
    return json.dumps(rec("Node", ("value", value), ("next", ["null", "Node"], None), *more)).encode()


INNER_INT = rec("Inner", ("x", "int"))

RESOLUTION = [
    # writer, reader, whether the reader can read the writer's data
    # primitives: the same type, or one Avro promotes to
    (one("int"), one("int"), True),
    (one("null"), one("null"), True),
    (one("int"), one("long"), True),
    (one("int"), one("float"), True),
    (one("int"), one("double"), True),
    (one("long"), one("float"), True),
    (one("long"), one("double"), True),
    (one("float"), one("double"), True),
    (one("string"), one("bytes"), True),
    (one("bytes"), one("string"), True),
    (one("long"), one("int"), False),
    (one("double"), one("float"), False),
    (one("int"), one("string"), False),
    (one("null"), one("int"), False),
    (one("boolean"), one("int"), False),
    (one({"type": "int", "logicalType": "date"}), one("int"), True),
    (b'"int"', b'"long"', True),                                       # a schema need not be a record
    (b'"long"', b'"int"', False),
    # records: fields match by name or reader alias, missing ones need a default; Avro's
    # validator (Pulsar's) does not compare record names
    (one("int"), json.dumps(rec("S", ("f", "int"))).encode(), True),
    (one("int"), json.dumps(rec("S", ("f", "string"))).encode(), False),
    (one("int"), json.dumps(rec("R", ("g", "int"))).encode(), False),
    (one("int"), json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "g", "type": "int", "aliases": ["f"]}]}).encode(), True),
    (one("int"), one("int", ("g", "string", "")), True),
    (one("int"), one("int", ("g", "string")), False),
    (one("int", ("g", "string")), one("int"), True),                   # writer fields are skipped
    (one(INNER_INT), one(rec("Inner", ("x", "string"))), False),
    (one(INNER_INT), one(rec("Inner", ("x", "long"))), True),
    (one(INNER_INT), one(rec("Inner", ("x", "int"), ("y", "string", ""))), True),
    (one(INNER_INT), one(rec("Inner", ("x", "int"), ("y", "string"))), False),
    (one(INNER_INT), one(rec("Other", ("x", "int"))), True),
    (one(INNER_INT), one(rec("Other", ("x", "string"))), False),
    # enums: names match; every writer symbol is the reader's, unless the reader has a default
    (one(enum("A", "B")), one(enum("A", "B", "C")), True),
    (one(enum("A", "B", "C")), one(enum("A", "B")), False),
    (one(enum("A", "B", "C")), one(enum("A", "B", default="A")), True),
    (one(enum("A", "B", "C")), one(enum("A", "B", default="Z")), False),
    (one(enum("A", "B")), one({**enum("A", "B"), "name": "F"}), False),
    (one(enum("A", "B")), one({**enum("A", "B"), "name": "F", "aliases": ["E"]}), True),
    (one({**enum("A", "B"), "namespace": "a"}), one({**enum("A", "B"), "namespace": "b"}), True),
    (one({**enum("A", "B"), "namespace": "a"}),
     one({**enum("A", "B"), "name": "F", "namespace": "b", "aliases": ["a.E"]}), True),
    (one({**enum("A", "B"), "namespace": "a"}),
     one({**enum("A", "B"), "name": "F", "namespace": "b", "aliases": ["E"]}), False),  # b.E
    # arrays, maps and fixed
    (one(array_of("int")), one(array_of("int")), True),
    (one(array_of("int")), one(array_of("long")), True),
    (one(array_of("int")), one(array_of("string")), False),
    (one(array_of(INNER_INT)), one(array_of(rec("Inner", ("x", "string")))), False),
    (one(array_of("int")), one(map_of("int")), False),
    (one(map_of("int")), one(map_of("double")), True),
    (one(map_of("int")), one(map_of("string")), False),
    (one(map_of(enum("A", "B", "C"))), one(map_of(enum("A", "B"))), False),
    (one(fixed("H", 16)), one(fixed("H", 16)), True),
    (one(fixed("H", 16)), one(fixed("H", 8)), False),
    (one(fixed("H", 16)), one(fixed("G", 16)), False),
    (one(fixed("H", 16)), one("bytes"), False),
    # unions: each writer branch readable; a reader union needs some branch that reads
    (one(["null", "int"]), one(["null", "int"]), True),
    (one(["int", "null"]), one(["null", "long"]), True),
    (one(["null", "string"]), one(["null", "int"]), False),
    (one(["null", "int"]), one("int"), False),
    (one(["int"]), one("long"), True),
    (one("int"), one(["null", "long"]), True),
    (one("string"), one(["null", "int"]), False),
    (one(["null", array_of("int")]), one(["null", array_of("string")]), False),
    (one(["null", map_of("int")]), one(["null", map_of("string")]), False),
    # a named type referred to by name after its definition, in its namespace or not
    (json.dumps(rec("R", ("a", INNER_INT), ("b", "Inner"))).encode(),
     json.dumps(rec("R", ("b", rec("Inner", ("x", "long"))))).encode(), True),
    (json.dumps(rec("R", ("a", INNER_INT), ("b", "Inner"))).encode(),
     json.dumps(rec("R", ("b", rec("Inner", ("x", "string"))))).encode(), False),
    (json.dumps(rec("R", ("b", rec("Inner", ("x", "string"))))).encode(),
     json.dumps(rec("R", ("a", INNER_INT, {"x": 0}), ("b", "Inner"))).encode(), False),
    (json.dumps(rec("R", ("a", INNER_INT), ("b", "n.Inner"), namespace="n")).encode(),
     json.dumps(rec("R", ("b", rec("Inner", ("x", "long"))), namespace="n")).encode(), True),
    (json.dumps(rec("R", ("a", INNER_INT), ("b", array_of("Inner")))).encode(),
     json.dumps(rec("R", ("b", array_of(rec("Inner", ("x", "string")))))).encode(), False),
    # recursive records
    (node("int"), node("int"), True),
    (node("int"), node("long"), True),
    (node("int"), node("string"), False),
    (node("int"), node("int", ("label", "string", "")), True),
    (node("int"), node("int", ("label", "string")), False),
    # definitions that are not Avro schemas read only themselves
    (b"{not json", b"{not json", True),
    (b"{not json", b"{not json either", False),
    (one("Undefined"), one("Undefined"), True),
    (one("Undefined"), one("int"), False),
]


@pytest.mark.parametrize("schema_type", [AVRO, JSON], ids=["avro", "json"])
@pytest.mark.parametrize("writer, reader, readable", RESOLUTION)
def test_a_reader_reads_what_avro_schema_resolution_allows(schema_type, writer, reader, readable):
    """BACKWARD: the new schema reads the old one's data; FORWARD: the old reads the new's."""
    assert is_compatible("BACKWARD", (schema_type, reader), [(schema_type, writer)]) is readable
    assert is_compatible("FORWARD", (schema_type, writer), [(schema_type, reader)]) is readable


ARRAY_INT, ARRAY_STRING = one(array_of("int")), one(array_of("string"))
MAP_INT, MAP_STRING = one(map_of("int")), one(map_of("string"))
NESTED_INT, NESTED_STRING = one(INNER_INT), one(rec("Inner", ("x", "string")))
ENUM_ABC, ENUM_AB = one(enum("A", "B", "C")), one(enum("A", "B"))
EMPTY = json.dumps(rec("R")).encode()
ARRAY_STRING_DEFAULT = json.dumps(rec("R", ("f", array_of("string"), []))).encode()
NESTED_DEFAULTED = one(rec("Inner", ("x", "int"), ("y", "string", "")))

NESTED_CASES = [
    # strategy, history (oldest first), new, accepted: changes inside nested types
    *[(s, [old], new, False) for s in ("BACKWARD", "FORWARD", "FULL") for old, new in (
        (ARRAY_INT, ARRAY_STRING), (ARRAY_STRING, ARRAY_INT), (MAP_INT, MAP_STRING),
        (MAP_STRING, MAP_INT), (NESTED_INT, NESTED_STRING), (NESTED_STRING, NESTED_INT))],
    ("BACKWARD", [ENUM_ABC], ENUM_AB, False),    # the new reader lacks C, which old data may hold
    ("FORWARD", [ENUM_ABC], ENUM_AB, True),
    ("FULL", [ENUM_ABC], ENUM_AB, False),
    ("BACKWARD", [ENUM_AB], ENUM_ABC, True),     # an enum may gain a symbol...
    ("FORWARD", [ENUM_AB], ENUM_ABC, False),     # ...that old readers cannot read
    ("FULL", [ENUM_AB], ENUM_ABC, False),
    ("FULL", [NESTED_INT], NESTED_DEFAULTED, True),
    ("FULL", [NESTED_DEFAULTED], NESTED_INT, True),
    ("BACKWARD", [ARRAY_INT, EMPTY], ARRAY_STRING_DEFAULT, True),
    ("BACKWARD_TRANSITIVE", [ARRAY_INT, EMPTY], ARRAY_STRING_DEFAULT, False),
    ("FORWARD", [ARRAY_INT, EMPTY], ARRAY_STRING_DEFAULT, True),
    ("FORWARD_TRANSITIVE", [ARRAY_INT, EMPTY], ARRAY_STRING_DEFAULT, False),
    ("FULL", [ARRAY_INT, EMPTY], ARRAY_STRING_DEFAULT, True),
    ("FULL_TRANSITIVE", [ARRAY_INT, EMPTY], ARRAY_STRING_DEFAULT, False),
]


@pytest.mark.parametrize("schema_type", [AVRO, JSON], ids=["avro", "json"])
@pytest.mark.parametrize("strategy, history, new, accepted", NESTED_CASES)
def test_strategies_compare_inside_nested_types(schema_type, strategy, history, new, accepted):
    old = [(schema_type, d) for d in history]
    assert is_compatible(strategy, (schema_type, new), old) is accepted
