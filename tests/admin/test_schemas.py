"""Schemas over REST: upload, get (latest, by version, all), delete, compatibility, and
the schema a real pulsar-client producer registers."""

from __future__ import annotations

import json

import pulsar
import pytest
from pulsar.schema import Integer, JsonSchema, Record, String

from gateway._admin_cli import AdminClient
from tests._standalone import Standalone

from .conftest import status_of


class User(Record):
    id = Integer()
    name = String()


def _avro(fields: list[dict[str, object]]) -> dict[str, object]:
    return {"type": "AVRO", "schema": json.dumps({"type": "record", "name": "U", "fields": fields}),
            "properties": {"owner": "tests"}}


def test_upload_get_delete(admin: AdminClient, ns: str) -> None:
    base = f"/admin/v2/schemas/{ns}/s/schema"
    assert status_of(admin.get, base) == (404, "Schema not found")
    assert admin.post(base, _avro([{"name": "id", "type": "int"}])) == {"version": {"version": 0}}
    v1 = _avro([{"name": "id", "type": "int"}, {"name": "n", "type": "string", "default": ""}])
    assert admin.post(base, v1) == {"version": {"version": 1}}
    latest = admin.get(base)
    assert latest["version"] == 1 and latest["type"] == "AVRO"
    assert latest["properties"] == {"owner": "tests"}
    assert json.loads(latest["data"])["fields"][1]["name"] == "n"
    assert admin.get(f"{base}/0")["version"] == 0
    assert status_of(admin.get, f"{base}/7")[0] == 404
    assert [s["version"] for s in admin.get(f"/admin/v2/schemas/{ns}/s/schemas")["getSchemaResponses"]] == [0, 1]
    assert admin.delete(base) == {"version": 1}  # Pulsar's DeleteSchemaResponse shape
    assert status_of(admin.get, base)[0] == 404


def test_incompatible_upload_is_409(admin: AdminClient, ns: str) -> None:
    base = f"/admin/v2/schemas/{ns}/s/schema"
    admin.post(base, _avro([{"name": "id", "type": "int"}]))
    breaking = _avro([{"name": "other", "type": "string"}])
    check = admin.post(f"/admin/v2/schemas/{ns}/s/compatibility", breaking)
    assert check == {"compatibility": False, "schemaCompatibilityStrategy": "FULL"}
    assert status_of(admin.post, base, breaking)[0] == 409
    admin.put(f"/admin/v2/namespaces/{ns}/schemaCompatibilityStrategy", "ALWAYS_COMPATIBLE")
    assert admin.post(base, breaking) == {"version": {"version": 1}}


@pytest.mark.parametrize(("body", "status"), [
    ({"type": "WHATEVER", "schema": "{}"}, 422),
    ({"type": "AVRO", "schema": "{not json"}, 422),
    ({"type": "AVRO", "schema": 5}, 400),
    ([1], 400),
])
def test_bad_uploads(admin: AdminClient, ns: str, body: object, status: int) -> None:
    assert status_of(admin.post, f"/admin/v2/schemas/{ns}/s/schema", body)[0] == status


def test_producer_schema_visible(admin: AdminClient, ns: str, server: Standalone) -> None:
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=5)
    try:
        topic = f"persistent://{ns}/users"
        producer = client.create_producer(topic, schema=JsonSchema(User))
        producer.send(User(id=1, name="a"))
        got = admin.get(f"/admin/v2/schemas/{ns}/users/schema")
        assert got["type"] == "JSON"
        assert {f["name"] for f in json.loads(got["data"])["fields"]} == {"id", "name"}
        producer.close()
        admin.put(f"/admin/v2/namespaces/{ns}/schemaCompatibilityStrategy", "ALWAYS_INCOMPATIBLE")

        class Other(Record):
            x = String()

        with pytest.raises(pulsar.PulsarException):
            client.create_producer(topic, schema=JsonSchema(Other))
    finally:
        client.close()


