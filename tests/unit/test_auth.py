"""The pure part of resume authorization (DESIGN D8): credentials, bindings, decisions."""

from __future__ import annotations

import json
import time

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jwt.algorithms import RSAAlgorithm

from mcp_sse_gateway import auth
from mcp_sse_gateway.config import AuthSettings
from mcp_sse_gateway.headers import upstream_request_headers

KEY = b"k" * 32
NOW = 1_800_000_000.0


def _reader(**values) -> auth.CredentialReader:
    return auth.CredentialReader(AuthSettings(**values), KEY)


def _bearer(token: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {token}")]


def _jwt(sub: str, *, iss: str = "https://issuer", exp: float = NOW + 3600, **extra) -> str:
    return jwt.encode({"iss": iss, "sub": sub, "exp": int(exp), **extra}, "s" * 32, "HS256")


def test_digest_is_keyed_and_never_the_credential():
    token = "secret-token-value"
    presented = _reader().presented(_bearer(token), trusted_peer=False)
    assert token not in presented.digest
    assert len(presented.digest) == 64
    other_key = auth.CredentialReader(AuthSettings(), b"x" * 32)
    assert other_key.presented(_bearer(token), trusted_peer=False).digest != presented.digest
    assert token not in presented.binding(NOW).encode()


def test_only_configured_headers_and_cookies_count():
    reader = _reader(credential_headers=("authorization", "x-api-key"), credential_cookies=("sid",))
    base = reader.presented([("Cookie", "sid=1; theme=dark")], trusted_peer=False)
    assert reader.presented([("Cookie", "theme=light; sid=1")], trusted_peer=False) == base
    assert reader.presented([("Cookie", "sid=2; theme=dark")], trusted_peer=False) != base
    with_key = reader.presented([("Cookie", "sid=1"), ("X-Api-Key", "k")], trusted_peer=False)
    assert with_key != base
    # Headers not configured never change the digest.
    assert reader.presented([("Cookie", "sid=1"), ("X-Other", "v")], trusted_peer=False) == base
    # Cookies are ignored unless named.
    plain = _reader()
    assert plain.presented([("Cookie", "sid=1")], trusted_peer=False) == plain.presented(
        [], trusted_peer=False
    )


def test_jwt_claims_give_principal_and_expiry():
    reader = _reader()
    a1 = reader.presented(_bearer(_jwt("alice", jti="1")), trusted_peer=False)
    a2 = reader.presented(_bearer(_jwt("alice", jti="2")), trusted_peer=False)
    bob = reader.presented(_bearer(_jwt("bob")), trusted_peer=False)
    other_issuer = reader.presented(_bearer(_jwt("alice", iss="https://evil")), trusted_peer=False)
    assert a1.is_jwt
    assert a1.expires_at == int(NOW + 3600)
    assert a1.digest != a2.digest
    assert a1.principal == a2.principal
    assert a1.principal not in {bob.principal, other_issuer.principal}
    assert not a1.principal_verified
    opaque = reader.presented(_bearer("not.a-jwt"), trusted_peer=False)
    assert (opaque.is_jwt, opaque.principal) == (False, None)


def test_principal_header_counts_only_from_a_trusted_proxy():
    reader = _reader(resume="principal", principal_header="X-User")
    headers = [("X-User", "alice")]
    trusted = reader.presented(headers, trusted_peer=True)
    assert trusted.principal_verified
    assert trusted.principal is not None
    untrusted = reader.presented(headers, trusted_peer=False)
    assert untrusted.principal is None
    forwarded = upstream_request_headers(
        [*headers, ("Authorization", "Bearer t")],
        mcp_endpoint=True,
        peer="203.0.113.9",
        scheme="http",
        host="gw",
        trusted_peer=False,
        drop_names=frozenset({"x-user"}),
    )
    assert "x-user" not in {name.lower() for name, _ in forwarded}
    assert ("Authorization", "Bearer t") in forwarded


def test_jwks_verified_jwt_needs_no_probe(tmp_path):
    from cryptography.hazmat.primitives.asymmetric import rsa

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(private.public_key()))
    jwk.update(kid="k1", alg="RS256", use="sig")
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk]}))
    settings_ = AuthSettings(resume="principal", jwks_file=path, jwt_audience="mcp")
    reader = auth.CredentialReader(settings_, KEY, auth.load_jwks(settings_))

    def token(sub: str, **claims) -> str:
        body = {"iss": "i", "sub": sub, "aud": "mcp", "exp": int(time.time()) + 60, **claims}
        return jwt.encode(body, private, "RS256", headers={"kid": "k1"})

    good = reader.presented(_bearer(token("alice")), trusted_peer=False)
    assert good.principal_verified
    wrong_aud = reader.presented(_bearer(token("alice", aud="other")), trusted_peer=False)
    assert not wrong_aud.principal_verified
    forged = jwt.encode({"iss": "i", "sub": "alice", "aud": "mcp", "exp": 9e9}, "x" * 32, "HS256")
    assert not reader.presented(_bearer(forged), trusted_peer=False).principal_verified
    binding = good.binding(time.time())
    refreshed = reader.presented(_bearer(token("alice", jti="2")), trusted_peer=False)
    bob = reader.presented(_bearer(token("bob")), trusted_peer=False)
    now = time.time()
    assert auth.decide(settings_, binding, refreshed, now=now).verdict is auth.Verdict.SERVE
    assert auth.decide(settings_, binding, bob, now=now).verdict is auth.Verdict.REFUSE


