"""MQTT 5 enhanced authentication (5.0 section 4.12) with the method ``token``: the token in
the CONNECT (paho) or asked for with Continue authentication, the refusals and their
reason codes, re-authentication, and the broker serving other clients after each refusal.
paho sends no AUTH packet, so those go from a socket and the codec (:class:`Wire`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from handlers.mqtt._codec import encode_packet
from handlers.mqtt._packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Publish,
    ReasonCode,
    Suback,
    Subscribe,
    SubscribeOption,
)
from tests._auth import Tokens
from tests._standalone import Standalone

from ._clients import WAIT, Socket, token_broker, unique, wait_until

TOKEN = "token"
CONTINUE, REAUTH = ReasonCode.CONTINUE_AUTHENTICATION, ReasonCode.RE_AUTHENTICATE


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    return Tokens(tmp_path_factory.mktemp("mqtt-key"))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, tokens: Tokens) -> Iterator[Standalone]:
    with token_broker(tmp_path_factory.mktemp("mqtt-auth"), tokens, authorization=False) as s:
        yield s


@pytest.fixture
def addr(secured: Standalone) -> tuple[str, int]:
    host, port = secured.addresses["mqtt"][0].rsplit("/", 1)[1].rsplit(":", 1)
    return host, int(port)


class Wire(Socket):
    """:class:`Socket`, and :meth:`send_unchecked`, which puts a packet on the wire past
    the codec's rules, as a client that breaks the protocol would."""

    def send_unchecked(self, packet: Packet) -> None:
        self.sock.sendall(encode_packet(packet, self.conn.version))

    def closed(self) -> bool:
        """Whether the broker closes the connection with nothing more said."""
        return self.sock.recv(65536) == b""


@pytest.fixture
def wire(addr: tuple[str, int]) -> Iterator[Any]:
    """``wire(method, data, ...)``: a :class:`Wire` that has sent its CONNECT (5.0 unless
    ``level``), and the broker's first answer; closed at the end of the test."""
    made: list[Wire] = []

    def make(method: str | None = TOKEN, data: bytes | None = None, *, level: int = 5,
             password: bytes | None = None) -> tuple[Wire, Packet]:
        w = Wire(addr)
        made.append(w)
        w.send(Connect(protocol_level=level, client_id=unique("ea"), password=password,
                       username="app" if password is not None else None,
                       properties=Properties(authentication_method=method,
                                             authentication_data=data)))
        return w, w.read()

    yield make
    for w in made:
        w.close()


def _auth(code: int, data: bytes | None = None, method: str = TOKEN) -> Auth:
    return Auth(reason_code=code, properties=Properties(authentication_method=method,
                                                        authentication_data=data))


def _ok(connack: Packet, method: str | None = TOKEN) -> None:
    assert isinstance(connack, Connack), connack
    assert connack.reason_code == 0, connack
    assert connack.properties.authentication_method == method  # MQTT-4.12.0-5, -6


def _refused(packet: Packet, cls: type, code: int) -> None:
    assert isinstance(packet, cls) and packet.reason_code == code, packet


def _serves(w: Wire, packet_id: int = 1) -> None:
    """``w`` subscribes to a topic of its own and gets back what it publishes there."""
    topic = unique("ea/t")
    w.send(Subscribe(packet_id=packet_id, subscriptions=(SubscribeOption(topic_filter=topic,
                                                                         qos=1),)))
    assert w.read() == Suback(packet_id=packet_id, reason_codes=(1,))
    w.send(Publish(topic=topic, payload=b"served", qos=1, packet_id=packet_id + 1))
    got = [w.read(), w.read()]  # the PUBACK and the delivery, in either order
    assert Puback(packet_id=packet_id + 1) in got, got
    [delivery] = [p for p in got if isinstance(p, Publish)]
    assert (delivery.topic, delivery.payload) == (topic, b"served")
    assert delivery.packet_id is not None
    w.send(Puback(packet_id=delivery.packet_id))


def _logged(s: Standalone, text: str) -> None:
    wait_until(lambda: any(text in line for line in list(s.output)))


# --------------------------------------------------------------------------- the CONNECT


