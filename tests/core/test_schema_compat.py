"""Schema compatibility strategies, as a table: which new schema each strategy accepts after
which history (Avro's resolution rules on record fields)."""

from __future__ import annotations

import json

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