@given(
    credentials=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    principal=st.one_of(
        st.just(""), st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
    ),
    accepted_ms=st.integers(min_value=0, max_value=2**45),
    exp=st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)),
)
@settings(max_examples=200, derandomize=True)
def test_binding_round_trips(credentials, principal, accepted_ms, exp):
    binding = auth.Binding(credentials, principal, accepted_ms / 1000, exp)
    encoded = binding.encode()
    assert encoded.isascii()
    assert "\n" not in encoded
    decoded = auth.Binding.decode(encoded)
    assert decoded is not None
    assert (decoded.credentials, decoded.principal, decoded.expires_at) == (
        credentials,
        principal,
        exp,
    )
    assert abs(decoded.accepted_at - binding.accepted_at) < 0.001


@pytest.mark.parametrize(
    "value", ["", "a0.x.y.1.-", "a1.short..1.-", "a1." + "c" * 64 + "..notanumber.-", "garbage"]
)
def test_malformed_bindings_decode_to_none(value):
    assert auth.Binding.decode(value) is None


def _decide(binding, presented, *, now=NOW, cached_until=None, **values):
    return auth.decide(
        AuthSettings(**values), binding, presented, now=now, cached_until=cached_until
    )


def test_decisions_for_the_creator_and_others():
    reader = _reader()
    creator = reader.presented(_bearer("alice-1"), trusted_peer=False)
    other = reader.presented(_bearer("bob-1"), trusted_peer=False)
    binding = creator.binding(NOW)
    assert _decide(binding, creator).reason == "creator"
    # Past the recheck window, the creator is asked about too.
    assert _decide(binding, creator, now=NOW + 61).verdict is auth.Verdict.PROBE
    assert _decide(binding, creator, recheck_s=0).verdict is auth.Verdict.PROBE
    assert _decide(binding, other).verdict is auth.Verdict.PROBE
    assert _decide(binding, other, cached_until=NOW + 1).reason == "cached"
    assert _decide(binding, other, cached_until=NOW).verdict is auth.Verdict.PROBE
    assert _decide(binding, other, bind="creator").reason == "creator_only"
    assert _decide(binding, creator, resume="none").verdict is auth.Verdict.SERVE
    assert _decide(binding, other, resume="none").verdict is auth.Verdict.SERVE
    # No binding at all (a session the gateway has no record of): always asked.
    assert _decide(None, creator).verdict is auth.Verdict.PROBE
    assert _decide(None, creator, bind="creator").verdict is auth.Verdict.PROBE


