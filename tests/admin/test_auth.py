"""Token authentication and authorization of the admin REST API and of ``magnetar admin``,
``magnetar client`` and ``magnetar tokens``, as with Pulsar's."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gateway._admin_cli import AdminClient
from tests._auth import SUPER_USER
from tests._standalone import Standalone
from tests.admin.conftest import status_of


def _admin(server: Standalone, token: str | None) -> AdminClient:
    return AdminClient(server.addresses["web"][0], timeout=30, token=token)


def _magnetar(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True,
                          input=stdin, timeout=60)


def test_without_or_with_bad_token_is_401(secured, tokens):
    for token in (None, "garbage", tokens.token(SUPER_USER, expires_in=-60)):
        assert status_of(_admin(secured, token).get, "/admin/v2/tenants") == (401, "Authentication required")
    raw = urllib.request.Request(secured.addresses["web"][0] + "/admin/v2/clusters",
                                 headers={"Authorization": "Basic YWRtaW46YWRtaW4="})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(raw, timeout=30)
    assert err.value.code == 401
    assert b'"reason"' in err.value.read()


def test_superuser_administers_everything(secured, tokens, unique):
    admin = _admin(secured, tokens.token(SUPER_USER))
    admin.put(f"/admin/v2/tenants/t-{unique}", {"adminRoles": [], "allowedClusters": ["standalone"]})
    admin.put(f"/admin/v2/namespaces/t-{unique}/ns")
    assert f"t-{unique}" in admin.get("/admin/v2/tenants")
    assert admin.request("GET", "/admin/v2/brokers/health").status == 200


def test_metrics_open_and_ready_needs_only_authentication(secured, tokens):
    with urllib.request.urlopen(secured.addresses["web"][0] + "/metrics", timeout=30) as resp:
        assert resp.status == 200
    plain = _admin(secured, tokens.token("someone"))
    assert plain.request("GET", "/admin/v2/brokers/ready").status == 200
    assert plain.get("/admin/v2/clusters") == ["standalone"]
    assert status_of(_admin(secured, None).request, "GET", "/admin/v2/brokers/ready")[0] == 401


def test_plain_role_needs_super_user_or_tenant_admin(secured, tokens, unique):
    admin = _admin(secured, tokens.token(SUPER_USER))
    owner = f"owner-{unique}"
    admin.put(f"/admin/v2/tenants/mine-{unique}", {"adminRoles": [owner], "allowedClusters": ["standalone"]})
    plain = _admin(secured, tokens.token(owner))
    assert status_of(plain.put, f"/admin/v2/tenants/other-{unique}",
                     {"adminRoles": [], "allowedClusters": ["standalone"]}) == \
        (401, "This operation requires super-user access")
    assert status_of(plain.get, "/admin/v2/brokers/health") == (401, "This operation requires super-user access")
    # its own tenant: namespaces, topics, permissions
    plain.put(f"/admin/v2/namespaces/mine-{unique}/ns")
    plain.put(f"/admin/v2/persistent/mine-{unique}/ns/t")
    plain.post(f"/admin/v2/namespaces/mine-{unique}/ns/permissions/reader", ["consume"])
    assert plain.get(f"/admin/v2/namespaces/mine-{unique}/ns/permissions") == {"reader": ["consume"]}
    assert plain.get(f"/admin/v2/tenants/mine-{unique}")["adminRoles"] == [owner]
    # not another's
    for call in (lambda: plain.get("/admin/v2/namespaces/public"),
                 lambda: plain.put(f"/admin/v2/namespaces/public/ns-{unique}"),
                 lambda: plain.get("/admin/v2/persistent/public/default")):
        assert status_of(call) == (401, "Don't have permission to administrate resources on this tenant")


def test_admin_cli_sends_the_token(secured, tokens, tmp_path):
    url = secured.addresses["web"][0]
    token = tokens.token(SUPER_USER)
    refused = _magnetar("admin", "--admin-url", url, "tenants", "list")
    assert refused.returncode == 1
    assert "Authentication required (HTTP 401)" in refused.stderr
    plugin = ["--auth-plugin", "org.apache.pulsar.client.impl.auth.AuthenticationToken"]
    ok = _magnetar("admin", "--admin-url", url, *plugin, "--auth-params", f"token:{token}", "tenants", "list")
    assert ok.returncode == 0, ok.stderr
    assert "public" in ok.stdout.split()
    token_file = tmp_path / "token.txt"
    token_file.write_text(token + "\n")
    ok = _magnetar("admin", "--admin-url", url, *plugin, "--auth-params", f"file://{token_file}",
                   "namespaces", "list", "public")
    assert ok.returncode == 0, ok.stderr
    assert "public/default" in ok.stdout.split()
    other = _magnetar("admin", "--admin-url", url, "--auth-plugin", "org.apache.pulsar.client.impl.auth.AuthenticationTls",
                      "--auth-params", "x", "tenants", "list")
    assert other.returncode == 2
    assert "only token authentication" in other.stderr


def test_client_cli_sends_the_token(secured, tokens, unique):
    url = secured.pulsar_url
    auth = ["--auth-plugin", "org.apache.pulsar.client.impl.auth.AuthenticationToken",
            "--auth-params", f"token:{tokens.token(SUPER_USER)}"]
    produced = _magnetar("client", "--url", url, *auth, "produce", f"cli-{unique}", "-m", "hello")
    assert produced.returncode == 0, produced.stderr
    consumed = _magnetar("client", "--url", url, *auth, "consume", f"cli-{unique}", "-s", "s",
                         "-p", "Earliest", "-n", "1", "--timeout", "10")
    assert consumed.returncode == 0, consumed.stderr
    assert "content:hello" in consumed.stdout


def test_tokens_cli_round_trip_with_secret_key(tmp_path):
    key = tmp_path / "secret.key"
    assert _magnetar("tokens", "create-secret-key", "--output", str(key)).returncode == 0
    assert len(key.read_bytes()) == 32
    made = _magnetar("tokens", "create", "--secret-key", f"file://{key}", "--subject", "alice",
                     "--expiry-time", "1y")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    shown = _magnetar("tokens", "show", token)
    assert shown.stdout.splitlines()[0] == '{"alg":"HS256","typ":"JWT"}'
    assert '"sub":"alice"' in shown.stdout
    valid = _magnetar("tokens", "validate", "-sk", f"file://{key}", token)
    assert valid.returncode == 0, valid.stderr
    other = tmp_path / "other.key"
    _magnetar("tokens", "create-secret-key", "--output", str(other))
    invalid = _magnetar("tokens", "validate", "-sk", f"file://{other}", token)
    assert invalid.returncode == 1
    assert "Signature verification failed" in invalid.stderr
    b64 = _magnetar("tokens", "create-secret-key", "--base64").stdout.strip()
    made = _magnetar("tokens", "create", "--secret-key", f"data:;base64,{b64}", "--subject", "bob")
    assert _magnetar("tokens", "validate", "-sk", b64, made.stdout.strip()).returncode == 0


def test_key_pair_tokens_authenticate_with_a_public_key_broker(tmp_path, unique):
    private, public = tmp_path / "private.key", tmp_path / "public.key"
    made = _magnetar("tokens", "create-key-pair", "--output-private-key", str(private),
                     "--output-public-key", str(public))
    assert made.returncode == 0, made.stderr
    token = _magnetar("tokens", "create", "--private-key", f"file://{private}", "--subject",
                      SUPER_USER).stdout.strip()
    assert _magnetar("tokens", "validate", "-pk", f"file://{public}", token).returncode == 0
    conf = {"authenticationEnabled": True, "tokenPublicKey": f"file://{public}",
            "superUserRoles": SUPER_USER, "authorizationEnabled": True}
    with Standalone(tmp_path / "data", conf=conf) as server:
        assert "public" in _admin(server, token).get("/admin/v2/tenants")
        assert status_of(_admin(server, None).get, "/admin/v2/tenants")[0] == 401


@pytest.mark.parametrize(("conf", "message"), [
    ({"authenticationEnabled": "true"}, "set tokenSecretKey or tokenPublicKey"),
    ({"authenticationEnabled": "true", "tokenSecretKey": "file:///nonexistent/key"}, "cannot read"),
    ({"authenticationEnabled": "true", "tokenSecretKey": "c2hvcnQ="}, "needs at least 256"),
    ({"authenticationEnabled": "true", "tokenSecretKey": "data:;base64,c2hvcnQ=",
      "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderTls"},
     "only token authentication"),
    ({"authorizationEnabled": "true"}, "needs authenticationEnabled"),
])
def test_broker_refuses_to_start_with_unusable_authentication(tmp_path: Path, conf, message):
    args = ["standalone", "--data-dir", str(tmp_path)]
    for k, v in conf.items():
        args += ["-c", f"{k}={v}"]
    done = _magnetar(*args)
    assert done.returncode == 2
    assert message in done.stderr


def test_admin_cli_grants_and_revokes_topic_permissions(secured, tokens, unique):
    base = ["admin", "--admin-url", secured.addresses["web"][0],
            "--auth-params", f"token:{tokens.token(SUPER_USER)}", "topics"]
    topic = f"persistent://public/default/cli-perm-{unique}"
    granted = _magnetar(*base, "grant-permission", topic, "--role", f"r-{unique}", "--actions", "produce,consume")
    assert granted.returncode == 0, granted.stderr
    shown = _magnetar(*base, "permissions", topic)
    assert json.loads(shown.stdout)[f"r-{unique}"] == ["consume", "produce"]
    assert _magnetar(*base, "revoke-permission", topic, "--role", f"r-{unique}").returncode == 0
    assert f"r-{unique}" not in json.loads(_magnetar(*base, "permissions", topic).stdout)


def test_authenticated_metrics_endpoint_needs_a_super_user(tmp_path, tokens):
    with Standalone(tmp_path, conf=tokens.conf(authenticateMetricsEndpoint=True)) as server:
        metrics = server.addresses["web"][0] + "/metrics"
        for token, status in ((None, 401), ("someone", 401), (SUPER_USER, 200)):
            headers = {"Authorization": f"Bearer {tokens.token(token)}"} if token else {}
            try:
                with urllib.request.urlopen(urllib.request.Request(metrics, headers=headers), timeout=30) as resp:
                    got = resp.status
            except urllib.error.HTTPError as exc:
                got = exc.code
            assert got == status, token


@pytest.mark.parametrize("header", ["Bearer", "Bearer ", "Bearer a.b.c", "Bearer é.é.é", "bearer x",
                                    "Bearer " + "x" * 10000, "Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhZG1pbiJ9."])
def test_malformed_authorization_headers_are_401_never_500(secured, header):
    request = urllib.request.Request(secured.addresses["web"][0] + "/admin/v2/tenants",
                                     headers={"Authorization": header})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=30)
    assert err.value.code == 401


def test_tenant_paths_with_impossible_names_are_refused_not_500(secured, tokens):
    plain = _admin(secured, tokens.token("someone"))
    for path in ("/admin/v2/namespaces/%00bad", "/admin/v2/persistent/a%2Fb/ns/t", "/admin/v2/tenants/%20"):
        status, _ = status_of(plain.get, path)
        assert status == 401, path


def test_admin_cli_subscription_permissions_and_auth_mode(secured, tokens):
    base = ["admin", "--admin-url", secured.addresses["web"][0],
            "--auth-params", f"token:{tokens.token(SUPER_USER)}", "namespaces"]
    ns = "public/default"
    done = _magnetar(*base, "grant-subscription-permission", ns, "--subscription", "cli-sub",
                     "--roles", "r1,r2")
    assert done.returncode == 0, done.stderr
    assert _magnetar(*base, "revoke-subscription-permission", ns, "--subscription", "cli-sub",
                     "--role", "r1").returncode == 0
    admin = _admin(secured, tokens.token(SUPER_USER))
    assert admin.get(f"/admin/v2/namespaces/{ns}/permissions/subscription")["cli-sub"] == ["r2"]
    assert _magnetar(*base, "set-subscription-auth-mode", ns, "-m", "Prefix").returncode == 0
    assert _magnetar(*base, "get-subscription-auth-mode", ns).stdout.strip() == "Prefix"
    assert _magnetar(*base, "set-subscription-auth-mode", ns, "-m", "None").returncode == 0


def test_a_role_that_may_use_a_topic_may_read_its_stats_not_administer_it(secured, tokens, unique):
    admin = _admin(secured, tokens.token(SUPER_USER))
    topic = f"/admin/v2/persistent/public/default/readable-{unique}"
    admin.put(topic)
    reader, stranger = f"reader-{unique}", f"stranger-{unique}"
    admin.post(f"/admin/v2/persistent/public/default/readable-{unique}/permissions/{reader}", ["consume"])
    plain = _admin(secured, tokens.token(reader))
    assert "msgRateIn" in plain.get(f"{topic}/stats")
    assert plain.get(f"{topic}/subscriptions") == []
    assert status_of(plain.delete, topic) == (401, "Don't have permission to administrate resources on this tenant")
    assert status_of(plain.get, "/admin/v2/persistent/public/default/other/stats")[0] == 401
    assert status_of(_admin(secured, tokens.token(stranger)).get, f"{topic}/stats")[0] == 401


def test_an_http_lookup_needs_produce_or_consume_on_the_topic(secured, tokens, unique):
    admin = _admin(secured, tokens.token(SUPER_USER))
    admin.put(f"/admin/v2/persistent/public/default/looked-up-{unique}")
    admin.post(f"/admin/v2/persistent/public/default/looked-up-{unique}/permissions/user-{unique}", ["produce"])
    lookup = f"/lookup/v2/topic/persistent/public/default/looked-up-{unique}"
    assert _admin(secured, tokens.token(f"user-{unique}")).get(lookup)["brokerUrl"].startswith("pulsar://")
    assert status_of(_admin(secured, tokens.token(f"other-{unique}")).get, lookup) == \
        (401, "Client is not authorized to Lookup")