def test_a_paho_client_with_its_token_in_the_connect(addr: tuple[str, int],
                                                    tokens: Tokens) -> None:
    props = PahoProperties(PacketTypes.CONNECT)
    props.AuthenticationMethod = TOKEN
    props.AuthenticationData = tokens.token("paho").encode()
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=unique("paho"),
                    protocol=mqtt.MQTTv5)
    got: dict[str, Any] = {}
    connected = threading.Event()

    def on_connect(cl: mqtt.Client, u: Any, flags: Any, rc: Any, p: Any = None) -> None:
        got.update(rc=rc.value, props=p)
        connected.set()

    c.on_connect = on_connect
    c.connect(*addr, properties=props)
    c.loop_start()
    try:
        assert connected.wait(WAIT), "no CONNACK"
        assert got["rc"] == 0
        assert got["props"].AuthenticationMethod == TOKEN
        info = c.publish(unique("ea/paho"), b"x", qos=1)
        info.wait_for_publish(WAIT)
        assert info.is_published()
    finally:
        c.loop_stop()
        c.disconnect()


@pytest.mark.parametrize("bad", ["garbage", "expired", "blank"])
def test_a_bad_token_in_the_connect_is_not_authorized(wire: Any, tokens: Tokens,
                                                      bad: str) -> None:
    data = {"garbage": b"not-a-jwt", "blank": b"",
            "expired": tokens.token("late", expires_in=-60).encode()}[bad]
    w, connack = wire(TOKEN, data)
    _refused(connack, Connack, ReasonCode.NOT_AUTHORIZED)  # 0x87, then close
    assert w.closed()
    w, connack = wire(TOKEN, tokens.token("next").encode())
    _ok(connack)
    _serves(w)


def test_without_data_the_server_asks_for_the_token(wire: Any, tokens: Tokens) -> None:
    w, first = wire(TOKEN)
    assert first == _auth(CONTINUE)  # MQTT-4.12.0-2
    w.send(_auth(CONTINUE, tokens.token("two-step").encode()))  # MQTT-4.12.0-3
    _ok(w.read())
    _serves(w)


def test_a_bad_token_in_the_answer_is_not_authorized(wire: Any) -> None:
    w, first = wire(TOKEN)
    assert first == _auth(CONTINUE)
    w.send(_auth(CONTINUE, b"not-a-jwt"))
    _refused(w.read(), Connack, ReasonCode.NOT_AUTHORIZED)  # MQTT-4.12.0-4
    assert w.closed()


def test_an_unknown_method_is_a_bad_authentication_method(wire: Any, tokens: Tokens) -> None:
    w, connack = wire("SCRAM-SHA-256", b"n,,n=user,r=nonce")
    _refused(connack, Connack, ReasonCode.BAD_AUTHENTICATION_METHOD)  # MQTT-4.12.0-1
    assert w.closed()
    w, connack = wire(TOKEN, tokens.token("after").encode())
    _ok(connack)


def test_a_user_name_and_password_still_authenticate(wire: Any, tokens: Tokens) -> None:
    w, connack = wire(None, password=tokens.token("pw").encode())
    _ok(connack, method=None)
    _serves(w)
    w, connack = wire(None, password=b"wrong")
    _refused(connack, Connack, ReasonCode.BAD_USER_NAME_OR_PASSWORD)  # 0x86, as before
    assert w.closed()


# --------------------------------------------------------------------------- protocol errors


def test_auth_without_enhanced_authentication_is_a_protocol_error(wire: Any,
                                                                  tokens: Tokens) -> None:
    w, connack = wire(None, password=tokens.token("pw").encode())
    _ok(connack, method=None)
    w.send_unchecked(_auth(REAUTH, tokens.token("pw").encode()))  # MQTT-4.12.0-7
    _refused(w.read(), Disconnect, ReasonCode.PROTOCOL_ERROR)
    assert w.closed()


def test_a_311_client_cannot_send_auth(wire: Any, tokens: Tokens) -> None:
    w, connack = wire(None, level=4, password=tokens.token("old").encode())
    assert connack == Connack()
    w.sock.sendall(b"\xf0\x00")  # AUTH exists in 5.0 only: the connection just closes
    assert w.closed()


