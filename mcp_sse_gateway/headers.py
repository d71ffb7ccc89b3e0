"""Header policy of the relay: what crosses the gateway in each direction, and Host/Origin checks.

Sans-IO: functions take and return plain ``(name, value)`` pairs so that repeated headers
(``Set-Cookie``, ``WWW-Authenticate``) keep their order and multiplicity.
Sources: RFC 9110 §7.6.1 (Connection, hop-by-hop fields), §7.2 (Host); RFC 7239 and the de-facto
``X-Forwarded-*`` headers; MCP 2025-11-25 transports, "Security Warning" (Origin validation).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import NamedTuple
from urllib.parse import urlsplit

Headers = list[tuple[str, str]]

#: RFC 9110 §7.6.1 hop-by-hop fields, plus fields that describe one connection or one message
#: framing and so must be recomputed per hop.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
    }
)

#: Never sent upstream: the upstream sees its own Host; replays are the gateway's job on the MCP
#: endpoint; forwarded-for headers are rebuilt below.
_DROP_UPSTREAM = frozenset(
    {
        "host",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "x-forwarded-port",
        "x-real-ip",
        "x-original-url",
        "x-rewrite-url",
        "forwarded",
    }
)
#: Content codings the gateway's HTTP server (aiohttp) decodes in request bodies: such a body
#: goes upstream decoded, so its ``Content-Encoding`` and the digests of its encoded form are
#: dropped. Any other coding is relayed as it came, header and bytes.
DECODED_CODINGS = frozenset({"gzip", "deflate", "br", "zstd"})
_ENCODED_BODY = frozenset(
    {"content-encoding", "content-md5", "content-digest", "repr-digest", "digest"}
)
_DROP_UPSTREAM_MCP = frozenset({"last-event-id", "accept-encoding"})
#: End-to-end headers a client's ``Connection`` tokens cannot make hop-by-hop.
_NEVER_HOP_BY_HOP = frozenset(
    {"authorization", "cookie", "mcp-session-id", "mcp-protocol-version", "host"}
)


def _connection_tokens(headers: Iterable[tuple[str, str]]) -> set[str]:
    tokens: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


#: What is never forwarded upstream, anywhere and on the MCP endpoint (computed once).
_DROP_ALWAYS = HOP_BY_HOP | _DROP_UPSTREAM
_DROP_MCP_ALWAYS = _DROP_ALWAYS | _DROP_UPSTREAM_MCP


class _Seen(NamedTuple):
    """What the relay acts on among a request's headers (:func:`_scan`)."""

    tokens: set[str]
    coding: str | None
    forwarded_for: list[str]
    forwarded_proto: str | None
    forwarded_host: str | None


def _scan(named: Sequence[tuple[str, str, str]]) -> _Seen:
    """The headers the relay acts on, of ``(lower-case name, name, value)`` triples, in one pass.

    ``Connection`` tokens (lower case), the first ``Content-Encoding``, every
    ``X-Forwarded-For``, and the first ``X-Forwarded-Proto`` and ``X-Forwarded-Host``.
    """
    seen = _Seen(set(), None, [], None, None)
    coding = proto = host = None
    for lower, _, value in named:
        if lower == "connection":
            seen.tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
        elif lower == "x-forwarded-for":
            seen.forwarded_for.append(value)
        elif lower == "content-encoding":
            coding = value if coding is None else coding
        elif lower == "x-forwarded-proto":
            proto = value if proto is None else proto
        elif lower == "x-forwarded-host":
            host = value if host is None else host
    return seen._replace(coding=coding, forwarded_proto=proto, forwarded_host=host)


