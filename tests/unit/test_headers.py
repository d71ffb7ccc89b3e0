"""Header policy: hop-by-hop removal, forwarded headers, Host and Origin checks."""

from __future__ import annotations

import pytest

from mcp_sse_gateway.headers import (
    client_response_headers,
    host_allowed,
    origin_allowed,
    peer_trusted,
    upstream_request_headers,
)

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def _forward(headers, **kwargs):
    options = {
        "mcp_endpoint": True,
        "peer": "10.0.0.9",
        "scheme": "http",
        "host": "gw:8080",
        "trusted_peer": False,
    }
    options.update(kwargs)
    return upstream_request_headers(headers, **options)


def test_connection_listed_fields_are_dropped_case_insensitively():
    out = _forward([("connection", "Keep-Alive, x-Private"), ("X-PRIVATE", "1"), ("X-Other", "2")])
    assert ("X-Other", "2") in out
    assert not [n for n, _ in out if n.lower() in {"connection", "x-private"}]


def test_repeated_headers_keep_order():
    out = _forward([("Cookie", "a=1"), ("X-A", "1"), ("Cookie", "b=2")])
    assert [v for n, v in out if n == "Cookie"] == ["a=1", "b=2"]


def test_last_event_id_dropped_only_on_the_mcp_endpoint():
    assert ("Last-Event-ID", "7") not in _forward([("Last-Event-ID", "7")])
    assert ("Last-Event-ID", "7") in _forward([("Last-Event-ID", "7")], mcp_endpoint=False)
    assert ("Accept-Encoding", "gzip") in _forward(
        [("Accept-Encoding", "gzip")], mcp_endpoint=False
    )


def test_response_headers_keep_auth_and_cookies_drop_framing():
    upstream = [
        ("WWW-Authenticate", "Bearer a"),
        ("WWW-Authenticate", "Basic b"),
        ("Transfer-Encoding", "chunked"),
        ("Content-Length", "5"),
        ("Connection", "close"),
    ]
    assert client_response_headers(upstream, keep_length=False) == upstream[:2]
    assert ("Content-Length", "5") in client_response_headers(upstream, keep_length=True)


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("localhost", True),
        ("localhost:8080", True),
        ("LOCALHOST:1", True),
        ("127.0.0.1:9", True),
        ("[::1]:8080", True),
        ("[::1]", True),
        ("evil.example", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.nip.io", False),
        (None, False),
        ("", False),
    ],
)
def test_host_allowed(host, allowed):
    assert host_allowed(host, DEFAULT_HOSTS) is allowed


def test_wildcard_allows_anything():
    assert host_allowed("evil.example", ("*",))
    assert origin_allowed("null", ("*",))


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        (None, True),
        ("http://localhost:6274", True),
        ("https://127.0.0.1", True),
        ("http://evil.example", False),
        ("null", False),
        ("not a url", False),
        ("file://", False),
    ],
)
def test_origin_allowed(origin, allowed):
    assert origin_allowed(origin, ("http://localhost", "https://127.0.0.1")) is allowed


def test_peer_trusted():
    assert peer_trusted("10.1.2.3", ("10.0.0.0/8",))
    assert not peer_trusted("11.1.2.3", ("10.0.0.0/8",))
    assert not peer_trusted("junk", ("10.0.0.0/8",))
    assert not peer_trusted(None, ("10.0.0.0/8",))
    assert peer_trusted("::1", ("::1/128",))


@pytest.mark.parametrize(
    "host",
    [
        "localhost:1@evil.example",
        "localhost:evil.example",
        "localhost:80/x",
        "[::1]evil",
        "[::1]:x",
    ],
)
def test_host_tricks_are_refused(host):
    assert not host_allowed(host, DEFAULT_HOSTS)


def test_origin_with_userinfo_is_refused():
    assert not origin_allowed("http://localhost:80@evil.example", ("http://localhost",))


def test_client_supplied_forwarding_headers_never_pass():
    out = _forward(
        [("X-Real-IP", "1.2.3.4"), ("X-Original-URL", "/admin"), ("X-Forwarded-Port", "1")]
    )
    assert not [
        n for n, _ in out if n.lower() in {"x-real-ip", "x-original-url", "x-forwarded-port"}
    ]


@pytest.mark.parametrize(
    ("coding", "decoded"),
    [
        ("gzip", True),
        ("DEFLATE", True),
        ("br", True),
        ("zstd", True),
        ("x-custom", False),
        ("gzip, identity", False),
    ],
)
def test_a_body_the_server_decodes_loses_its_coding_and_digests_and_no_other(coding, decoded):
    incoming = [
        ("Content-Encoding", coding),
        ("Content-Digest", "sha-256=:AAAA:"),
        ("Content-MD5", "AAAA"),
        ("Content-Type", "application/json"),
    ]
    names = {name.lower() for name, _ in _forward(incoming, mcp_endpoint=False)}
    assert "content-type" in names
    kept = {"content-encoding", "content-digest", "content-md5"} & names
    assert kept == (set() if decoded else {"content-encoding", "content-digest", "content-md5"})
