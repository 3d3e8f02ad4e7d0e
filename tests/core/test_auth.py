"""core.auth without a broker: keys read as Pulsar reads them, tokens verified as
Pulsar's AuthenticationProviderToken verifies them, and the service's configuration."""

from __future__ import annotations

import base64

import pytest

from core.auth import (
    AuthConfigError,
    AuthenticationError,
    AuthService,
    TokenVerifier,
    create_key_pair,
    create_secret_key,
    create_token,
    parse_relative_time,
    read_key,
)


def test_keys_are_read_from_files_data_urls_and_base64(tmp_path, monkeypatch):
    key = create_secret_key()
    path = tmp_path / "k"
    path.write_bytes(key)
    encoded = base64.b64encode(key).decode()
    monkeypatch.setenv("MY_KEY", "raw-text")
    assert read_key(f"file://{path}") == key
    assert read_key(f"data:;base64,{encoded}") == key
    assert read_key(encoded) == key
    assert read_key("env:MY_KEY") == b"raw-text"
    for bad in ("file:///nonexistent", "not base64!", "data:no-comma", "env:NOT_SET_ANYWHERE"):
        with pytest.raises(ValueError):
            read_key(bad)


def test_role_claim_audience_and_expiry():
    key = create_secret_key("HS512")
    verifier = TokenVerifier(secret_key=key, role_claim="role", audience_claim="aud", audience="b1")
    good = create_token(key, "ignored", algorithm="HS512", claims={"role": "alice", "aud": ["b0", "b1"]})
    assert verifier.verify(good).role == "alice"
    for claims, why in (({"role": "alice", "aud": "b2"}, "not contains this broker"),
                        ({"role": "alice"}, "Found null Audience"),
                        ({"aud": "b1"}, "no role")):
        with pytest.raises(AuthenticationError, match=why):
            verifier.verify(create_token(key, "x", algorithm="HS512", claims=claims))
    expiring = create_token(key, "x", algorithm="HS512", expires_in=60, claims={"role": "a", "aud": "b1"})
    assert verifier.verify(expiring).expires_at is not None
    with pytest.raises(AuthenticationError, match="expired"):
        verifier.verify(create_token(key, "x", algorithm="HS512", expires_in=-1,
                                     claims={"role": "a", "aud": "b1"}))


def test_public_keys_verify_their_family_only():
    rsa_private, rsa_public = create_key_pair("RS256")
    ec_private, ec_public = create_key_pair("ES256")
    assert TokenVerifier(public_key=rsa_public, public_alg="RS256").verify(
        create_token(rsa_private, "r", private_key=True)).role == "r"
    assert TokenVerifier(public_key=ec_public, public_alg="ES256").verify(
        create_token(ec_private, "e", private_key=True)).role == "e"
    with pytest.raises(ValueError, match="tokenPublicAlg"):
        TokenVerifier(public_key=ec_public, public_alg="RS256")
    with pytest.raises(AuthenticationError):
        TokenVerifier(public_key=rsa_public).verify(create_token(ec_private, "e", private_key=True))
    with pytest.raises(ValueError):  # a public key is no HMAC secret
        create_token(rsa_public, "x")


def test_short_secret_keys_are_refused():
    with pytest.raises(ValueError, match="at least 256"):
        TokenVerifier(secret_key=b"short")


def test_relative_times():
    assert [parse_relative_time(t) for t in ("30", "30s", "5m", "2h", "1d", "1w", "1y")] == \
        [30, 30, 300, 7200, 86400, 604800, 31536000]
    with pytest.raises(ValueError):
        parse_relative_time("soon")


def test_service_configuration_is_checked():
    key = base64.b64encode(create_secret_key()).decode()
    service = AuthService({"authenticationEnabled": True, "tokenSecretKey": key,
                           "superUserRoles": "a, b", "authorizationEnabled": True}, None)
    assert service.super_users == {"a", "b"}
    assert service.authenticate("token", create_token(base64.b64decode(key), "x")).role == "x"
    with pytest.raises(AuthenticationError, match="Unsupported authentication mode"):
        service.authenticate(None, None)
    for conf, why in (({"authorizationEnabled": True}, "needs authenticationEnabled"),
                      ({"authenticationEnabled": True}, "set tokenSecretKey"),
                      ({"authenticationEnabled": True, "tokenSecretKey": key,
                        "authenticationProviders": "x.Y"}, "only token authentication"),
                      ({"authenticationEnabled": True, "tokenSecretKey": key,
                        "tokenAudienceClaim": "aud"}, "tokenAudience")):
        with pytest.raises(AuthConfigError, match=why):
            AuthService(conf, None)
    assert AuthService({}, None).authentication_enabled is False
