"""Pure logic of issue 17's authentication and authorization: key values,
tokens, the token provider, metadata parsing, the client's auth params, the
permission decisions and the security config keys."""
from __future__ import annotations

import base64
import time

import pytest

from broker.config import BrokerConfig
from broker.security.authorization import (admin_rule, check_actions, subscription_allows, topic_actions)
from client.auth import AuthenticationToken, authentication_from_params
from client.errors import AuthenticationError, InvalidConfiguration
from proto.auth_server import AuthenticationProviderToken, AuthenticationService, token_from_metadata
from proto.auth_tokens import (TokenError, create_key_pair, create_secret_key, create_token, decode_unverified,
                               parse_relative_time, read_key_value, validate_token)
from proto.topic_name import TopicName


def test_key_values_as_pulsar(tmp_path):
    key = create_secret_key()
    path = tmp_path / "k"
    path.write_bytes(key)
    assert read_key_value(f"file://{path}") == key
    assert read_key_value("data:;base64," + base64.b64encode(key).decode()) == key
    for bad in ("", "/just/a/path", "data:;base64,@@@", f"file://{tmp_path}/missing", "file://host/x"):
        with pytest.raises(TokenError):
            read_key_value(bad)


def test_relative_times():
    assert parse_relative_time("1h") == 3600 and parse_relative_time("30m") == 1800
    assert parse_relative_time("2d") == 172800 and parse_relative_time("45") == 45
    for bad in ("0s", "-1h", "1x", "h", ""):
        with pytest.raises(TokenError):
            parse_relative_time(bad)


def test_tokens_sign_verify_and_every_refusal():
    secret = create_secret_key()
    token = create_token(secret, "alice", "HS256", expiry_seconds=60)
    assert validate_token(token, secret, ("HS256",))["sub"] == "alice"
    assert decode_unverified(token)[1]["sub"] == "alice"
    with pytest.raises(TokenError, match="expired"):
        validate_token(create_token(secret, "a", "HS256", 10, now=time.time() - 100), secret, ("HS256",))
    with pytest.raises(TokenError, match="signature"):
        validate_token(token, create_secret_key(), ("HS256",))
    with pytest.raises(TokenError, match="not a JWT"):
        validate_token("abc", secret, ("HS256",))
    private, public = create_key_pair()
    from proto.auth_tokens import load_public_key
    rs = create_token(private, "bob", "RS256")
    assert validate_token(rs, load_public_key(public), ("RS256",))["sub"] == "bob"
    with pytest.raises(TokenError, match="RS256"):
        validate_token(rs, secret, ("HS256",))
    with pytest.raises(TokenError, match="subject"):
        create_token(secret, "", "HS256")


def test_provider_and_service_cache_and_expiry(tmp_path):
    secret = create_secret_key()
    url = "data:;base64," + base64.b64encode(secret).decode()
    with pytest.raises(TokenError):
        AuthenticationProviderToken()                       # no key
    service = AuthenticationService([AuthenticationProviderToken(token_secret_key=url)])
    token = create_token(secret, "alice", "HS256", 5)
    who = service.authenticate([("authorization", f"Bearer {token}")])
    assert who.role == "alice" and who.expires_at is not None and not who.expired()
    assert service.authenticate([("authorization", f"Bearer {token}")]) is who        # cached
    assert who.expired(who.expires_at) and not who.expired(who.expires_at - 1)
    short = create_token(secret, "alice", "HS256", 1)
    first = service.authenticate([("authorization", f"Bearer {short}")])
    time.sleep(max(0.0, first.expires_at - time.time()) + 0.05)
    with pytest.raises(AuthenticationError, match="expired"):                        # cached, still checked
        service.authenticate([("authorization", f"Bearer {short}")])
    with pytest.raises(AuthenticationError, match="no credentials"):
        service.authenticate([])
    with pytest.raises(AuthenticationError, match="Bearer"):
        token_from_metadata([("authorization", "Basic abc")])


def test_client_auth_params():
    assert authentication_from_params(None, None) is None
    auth = authentication_from_params("token", "token:abc")
    assert auth.auth_metadata() == [("authorization", "Bearer abc")]
    assert authentication_from_params(None, '{"token": "xyz"}').token() == "xyz"
    for plugin, params in (("kerberos", "token:a"), (None, "password:x"), ("token", None), (None, "{bad")):
        with pytest.raises(InvalidConfiguration):
            authentication_from_params(plugin, params)
    with pytest.raises(InvalidConfiguration):
        AuthenticationToken("")
    calls = iter(["t1", "t2"])
    supplier = AuthenticationToken(lambda: next(calls))
    assert supplier.token() == "t1" and supplier.token() == "t2"     # asked again each call


def test_token_file_is_read_again_when_it_changes(tmp_path):
    path = tmp_path / "token"
    path.write_text("first\n")
    auth = authentication_from_params(None, f"file://{path}")
    assert auth.token() == "first"
    path.write_text("second-token\n")
    assert auth.token() == "second-token"


def test_permission_decisions():
    tn = TopicName.get("persistent://t/ns/topic-partition-1")
    auth = {"namespace_auth": {"r": ["consume"]},
            "destination_auth": {"persistent://t/ns/topic": {"w": ["produce"]}},
            "subscription_auth_roles": {"audit": ["auditor"]}}
    assert topic_actions(auth, tn, "r") == {"consume"}
    assert topic_actions(auth, tn, "w") == {"produce"}           # a partition inherits its topic's grant
    assert topic_actions(auth, tn, "x") == set()
    assert subscription_allows(auth, "audit", "auditor") and not subscription_allows(auth, "audit", "r")
    assert subscription_allows(auth, "other", "r") and subscription_allows(auth, None, "r")
    assert check_actions("produce,consume,functions") == ["consume", "functions", "produce"]
    for bad in ([], "delete", ["produce", 5]):
        with pytest.raises(ValueError):
            check_actions(bad)
    assert admin_rule("clusters.create")[0] == "superuser"
    assert admin_rule("namespaces.set_retention") == ("tenant-admin", "namespace")
    assert admin_rule("topics.stats") == ("lookup", "topic")
    assert admin_rule("no.such.verb")[0] == "superuser"


def test_security_config_keys(tmp_path):
    key = tmp_path / "k"
    key.write_bytes(create_secret_key())
    ok, problems = BrokerConfig.parse({"authentication_enabled": True, "authorization_enabled": True,
                                       "token_secret_key": f"file://{key}", "superuser_roles": ["admin"]})
    assert problems == [] and ok.superuser_roles == ["admin"]
    _, problems = BrokerConfig.parse({"authorization_enabled": True})
    assert any("needs authentication_enabled" in p for p in problems)
    _, problems = BrokerConfig.parse({"authentication_enabled": True})
    assert any("token_secret_key" in p for p in problems)
    _, problems = BrokerConfig.parse({"authentication_enabled": True, "token_secret_key": "file:///nope"})
    assert any("cannot read key file" in p for p in problems)
    _, problems = BrokerConfig.parse({"broker_client_authentication_parameters": "password:x"})
    assert any("broker_client_authentication_parameters" in p for p in problems)
    assert BrokerConfig().authentication_enabled is False and BrokerConfig().authorization_enabled is False
