"""No admin route answers bad input with a 500: every route, every method, with
malformed, wrongly typed and empty bodies and unknown names, against a real broker."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest

from gateway._admin_cli import AdminClient
from tests._standalone import Standalone

BODIES = [b"", b"{not json", b"[]", b'"text"', b"-5", b'{"x": {"y": []}}', b"null", b"1e999"]


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
        "tenant": [ns.split("/")[0], "no-such-tenant", "bad%20name"][variant],
        "namespace": ["ns", "no-such-ns", "ns"][variant],
        "topic": ["t", "missing-topic", "t"][variant],
        "subscription": ["s", "missing-sub", "s"][variant],
        "cluster": ["standalone", "nowhere", "bad%20name"][variant],
        "role": ["r", "r", "r"][variant],
        "version": ["0", "99", "x"][variant],
        "timestamp": ["0", "-1", "soon"][variant],
        "count": ["1", "-1", "many"][variant],
        "seconds": ["0", "-1", "x"][variant],
        "position": ["1", "0", "x"][variant],
        "ledger": ["0", "-1", "x"][variant],
        "entry": ["0", "-1", "x"][variant],
        "broker": ["127.0.0.1:1", "x", "x"][variant],
    }
    return re.sub(r"\{(\w+)\}", lambda m: names[m.group(1)], template)


@pytest.mark.parametrize("variant", [0, 1, 2])
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
