"""Token authentication and authorization of Pulsar clients: the official client with
``AuthenticationToken``, and the broker's exact answers on the wire."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pulsar
import pytest

from core.auth import create_secret_key, create_token
from core.format import pulsar_api_pb2 as pb
from gateway._admin_cli import AdminClient
from handlers.pulsar import _events as ev
from tests._auth import SUPER_USER, Tokens
from tests._standalone import Standalone
from tests.handlers.pulsar._raw import RawClient

RECEIVE_MS = 10_000


@pytest.fixture(scope="module")
def admin(secured: Standalone, tokens: Tokens) -> AdminClient:
    return AdminClient(secured.addresses["web"][0], timeout=30, token=tokens.token(SUPER_USER))


def _client(server: Standalone, token: str | None) -> pulsar.Client:
    auth = pulsar.AuthenticationToken(token) if token is not None else None
    return pulsar.Client(server.pulsar_url, authentication=auth, operation_timeout_seconds=3)


def _connect_answer(server: Standalone, method: str | None, data: bytes | None):
    raw = RawClient(server.pulsar_url)
    try:
        fields = {"client_version": "raw-test", "protocol_version": 21}
        if method is not None:
            fields["auth_method_name"] = method
        if data is not None:
            fields["auth_data"] = data
        raw.send(ev.CommandConnect.build(**fields))
        answer = raw.next_event()
        rest = raw.read_raw_until_closed()
        return answer, rest
    finally:
        raw.close()


def test_superuser_token_produces_and_consumes(secured, tokens, unique):
    client = _client(secured, tokens.token(SUPER_USER))
    try:
        topic = f"persistent://public/default/auth-{unique}"
        consumer = client.subscribe(topic, "s")
        client.create_producer(topic).send(b"hello")
        assert consumer.receive(timeout_millis=RECEIVE_MS).data() == b"hello"
    finally:
        client.close()


BAD = {
    "no credentials": (None, None),
    "garbage": ("token", b"not-a-jwt"),
    "blank": ("token", b""),
    "other method": ("tls", b"x"),
    "signed by another key": ("token", create_token(create_secret_key(), SUPER_USER).encode()),
}


@pytest.mark.parametrize("case", [*BAD, "expired"])
def test_connect_without_valid_token_gets_authentication_error_and_is_closed(secured, tokens, case):
    method, data = BAD[case] if case in BAD else ("token", tokens.token(SUPER_USER, expires_in=-60).encode())
    answer, rest = _connect_answer(secured, method, data)
    assert isinstance(answer, ev.CommandError)
    assert answer.command.error == pb.AuthenticationError
    assert answer.command.message == "Failed to authenticate"
    assert answer.command.request_id == (1 << 64) - 1
    assert rest == b""  # and the broker closed the connection


def test_refused_client_fails_and_others_are_unaffected(secured, tokens, unique):
    topic = f"refused-{unique}"
    good = _client(secured, tokens.token(SUPER_USER))
    producer = good.create_producer(topic)
    for token in (None, tokens.token(SUPER_USER, expires_in=-60)):
        bad = _client(secured, token)
        try:
            with pytest.raises(pulsar.PulsarException):
                bad.create_producer(topic)
        finally:
            bad.close()
    producer.send(b"still served")
    good.close()


def test_produce_and_consume_need_the_roles_permissions(secured, tokens, admin, unique):
    topic = f"persistent://public/default/perm-{unique}"
    client = _client(secured, tokens.token(f"bob-{unique}"))
    try:
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(topic)
        admin.post(f"/admin/v2/namespaces/public/default/permissions/bob-{unique}", ["produce"])
        producer = client.create_producer(topic)
        producer.send(b"granted")
        with pytest.raises(pulsar.AuthorizationError):
            client.subscribe(topic, "s")
        admin.post(f"/admin/v2/namespaces/public/default/permissions/bob-{unique}",
                   ["produce", "consume"])
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        assert consumer.receive(timeout_millis=RECEIVE_MS).data() == b"granted"
        admin.delete(f"/admin/v2/namespaces/public/default/permissions/bob-{unique}")
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(f"{topic}-other")
    finally:
        client.close()


def test_raw_producer_without_permission_gets_authorization_error(secured, tokens, unique):
    raw = RawClient(secured.pulsar_url)
    try:
        raw.send(ev.CommandConnect.build(client_version="raw-test", protocol_version=21,
                                         auth_method_name="token",
                                         auth_data=tokens.token(f"carol-{unique}").encode()))
        assert isinstance(raw.next_event(), ev.CommandConnected)
        raw.send(ev.CommandProducer.build(topic=f"persistent://public/default/raw-{unique}",
                                          producer_id=1, request_id=7))
        answer = raw.next_event()
        assert isinstance(answer, ev.CommandError)
        assert (answer.command.request_id, answer.command.error, answer.command.message) == \
            (7, pb.AuthorizationError, "Client is not authorized to Produce")
    finally:
        raw.close()


def test_tenant_admin_may_use_its_tenant_only(secured, tokens, admin, unique):
    tenant, role = f"t-{unique}", f"owner-{unique}"
    admin.put(f"/admin/v2/tenants/{tenant}", {"adminRoles": [role], "allowedClusters": ["standalone"]})
    admin.put(f"/admin/v2/namespaces/{tenant}/ns")
    client = _client(secured, tokens.token(role))
    try:
        client.create_producer(f"persistent://{tenant}/ns/mine").send(b"x")
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(f"persistent://public/default/not-mine-{unique}")
    finally:
        client.close()


def test_topic_level_permission_grants_that_topic(secured, tokens, admin, unique):
    topic, role = f"persistent://public/default/one-{unique}", f"dave-{unique}"
    admin.post(f"/admin/v2/persistent/public/default/one-{unique}/permissions/{role}", ["produce"])
    assert admin.get(f"/admin/v2/persistent/public/default/one-{unique}/permissions")[role] == ["produce"]
    client = _client(secured, tokens.token(role))
    try:
        client.create_producer(topic).send(b"x")
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(f"{topic}-two")
        admin.delete(f"/admin/v2/persistent/public/default/one-{unique}/permissions/{role}")
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(topic)
    finally:
        client.close()


def test_auth_data_is_ignored_when_authentication_is_off(standalone, unique):
    client = _client(standalone, "not-a-jwt")
    try:
        client.create_producer(f"off-{unique}").send(b"x")
    finally:
        client.close()


def test_anonymous_role_serves_clients_without_credentials(tmp_path, tokens, unique):
    conf = tokens.conf(authorization=False, anonymousUserRole="anon")
    with Standalone(tmp_path, conf=conf) as server:
        client = _client(server, None)
        try:
            client.create_producer(f"anon-{unique}").send(b"x")
        finally:
            client.close()
        answer, _ = _connect_answer(server, "token", b"garbage")
        assert answer.command.error == pb.AuthenticationError


# -- refreshing expired credentials on a live connection (authenticationRefreshCheckSeconds)

TOKEN_SECONDS = 2


@pytest.fixture(scope="module")
def refreshing(tmp_path_factory: pytest.TempPathFactory, tokens: Tokens) -> Iterator[Standalone]:
    conf = tokens.conf(authenticationRefreshCheckSeconds=1)
    with Standalone(tmp_path_factory.mktemp("refreshing"), conf=conf) as s:
        yield s


def _connected(server: Standalone, token: str, *, refreshable: bool) -> RawClient:
    raw = RawClient(server.pulsar_url)
    raw.send(ev.CommandConnect.build(client_version="raw-test", protocol_version=21,
                                     auth_method_name="token", auth_data=token.encode(),
                                     feature_flags=pb.FeatureFlags(supports_auth_refresh=refreshable)))
    assert isinstance(raw.next_event(), ev.CommandConnected)
    return raw


def _next_not_ping(raw: RawClient):
    while isinstance(event := raw.next_event(), ev.CommandPing):
        raw.send(ev.CommandPong.build())
    return event


def test_expired_credentials_are_refreshed_with_a_challenge(refreshing, tokens):
    raw = _connected(refreshing, tokens.token(SUPER_USER, expires_in=TOKEN_SECONDS), refreshable=True)
    try:
        challenge = _next_not_ping(raw)
        assert isinstance(challenge, ev.CommandAuthChallenge)
        assert challenge.command.challenge.auth_method_name == "token"
        assert challenge.command.challenge.auth_data == b"PulsarAuthRefresh"
        raw.send(ev.CommandAuthResponse.build(response=pb.AuthData(
            auth_method_name="token", auth_data=tokens.token(SUPER_USER, expires_in=3600).encode())))
        raw.send(ev.CommandProducer.build(topic="persistent://public/default/refreshed", producer_id=1,
                                          request_id=1))
        assert isinstance(_next_not_ping(raw), ev.CommandProducerSuccess)
    finally:
        raw.close()


@pytest.mark.parametrize("answer", ["expired", "other role"])
def test_refresh_with_bad_credentials_closes_the_connection(refreshing, tokens, answer):
    raw = _connected(refreshing, tokens.token(SUPER_USER, expires_in=TOKEN_SECONDS), refreshable=True)
    try:
        assert isinstance(_next_not_ping(raw), ev.CommandAuthChallenge)
        token = tokens.token(SUPER_USER, expires_in=-60) if answer == "expired" else tokens.token("someone-else")
        raw.send(ev.CommandAuthResponse.build(response=pb.AuthData(auth_method_name="token",
                                                                   auth_data=token.encode())))
        if answer == "expired":
            error = raw.next_event()
            assert (error.command.error, error.command.message) == \
                (pb.AuthenticationError, "Failed to authenticate")
        assert raw.read_raw_until_closed() == b""
    finally:
        raw.close()


def test_client_that_cannot_refresh_is_closed_once_its_token_expires(refreshing, tokens):
    raw = _connected(refreshing, tokens.token(SUPER_USER, expires_in=TOKEN_SECONDS), refreshable=False)
    try:
        assert raw.read_raw_until_closed() == b""
    finally:
        raw.close()


def test_official_client_with_a_token_supplier_outlives_its_tokens(refreshing, tokens, unique):
    issued: list[str] = []

    def supplier() -> str:
        issued.append(tokens.token(SUPER_USER, expires_in=TOKEN_SECONDS))
        return issued[-1]

    client = pulsar.Client(refreshing.pulsar_url, authentication=pulsar.AuthenticationToken(supplier),
                           operation_timeout_seconds=10)
    try:
        topic = f"supplied-{unique}"
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic, batching_enabled=False)
        first = len(issued)
        deadline = time.monotonic() + 30
        sent = 0
        while len(issued) < first + 2 and time.monotonic() < deadline:
            producer.send(f"m{sent}".encode())
            sent += 1
            time.sleep(0.2)
        assert len(issued) >= first + 2, "the broker never asked for fresh credentials"
        got = [consumer.receive(timeout_millis=RECEIVE_MS).data() for _ in range(sent)]
        assert got == [f"m{i}".encode() for i in range(sent)]
    finally:
        client.close()


def test_subscription_permissions_and_prefix_mode(secured, tokens, admin, unique):
    tenant, role = f"st-{unique}", f"erin-{unique}"
    ns = f"{tenant}/ns"
    admin.put(f"/admin/v2/tenants/{tenant}", {"adminRoles": [], "allowedClusters": ["standalone"]})
    admin.put(f"/admin/v2/namespaces/{ns}")
    admin.post(f"/admin/v2/namespaces/{ns}/permissions/{role}", ["consume"])
    topic = f"persistent://{ns}/t"
    client = _client(secured, tokens.token(role))
    try:
        client.subscribe(topic, "anything").close()
        admin.post(f"/admin/v2/namespaces/{ns}/permissions/subscription/reserved", ["someone-else"])
        assert admin.get(f"/admin/v2/namespaces/{ns}/permissions/subscription") == {"reserved": ["someone-else"]}
        with pytest.raises(pulsar.AuthorizationError):
            client.subscribe(topic, "reserved")
        admin.post(f"/admin/v2/namespaces/{ns}/permissions/subscription/reserved", [role])
        client.subscribe(topic, "reserved").close()
        admin.delete(f"/admin/v2/namespaces/{ns}/permissions/reserved/{role}")
        with pytest.raises(pulsar.AuthorizationError):
            client.subscribe(topic, "reserved")

        admin.post(f"/admin/v2/namespaces/{ns}/subscriptionAuthMode", "Prefix")
        assert admin.get(f"/admin/v2/namespaces/{ns}/subscriptionAuthMode") == "Prefix"
        with pytest.raises(pulsar.AuthorizationError):
            client.subscribe(topic, "not-prefixed")
        client.subscribe(topic, f"{role}-mine").close()
    finally:
        client.close()


def test_schemas_are_read_and_registered_only_with_the_topics_permissions(secured, tokens, unique):
    """GET_SCHEMA needs produce or consume on the topic, GET_OR_CREATE_SCHEMA produce:
    otherwise any authenticated role could read any topic's schema or register one."""
    raw = RawClient(secured.pulsar_url)
    topic = f"persistent://public/default/schema-{unique}"
    try:
        raw.send(ev.CommandConnect.build(client_version="raw-test", protocol_version=21,
                                         auth_method_name="token",
                                         auth_data=tokens.token(f"dave-{unique}").encode()))
        assert isinstance(raw.next_event(), ev.CommandConnected)
        raw.send(ev.CommandGetSchema.build(topic=topic, request_id=1))
        got = raw.next_event().command
        assert (got.error_code, got.error_message) == (pb.AuthorizationError, "Client is not authorized to Get Schema")
        schema = pb.Schema(name="s", schema_data=b"", type=pb.Schema.String)
        raw.send(ev.CommandGetOrCreateSchema.build(topic=topic, request_id=2, schema=schema))
        got = raw.next_event().command
        assert (got.error_code, got.error_message) == (pb.AuthorizationError, "Client is not authorized to Produce")
    finally:
        raw.close()