def test_an_expired_jwt_is_never_served_from_the_store():
    reader = _reader()
    token = reader.presented(_bearer(_jwt("alice", exp=NOW + 10)), trusted_peer=False)
    binding = token.binding(NOW)
    assert _decide(binding, token).verdict is auth.Verdict.SERVE
    assert _decide(binding, token, now=NOW + 10).verdict is auth.Verdict.PROBE
    assert _decide(binding, token, now=NOW + 5, cached_until=NOW + 60).reason == "creator"
    assert auth.cache_until(AuthSettings(), token, NOW) == NOW + 10


def test_after_a_probe_jwts_must_share_the_principal():
    reader = _reader()
    alice = reader.presented(_bearer(_jwt("alice", jti="1")), trusted_peer=False)
    refreshed = reader.presented(_bearer(_jwt("alice", jti="2")), trusted_peer=False)
    bob = reader.presented(_bearer(_jwt("bob")), trusted_peer=False)
    opaque = reader.presented(_bearer("opaque"), trusted_peer=False)
    binding = alice.binding(NOW)
    upstream = AuthSettings()
    assert auth.accept_after_probe(upstream, binding, refreshed).verdict is auth.Verdict.SERVE
    assert auth.accept_after_probe(upstream, binding, bob).verdict is auth.Verdict.REFUSE
    # Not two JWTs: the upstream's acceptance is all there is to go on (SECURITY.md).
    assert auth.accept_after_probe(upstream, binding, opaque).verdict is auth.Verdict.SERVE
    principal = AuthSettings(resume="principal")
    assert auth.accept_after_probe(principal, binding, opaque).verdict is auth.Verdict.REFUSE
    assert auth.accept_after_probe(principal, binding, refreshed).verdict is auth.Verdict.SERVE


def test_only_the_creator_may_end_a_session():
    reader = _reader()
    alice = reader.presented(_bearer(_jwt("alice", jti="1")), trusted_peer=False)
    binding = alice.binding(NOW)
    refreshed = reader.presented(_bearer(_jwt("alice", jti="2")), trusted_peer=False)
    assert auth.is_creator(binding, alice)
    # Unverified claims never end a session: a forged token could name anyone.
    assert not auth.is_creator(binding, refreshed)
    assert not auth.is_creator(binding, reader.presented(_bearer(_jwt("bob")), trusted_peer=False))
    assert not auth.is_creator(binding, reader.presented([], trusted_peer=False))
    assert not auth.is_creator(None, alice)
    proxy = _reader(resume="principal", principal_header="X-User")
    creator = proxy.presented([("X-User", "alice"), *_bearer("t1")], trusted_peer=True)
    again = proxy.presented([("X-User", "alice"), *_bearer("t2")], trusted_peer=True)
    assert auth.is_creator(creator.binding(NOW), again)  # a verified principal does


def test_no_credentials_are_nobodys():
    """A request without credentials is never taken for a creator without them."""
    reader = _reader()
    nobody = reader.presented([], trusted_peer=False)
    assert nobody.anonymous
    binding = nobody.binding(NOW)
    assert _decide(binding, nobody).verdict is auth.Verdict.PROBE
    assert not auth.is_creator(binding, nobody)
    # An API key the configuration does not name is no credential to the gateway either.
    assert reader.presented([("X-Api-Key", "k")], trusted_peer=False).anonymous
    # The MCP endpoint's query string counts (access_token=...).
    with_query = reader.presented([], trusted_peer=False, query="access_token=abc")
    assert not with_query.anonymous
    assert with_query.digest != reader.presented([], trusted_peer=False, query="x=1").digest


