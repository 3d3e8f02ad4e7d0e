"""AMQP logins with token authentication (the token is the password), and what a role
may do with authorization on: publish needs produce on the exchange's topic, consume and
get need consume on the topics the queue reads."""

from __future__ import annotations

import pika
import pika.exceptions as pex
import pytest

from gateway._admin_cli import AdminClient
from tests._auth import SUPER_USER, Tokens
from tests._standalone import Standalone
from tests.handlers.amqp.conftest import amqp_port
from tests.handlers.amqp.test_pika import get


def _connect(s: Standalone, password: str, user: str = "app") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", amqp_port(s), credentials=pika.PlainCredentials(user, password),
        connection_attempts=1))


def test_a_token_is_the_password(secured: Standalone, tokens: Tokens, unique: str) -> None:
    conn = _connect(secured, tokens.token(SUPER_USER))
    ch = conn.channel()
    q = ch.queue_declare(f"tok-{unique}").method.queue
    ch.basic_publish("", q, b"hello")
    assert get(ch, q)[2] == b"hello"
    conn.close()
    with pytest.raises(pex.ProbableAuthenticationError):
        _connect(secured, tokens.token(SUPER_USER, expires_in=-60))
    with pytest.raises(pex.ProbableAuthenticationError):
        _connect(secured, "guest", user="guest")


def test_publish_and_consume_need_the_roles_permissions(secured: Standalone, tokens: Tokens,
                                                        unique: str) -> None:
    admin = AdminClient(secured.addresses["web"][0], timeout=30, token=tokens.token(SUPER_USER))
    role = f"amqp-{unique}"
    owner = _connect(secured, tokens.token(SUPER_USER))
    och = owner.channel()
    ex, q = f"perm-{unique}", f"perm-q-{unique}"
    och.exchange_declare(ex, "fanout")
    och.queue_declare(q)
    och.queue_bind(q, ex)
    conn = _connect(secured, tokens.token(role))
    ch = conn.channel()
    ch.basic_publish(ex, "", b"refused")
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.queue_declare(q, passive=True)
    assert info.value.reply_code == 403 and f"exchange '{ex}'" in info.value.reply_text
    admin.post(f"/admin/v2/namespaces/public/default/permissions/{role}", ["produce"])
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish(ex, "", b"granted")
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.basic_get(q)
    assert info.value.reply_code == 403 and f"queue '{q}'" in info.value.reply_text
    admin.post(f"/admin/v2/namespaces/public/default/permissions/{role}", ["produce", "consume"])
    ch = conn.channel()
    assert get(ch, q)[2] == b"granted"
    conn.close()
    owner.close()