def test_a_key_value_schema_reads_as_its_key_and_value_definitions(admin: AdminClient, ns: str,
                                                                   server: Standalone) -> None:
    # The official Python client has no KeyValue schema: register one as a Java client does,
    # the key's definition then the value's, each after its length.
    from core.format import pulsar_api_pb2 as pb
    from handlers.pulsar import _events as ev
    from tests.handlers.pulsar._raw import RawClient

    key = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "int"}]}
    key_bytes = json.dumps(key).encode()
    props = {"key.schema.name": "K", "key.schema.type": "JSON", "key.schema.properties": '{"a":"b"}',
             "value.schema.name": "String", "value.schema.type": "STRING",
             "value.schema.properties": "{}", "kv.encoding.type": "SEPARATED"}
    raw = RawClient(server.pulsar_url)
    try:
        raw.connect()
        raw.send(ev.CommandProducer.build(
            topic=f"persistent://{ns}/kv", producer_id=1, request_id=1,
            schema=pb.Schema(name="kv", type=pb.Schema.KeyValue,
                             schema_data=len(key_bytes).to_bytes(4, "big") + key_bytes + bytes(4),
                             properties=[pb.KeyValue(key=k, value=v) for k, v in props.items()])))
        assert isinstance(raw.next_event(), ev.CommandProducerSuccess)
    finally:
        raw.close()
    got = admin.get(f"/admin/v2/schemas/{ns}/kv/schema")
    assert got["type"] == "KEY_VALUE" and got["properties"] == props
    assert isinstance(got["data"], str)  # GetSchemaResponse's data is text, JSON here
    assert json.loads(got["data"]) == {"key": key, "value": ""}
    # uploaded in that shape, it is stored as a client registers it, and reads the same
    base = f"/admin/v2/schemas/{ns}/kv2/schema"
    admin.post(base, {"type": "KEY_VALUE", "schema": got["data"], "properties": props})
    assert admin.get(base)["data"] == got["data"]
    assert status_of(admin.post, base, {"type": "KEY_VALUE", "schema": "{}"})[0] == 422


class UserV2(Record):
    id = Integer()
    name = String()
    email = String()


def test_schema_validation_enforced_refuses_producers_without_a_schema(
        admin: AdminClient, ns: str, server: Standalone) -> None:
    policy = f"/admin/v2/namespaces/{ns}/schemaValidationEnforced"
    assert admin.get(policy) is False
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=5)
    try:
        typed, plain = f"persistent://{ns}/typed", f"persistent://{ns}/plain"
        client.create_producer(typed, schema=JsonSchema(User)).close()
        client.create_producer(typed).close()  # not enforced yet
        admin.post(policy, True)
        assert admin.get(policy) is True
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(typed)
        client.create_producer(typed, schema=JsonSchema(User)).close()
        client.create_producer(plain).close()  # a topic without a schema takes anyone
    finally:
        client.close()


def test_without_auto_update_a_producer_needs_a_registered_schema(
        admin: AdminClient, ns: str, server: Standalone) -> None:
    policy = f"/admin/v2/namespaces/{ns}/isAllowAutoUpdateSchema"
    admin.put(f"/admin/v2/namespaces/{ns}/schemaCompatibilityStrategy", "ALWAYS_COMPATIBLE")
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=5)
    try:
        topic = f"persistent://{ns}/evolving"
        client.create_producer(topic, schema=JsonSchema(User)).close()
        admin.post(policy, False)
        assert admin.get(policy) is False
        with pytest.raises(pulsar.IncompatibleSchema):  # compatible, but not registered
            client.create_producer(topic, schema=JsonSchema(UserV2))
        client.create_producer(topic, schema=JsonSchema(User)).close()
        # Registering it over REST is how a new version comes in now.
        v2 = JsonSchema(UserV2).schema_info()
        admin.post(f"/admin/v2/schemas/{ns}/evolving/schema",
                   {"type": "JSON", "schema": v2.schema(), "properties": {}})
        producer = client.create_producer(topic, schema=JsonSchema(UserV2))
        producer.send(UserV2(id=2, name="b", email="b@example.org"))
        admin.delete(policy)
        assert admin.get(policy) is None
    finally:
        client.close()


def test_topic_level_schema_policies_override_the_namespaces(
        admin: AdminClient, ns: str, server: Standalone) -> None:
    topic_path = f"/admin/v2/persistent/{ns}/own"
    base = f"/admin/v2/schemas/{ns}/own/schema"
    admin.put(topic_path)  # topic policies are set on a topic that exists
    admin.post(base, _avro([{"name": "id", "type": "int"}]))
    breaking = _avro([{"name": "other", "type": "string"}])
    # the namespace says FULL; the topic's own ALWAYS_COMPATIBLE wins
    admin.put(f"{topic_path}/schemaCompatibilityStrategy", "ALWAYS_COMPATIBLE")
    check = admin.post(f"/admin/v2/schemas/{ns}/own/compatibility", breaking)
    assert check == {"compatibility": True, "schemaCompatibilityStrategy": "ALWAYS_COMPATIBLE"}
    admin.delete(f"{topic_path}/schemaCompatibilityStrategy")
    assert status_of(admin.post, base, breaking)[0] == 409
    client = pulsar.Client(server.pulsar_url, operation_timeout_seconds=5)
    try:
        client.create_producer(f"persistent://{ns}/own").close()  # not enforced anywhere yet
        admin.post(f"{topic_path}/schemaValidationEnforced", True)
        with pytest.raises(pulsar.IncompatibleSchema):
            client.create_producer(f"persistent://{ns}/own")
        admin.delete(f"{topic_path}/schemaValidationEnforced")
        client.create_producer(f"persistent://{ns}/own").close()
    finally:
        client.close()