def upstream_request_headers(
    incoming: Sequence[tuple[str, str]],
    *,
    mcp_endpoint: bool,
    peer: str | None,
    scheme: str,
    host: str | None,
    trusted_peer: bool,
    drop_names: frozenset[str] = frozenset(),
) -> Headers:
    """Headers to send upstream for one client request.

    Args:
        incoming: the client's headers, in order.
        mcp_endpoint: True on the MCP endpoint: ``Last-Event-ID`` is dropped and ``identity``
            encoding is asked for (the gateway reads those bodies).
        peer: the client's IP address as seen on the socket.
        scheme: ``http`` or ``https``, as the client reached the gateway.
        host: the client's ``Host`` header.
        trusted_peer: the peer is a configured proxy: its ``X-Forwarded-*`` are extended, not
            replaced.
        drop_names: further headers (lower case) not to forward, e.g. the trusted principal
            header when the peer is not a trusted proxy.

    Returns:
        End-to-end headers (``Authorization``, ``Cookie``, ``Mcp-*``, ``traceparent`` …) in order,
        plus ``X-Forwarded-For/Proto/Host``.
    """
    # One pass over the client's headers, each name lowered once (this runs per request).
    named = [(name.lower(), name, value) for name, value in incoming]
    seen = _scan(named)
    tokens = seen.tokens
    # A client's Connection tokens never strip what the gateway itself acts on: the upstream
    # must see the credentials and session the gateway authorized and bound.
    drop = _DROP_MCP_ALWAYS if mcp_endpoint else _DROP_ALWAYS
    tokens -= _NEVER_HOP_BY_HOP
    # The server looks at the first Content-Encoding only, as a whole value.
    coding = seen.coding
    if coding and coding.isascii() and coding.lower() in DECODED_CODINGS:
        tokens |= _ENCODED_BODY
    if tokens or drop_names:
        drop = drop | tokens | drop_names
    out: Headers = [
        (name, value)
        for lower, name, value in named
        if lower not in drop
        # "X_Auth_User" is "X-Auth-User" to CGI/WSGI upstreams (HTTP_X_AUTH_USER).
        and not (drop_names and lower.replace("_", "-") in drop_names)
    ]
    chain = [*seen.forwarded_for] if trusted_peer else []
    if peer:
        chain.append(peer)
    if chain:
        out.append(("X-Forwarded-For", ", ".join(chain)))
    out.append(("X-Forwarded-Proto", (seen.forwarded_proto if trusted_peer else None) or scheme))
    original_host = (seen.forwarded_host if trusted_peer else None) or host
    if original_host:
        out.append(("X-Forwarded-Host", original_host))
    if mcp_endpoint:
        out.append(("Accept-Encoding", "identity"))
    return out


def client_response_headers(upstream: Sequence[tuple[str, str]], *, keep_length: bool) -> Headers:
    """Headers to relay from the upstream's response to the client.

    Args:
        upstream: the upstream response's headers, in order.
        keep_length: keep ``Content-Length`` (the body is relayed byte for byte and complete).

    Returns:
        The end-to-end headers in order (``WWW-Authenticate``, ``Set-Cookie``, ``Mcp-Session-Id``
        … verbatim), without hop-by-hop fields.
    """
    drop = (HOP_BY_HOP | _connection_tokens(upstream)) - (
        {"content-length"} if keep_length else set()
    )
    return [(name, value) for name, value in upstream if name.lower() not in drop]


def _hostname(host: str) -> str:
    """``host[:port]`` → lower-case host (IPv6 literals keep their brackets).

    Anything that is not a plain host with an optional numeric port (userinfo ``@``, a
    non-numeric port, stray brackets) gives ``""``, which no allowed name matches.
    """
    host = host.strip().lower()
    if "@" in host or "/" in host:
        return ""
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1 :] if end != -1 else "x"
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return ""
        return host[: end + 1]
    name, sep, port = host.partition(":")
    if sep and not port.isdigit():
        return ""
    return name


def host_allowed(host: str | None, allowed: Sequence[str]) -> bool:
    """Whether a ``Host`` header value passes ``server.allowed_hosts`` (ports are ignored).

    A missing Host is refused unless ``"*"`` is allowed (HTTP/1.1 requires one).
    """
    if "*" in allowed:
        return True
    if not host:
        return False
    name = _hostname(host)
    return any(name == _hostname(entry) for entry in allowed)


def _origin_key(origin: str) -> tuple[str, str] | None:
    try:
        parts = urlsplit(origin.strip().lower())
    except ValueError:
        return None
    if not parts.scheme or not parts.netloc:
        return None
    return parts.scheme, _hostname(parts.netloc)


def origin_allowed(origin: str | None, allowed: Sequence[str]) -> bool:
    """Whether an ``Origin`` header passes ``server.allowed_origins`` (ports are ignored).

    Requests without ``Origin`` (non-browser clients) pass; ``null`` and malformed origins are
    refused unless ``"*"`` is allowed.
    """
    if origin is None or "*" in allowed:
        return True
    key = _origin_key(origin)
    return key is not None and any(key == _origin_key(entry) for entry in allowed)


def peer_trusted(peer: str | None, networks: Sequence[str]) -> bool:
    """Whether the socket peer address lies in one of the trusted proxy CIDRs."""
    if not peer or not networks:
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(net, strict=False) for net in networks)
