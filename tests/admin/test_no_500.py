"""No admin route answers bad input with a 500: every route, every method, with
malformed, wrongly typed and empty bodies and unknown names, against a real broker."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from typing import Any

import pytest

from gateway._admin_cli import AdminClient
from tests._standalone import Standalone

from .conftest import status_of

BODIES = [b"", b"{not json", b"[]", b'"text"', b"-5", b'{"x": {"y": []}}', b"null", b"1e999",
          b"[" * 100_000 + b"]" * 100_000]
HUGE = "99999999999999999999999"


def _routes() -> list[tuple[str, str]]:
    from gateway.admin import admin_routes

    class _Surface:
        """Enough of a broker to build the route table (nothing is served from it)."""

        cluster = "standalone"
        policies = None
        schemas = None
        metadata = None

    out = []
    for route in admin_routes(_Surface()):
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            if method != "HEAD":
                out.append((method, route.path))  # type: ignore[attr-defined]
    return out


def _fill(template: str, ns: str, variant: int) -> str:
    names = {
        "tenant": [ns.split("/")[0], "no-such-tenant", "bad%20name", "%00"][variant],
        "namespace": ["ns", "no-such-ns", "ns", "%00"][variant],
        "topic": ["t", "missing-topic", "t", "t"][variant],
        "subscription": ["s", "missing-sub", "s", "s"][variant],
        "cluster": ["standalone", "nowhere", "bad%20name", "%00"][variant],
        "role": ["r", "r", "r", "r"][variant],
        "key": ["k", "missing-key", "%00", "k"][variant],
        "value": ["v", "v", "%00", HUGE][variant],
        "version": ["0", "99", "x", HUGE][variant],
        "timestamp": ["0", "-1", "soon", HUGE][variant],
        "count": ["1", "-1", "many", HUGE][variant],
        "seconds": ["0", "-1", "x", HUGE][variant],
        "position": ["1", "0", "x", HUGE][variant],
        "ledger": ["0", "-1", "x", HUGE][variant],
        "entry": ["0", "-1", "x", HUGE][variant],
        "broker": ["127.0.0.1:1", "x", "x", "x"][variant],
        "configName": ["maxTopicsPerNamespace", "noSuchKey", "brokerServicePort", "%00"][variant],
        "configValue": ["0", "-1", "x", HUGE][variant],
        "vhost": ["%2F", "no-such-vhost", "bad%20name", "%00"][variant],
    }
    return re.sub(r"\{(\w+)\}", lambda m: names[m.group(1)], template)


@pytest.mark.parametrize("variant", [0, 1, 2, 3])
def test_no_route_answers_500(server: Standalone, admin: AdminClient, ns: str, variant: int) -> None:
    admin.put(f"/admin/v2/persistent/{ns}/t")
    admin.put(f"/admin/v2/persistent/{ns}/t/subscription/s")
    base = server.addresses["web"][0]
    checked = 0
    for method, template in _routes():
        if template.startswith("/metrics") or (method == "DELETE" and variant == 0):
            continue  # deleting the fixtures' own objects is not bad input
        path = _fill(template, ns, variant)
        for body in BODIES if method in ("PUT", "POST") else [b""]:
            req = urllib.request.Request(base + path, data=body or None, method=method,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    status = r.status
            except urllib.error.HTTPError as exc:
                status = exc.code
                assert b"reason" in exc.read(), (method, path, body)
            assert status < 500, (method, path, body, status)
            checked += 1
    assert checked > 100


def _send(base: str, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, object]]:
    """Status and JSON body of a request expected to fail."""
    import json

    req = urllib.request.Request(base + path, data=body, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(("method", "path"), [
    ("PUT", "/admin/v2/tenants/deep"),
    ("POST", "/admin/v2/namespaces/{ns}/retention"),
    ("PUT", "/admin/v2/persistent/{ns}/deep/partitions"),
    ("PUT", "/admin/v2/persistent/{ns}/t/subscription/deep"),
])
def test_a_deeply_nested_body_is_400(server: Standalone, ns: str, method: str, path: str) -> None:
    status, body = _send(server.addresses["web"][0], method, path.format(ns=ns), DEEP)
    assert (status, body) == (400, {"reason": "Invalid JSON body: nested too deeply"})


@pytest.mark.parametrize("path", ["/admin/v2/namespaces/%00", "/admin/v2/brokers/%00",
                                  "/admin/v2/clusters/%00", "/admin/v2/tenants/%00",
                                  "/admin/v2/brokers/%00/127.0.0.1:1/ownedNamespaces"])
def test_a_nul_in_a_name_is_412_like_any_invalid_name(server: Standalone, path: str) -> None:
    status, body = _send(server.addresses["web"][0], "GET", path)
    assert status == 412 and "\\x00" in str(body["reason"]), body



@pytest.mark.parametrize(("method", "path", "reason"), [
    ("GET", "t/ledger/-1/entry/0", "ledger must be between 0 and 9223372036854775807"),
    ("GET", f"t/ledger/{HUGE}/entry/0", "ledger must be between 0 and 9223372036854775807"),
    ("GET", f"t/ledger/1/entry/{HUGE}", "entry must be between 0 and 9223372036854775807"),
    ("GET", "t/ledger/1/entry/-1", "entry must be between 0 and 9223372036854775807"),
    ("POST", "t/subscription/s/resetcursor/-1", "timestamp must be between 0 and 9223372036854775807"),
    ("POST", f"t/subscription/s/resetcursor/{HUGE}", "timestamp must be between 0 and 9223372036854775807"),
    ("POST", f"t/subscription/s/skip/{HUGE}", "count must be between"),
    ("POST", f"t/subscription/s/expireMessages/{HUGE}", "seconds must be between"),
    ("GET", f"t/subscription/s/position/{HUGE}", "position must be between"),
    ("GET", f"t/examinemessage?messagePosition={HUGE}", "Query parameter messagePosition must be between"),
    ("GET", "t/ledger/1_0/entry/0", "ledger must be an integer"),
    ("GET", "t/ledger/%EF%BC%91/entry/0", "ledger must be an integer"),  # a full-width digit
])
def test_an_out_of_range_number_is_400(server: Standalone, admin: AdminClient, ns: str, method: str,
                                       path: str, reason: str) -> None:
    admin.put(f"/admin/v2/persistent/{ns}/t")
    admin.put(f"/admin/v2/persistent/{ns}/t/subscription/s")
    status, body = _send(server.addresses["web"][0], method, f"/admin/v2/persistent/{ns}/{path}")
    assert status == 400 and str(body["reason"]).startswith(reason), body


@pytest.mark.parametrize("path", [
    "t/subscription/s/expireMessages/9223372036854775807",
    "t/all_subscription/expireMessages/9223372036854775807",
    "t/subscription/s/resetcursor/9223372036854775807",
])
def test_the_largest_numbers_are_served(server: Standalone, admin: AdminClient, client: Any, ns: str,
                                        path: str) -> None:
    """An age older than the epoch expires nothing; a timestamp in the far future resets
    to the end: neither reaches storage as a number it cannot hold."""
    producer = client.create_producer(f"persistent://{ns}/t")
    admin.put(f"/admin/v2/persistent/{ns}/t/subscription/s")
    producer.send(b"m")
    admin.post(f"/admin/v2/persistent/{ns}/{path}")


def test_examining_past_the_first_message_answers_at_once(admin: AdminClient, client: Any, ns: str) -> None:
    producer = client.create_producer(f"persistent://{ns}/t")
    producer.send(b"m")
    status, reason = status_of(admin.get, f"/admin/v2/persistent/{ns}/t/examinemessage",
                               messagePosition=9223372036854775807)
    assert (status, reason) == (404, "No message found at position 9223372036854775807")


@pytest.mark.parametrize("body", [b'{"ledgerId": 1e300, "entryId": 0}',
                                  b'{"ledgerId": 99999999999999999999, "entryId": 1}',
                                  b'{"ledgerId": 1, "entryId": -99999999999999999999}'])
def test_an_out_of_range_message_id_body_is_400(server: Standalone, admin: AdminClient, ns: str,
                                                body: bytes) -> None:
    admin.put(f"/admin/v2/persistent/{ns}/t")
    admin.put(f"/admin/v2/persistent/{ns}/t/subscription/s")
    status, reply = _send(server.addresses["web"][0], "POST",
                          f"/admin/v2/persistent/{ns}/t/subscription/s/resetcursor", body)
    assert status == 400 and "ledgerId and entryId must be between" in str(reply["reason"]), reply