@pytest.mark.parametrize(
    "cookie", ['prefs={"theme":"dark"}; session=alice-1', "cart=a b; session=alice-1"]
)
def test_cookies_a_strict_parser_drops_still_count(cookie):
    reader = _reader(credential_cookies=("session",))
    presented = reader.presented([("Cookie", cookie)], trusted_peer=False)
    assert not presented.anonymous
    assert presented == reader.presented([("Cookie", "session=alice-1")], trusted_peer=False)
    assert presented != reader.presented([("Cookie", "session=bob")], trusted_peer=False)


@pytest.mark.parametrize(
    ("exp", "expected"),
    [
        (None, None),
        (NOW + 10, NOW + 10),
        (str(int(NOW + 10)), NOW + 10),  # PyJWT reads int(exp): digits in a string pass
        ("soon", 0.0),
        (1e999, 0.0),
        (float("nan"), 0.0),
        (10**400, 0.0),
        ([1], 0.0),
    ],
)
def test_exp_claims_are_read_as_the_upstream_reads_them(exp, expected):
    claims = {"iss": "i", "sub": "alice"}
    if exp is not None:
        claims["exp"] = exp
    token = jwt.encode(claims, "s" * 32, "HS256") if exp != 10**400 else None
    if token is None:  # PyJWT will not encode it; forge the payload by hand
        import base64

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        payload = b'{"iss":"i","sub":"alice","exp":' + str(exp).encode() + b"}"
        header = b64(b'{"alg":"HS256"}')
        token = f"{header}.{b64(payload)}.{b64(b'sig')}"
    presented = _reader().presented(_bearer(token), trusted_peer=False)
    assert presented.expires_at == expected
    presented.binding(NOW).encode()  # never raises


def test_odd_claims_never_raise():
    for sub in ["\ud800", "a\x00b", "x" * 10_000]:
        token = jwt.encode({"sub": sub, "iss": "\udfff"}, "s" * 32, "HS256")
        presented = _reader().presented(_bearer(token), trusted_peer=False)
        assert presented.principal is not None
    # iss missing is not iss "None"
    a = _reader().presented(_bearer(jwt.encode({"sub": "x"}, "k" * 32)), trusted_peer=False)
    b = _reader().presented(
        _bearer(jwt.encode({"sub": "x", "iss": "None"}, "k" * 32)), trusted_peer=False
    )
    assert a.principal != b.principal


def test_a_principal_header_sent_twice_counts_not_at_all():
    reader = _reader(resume="principal", principal_header="X-User")
    twice = reader.presented([("X-User", "alice"), ("X-User", "bob")], trusted_peer=True)
    assert twice.principal is None
    assert not twice.principal_verified


def test_underscore_variant_of_the_principal_header_is_dropped():
    forwarded = upstream_request_headers(
        [("X_User", "alice"), ("x-user", "alice")],
        mcp_endpoint=False,
        peer="203.0.113.9",
        scheme="http",
        host="gw",
        trusted_peer=False,
        drop_names=frozenset({"x-user"}),
    )
    assert not [n for n, _ in forwarded if n.lower().replace("_", "-") == "x-user"]


def test_connection_tokens_cannot_strip_what_the_gateway_acts_on():
    forwarded = upstream_request_headers(
        [
            ("Connection", "Authorization, Mcp-Session-Id, MCP-Protocol-Version, X-Drop"),
            ("Authorization", "Bearer t"),
            ("Mcp-Session-Id", "s"),
            ("MCP-Protocol-Version", "2025-11-25"),
            ("X-Drop", "1"),
        ],
        mcp_endpoint=True,
        peer=None,
        scheme="http",
        host="gw",
        trusted_peer=False,
    )
    names = {n.lower() for n, _ in forwarded}
    assert {"authorization", "mcp-session-id", "mcp-protocol-version"} <= names
    assert "x-drop" not in names


def test_settings_validation():
    with pytest.raises(ValueError, match="16"):
        AuthSettings(digest_key="short")
    with pytest.raises(ValueError, match="header"):
        AuthSettings(credential_headers=("bad header",))
    with pytest.raises(ValueError, match="jwks_file"):
        AuthSettings(jwks_file="/nonexistent/jwks.json")