def test_auth_naming_another_method_is_a_protocol_error(wire: Any, tokens: Tokens) -> None:
    # 5.0 section 3.15: a protocol error; before the CONNACK it says so in a CONNACK
    # (MQTT-3.14.0-1: no DISCONNECT yet), after it in a DISCONNECT
    w, first = wire(TOKEN)
    assert first == _auth(CONTINUE)
    w.send_unchecked(_auth(CONTINUE, tokens.token("x").encode(), method="other"))
    _refused(w.read(), Connack, ReasonCode.PROTOCOL_ERROR)
    assert w.closed()
    w, connack = wire(TOKEN, tokens.token("x").encode())
    _ok(connack)
    w.send_unchecked(_auth(REAUTH, tokens.token("x").encode(), method="other"))
    _refused(w.read(), Disconnect, ReasonCode.PROTOCOL_ERROR)
    assert w.closed()


def test_a_continue_the_server_did_not_ask_for_is_a_protocol_error(wire: Any,
                                                                   tokens: Tokens) -> None:
    w, connack = wire(TOKEN, tokens.token("x").encode())
    _ok(connack)
    w.send(_auth(CONTINUE, tokens.token("x").encode()))
    _refused(w.read(), Disconnect, ReasonCode.PROTOCOL_ERROR)
    assert w.closed()


# --------------------------------------------------------------------------- re-authentication


def test_re_authentication(wire: Any, tokens: Tokens, secured: Standalone) -> None:
    # 5.0 section 4.12.1: AUTH 0x19 with the new token, answered with AUTH 0x00; the
    # connection goes on as the new role
    first, second = unique("role-a"), unique("role-b")
    w, connack = wire(TOKEN, tokens.token(first).encode())
    _ok(connack)
    w.send(_auth(REAUTH, tokens.token(second).encode()))
    assert w.read() == _auth(ReasonCode.SUCCESS)
    _logged(secured, f"re-authenticated as {second}")
    _serves(w)
    # without data the server asks for it, as for a CONNECT
    third = unique("role-c")
    w.send(_auth(REAUTH))
    assert w.read() == _auth(CONTINUE)
    w.send(_auth(CONTINUE, tokens.token(third).encode()))
    assert w.read() == _auth(ReasonCode.SUCCESS)
    _logged(secured, f"re-authenticated as {third}")
    _serves(w, packet_id=10)


@pytest.mark.parametrize("bad", ["garbage", "expired"])
def test_a_failed_re_authentication_disconnects(wire: Any, tokens: Tokens, bad: str) -> None:
    bystander, connack = wire(TOKEN, tokens.token("bystander").encode())
    _ok(connack)
    w, connack = wire(TOKEN, tokens.token("a").encode())
    _ok(connack)
    data = b"not-a-jwt" if bad == "garbage" else tokens.token("a", expires_in=-60).encode()
    w.send(_auth(REAUTH, data))
    _refused(w.read(), Disconnect, ReasonCode.NOT_AUTHORIZED)  # MQTT-4.12.1-2
    assert w.closed()
    # the broker goes on serving the others, and new ones
    _serves(bystander)
    w, connack = wire(TOKEN, tokens.token("new").encode())
    _ok(connack)
    _serves(w)


# --------------------------------------------------------------------------- auth off


def test_with_authentication_off_any_token_will_do(mqtt_addr: tuple[str, int]) -> None:
    w = Wire(mqtt_addr)
    try:
        w.send(Connect(protocol_level=5, client_id=unique("open"),
                       properties=Properties(authentication_method=TOKEN,
                                             authentication_data=b"anything")))
        _ok(w.read())
        w.send(_auth(REAUTH, b"anything else"))
        assert w.read() == _auth(ReasonCode.SUCCESS)
        _serves(w)
    finally:
        w.close()
    w = Wire(mqtt_addr)
    try:
        w.send(Connect(protocol_level=5, client_id=unique("open"),
                       properties=Properties(authentication_method="SCRAM-SHA-1")))
        _refused(w.read(), Connack, ReasonCode.BAD_AUTHENTICATION_METHOD)
        assert w.closed()
    finally:
        w.close()
