"""The gateway's exception tree: one class per catchable situation.

::

    GatewayError
    ├── ConfigError                  settings invalid at start-up (exit code 2)
    ├── RequestRejected              the client's request is refused before anything is forwarded
    │   ├── HostNotAllowed           403: Host header not in ``server.allowed_hosts``
    │   ├── OriginNotAllowed         403: Origin header not in ``server.allowed_origins``
    │   ├── BodyTooLarge             413: body over ``server.max_body_bytes``
    │   ├── MethodNotAllowed         405: method the MCP endpoint does not serve
    │   ├── AmbiguousPath            400: a variant of the MCP path (case, ``;``, ``%2F``, ``//``)
    │   ├── BodyTimeout              408: the body did not arrive within ``server.body_timeout_s``
    │   ├── BadBody                  400: the body cannot be decoded (its ``Content-Encoding``)
    │   ├── RepeatedHeader           400: ``Mcp-Session-Id`` sent more than once
    │   └── ResumeForbidden          403: credentials not the creator's where that is required
    ├── UpstreamError                502: the upstream failed (before response headers)
    │   ├── UpstreamConnectError     connection refused / DNS / TLS failure
    │   ├── UpstreamTimeout          no response headers within ``upstream.headers_timeout_s``
    │   ├── UpstreamProtocolError    the upstream answered something that is not HTTP
    │   └── UpstreamBroken           the response body broke off after the headers
    ├── GatewayBusy                  503 + Retry-After: ``server.max_concurrent_requests`` or
    │   │                            ``server.max_pumps`` reached (running streams untouched)
    │   └── ShuttingDown             a drain cancelled a request waiting for its headers
    ├── AuthUnavailable              503 + Retry-After: the upstream could not be asked to
    │                                authorize a resume (5xx, timeout, unreachable)
    ├── StoreError
    │   ├── StoreUnavailable         503 + Retry-After: the event store is needed but down
    │   │   └── StoreBusy            503 + Retry-After: too many store calls queued (new work)
    │   ├── StoreLimitExceeded       a bound of D7 was hit (streams per session, event size)
    │   └── LeaseLost                an append under a lease another replica took over (fencing)
    ├── StreamError                  400: a Last-Event-ID that cannot be resumed, never echoed
    │   ├── InvalidEventId           not an id this gateway mints
    │   ├── UnknownStream            no such stream life under this session (foreign, expired)
    │   └── CursorGone               the events after the cursor are no longer stored (trimmed)
    ├── SessionGone                  404: the session was deleted (tombstone): the upstream's word
    ├── ClientGone                   the client's connection closed while it was written to
    ├── SlowReader                   a write to the client blocked for ``sse.slow_reader_cut_s``
    └── SSEError                     a stream violates the SSE wire rules
        ├── InvalidSSEField          an id/event to encode holds CR, LF or NUL
        └── EventTooLarge            one event block exceeds ``max_event_bytes``

The HTTP status of each client-facing error is declared once, in
:data:`mcp_sse_gateway.web.middleware.STATUS_BY_ERROR`. Messages never echo values taken from
the request (they may be attacker-controlled).

This module is sans-IO: it imports neither aiohttp nor redis.
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base class of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """Raised at start-up when a setting is invalid; the message names the key."""


class RequestRejected(GatewayError):
    """Raised when the gateway refuses a client request before forwarding anything."""


class HostNotAllowed(RequestRejected):
    """Raised when the request's ``Host`` is not in ``server.allowed_hosts`` (DNS rebinding)."""


class OriginNotAllowed(RequestRejected):
    """Raised when the request's ``Origin`` is not in ``server.allowed_origins``."""


class BodyTooLarge(RequestRejected):
    """Raised when the request body exceeds ``server.max_body_bytes``."""


class MethodNotAllowed(RequestRejected):
    """Raised when the MCP endpoint gets a method other than GET, POST or DELETE."""


class AmbiguousPath(RequestRejected):
    """Raised when a path is a variant of the MCP endpoint's whose meaning depends on the upstream.

    Another case, ``;`` parameters, an encoded ``/``, a duplicated or trailing slash: relayed
    unmanaged, it could reach the upstream's MCP endpoint around the gateway.
    """


class RepeatedHeader(RequestRejected):
    """Raised when a request carries ``Mcp-Session-Id`` more than once (which one counts?)."""


class BodyTimeout(RequestRejected):
    """Raised when a request body does not arrive whole within ``server.body_timeout_s``."""


class BadBody(RequestRejected):
    """Raised when a request body cannot be read as sent: a broken ``gzip``/``deflate`` coding."""


class GatewayBusy(GatewayError):
    """Raised when this replica serves as many requests or pumps as it may (a flood).

    Answered 503 + ``Retry-After``; nothing already running is affected.
    """


class ShuttingDown(GatewayBusy):
    """Raised when a drain cancelled a request still waiting for the upstream's headers.

    Answered 503 + ``Retry-After``: the client retries on another replica.
    """


class ResumeForbidden(RequestRejected):
    """Raised when a resume's credentials may not read the stream (DESIGN D8).

    Another principal than the creator's, or (``auth.bind = "creator"``) credentials other
    than the creator's exact ones.
    """


class AuthUnavailable(GatewayError):
    """Raised when the upstream cannot be asked whether a resume's credentials are accepted."""


class UpstreamError(GatewayError):
    """Raised when the upstream fails: before its response headers, or while its body is read."""


class UpstreamConnectError(UpstreamError):
    """Raised when the upstream cannot be connected to (refused, DNS, TLS)."""


class UpstreamTimeout(UpstreamError):
    """Raised when no response headers arrive within ``upstream.headers_timeout_s``."""


class UpstreamProtocolError(UpstreamError):
    """Raised when the upstream's answer is not valid HTTP."""


class UpstreamBroken(UpstreamError):
    """Raised while reading a response body that breaks off: reset, truncated, malformed."""


class StoreError(GatewayError):
    """Base class of event-store failures."""


class StoreUnavailable(StoreError):
    """Raised when the event store is needed to answer a request but cannot be reached."""


class StoreBusy(StoreUnavailable):
    """Raised for new work while the store's call queue is full (DESIGN D7: slow is not down).

    Answered like an outage (503 + ``Retry-After``); nothing already running is affected.
    """


class StoreLimitExceeded(StoreError):
    """Raised when a bound of DESIGN D7 refuses a write (too many streams in a session)."""


class LeaseLost(StoreError):
    """Raised when an append names a lease that is no longer the session's (DESIGN D5).

    Another replica took the session's standalone lease over (it expired, or was released):
    a paused former holder must not write, and stops pumping.
    """


class StreamError(GatewayError):
    """Base class of resume failures: the ``Last-Event-ID`` cannot be served. Always 400."""


class InvalidEventId(StreamError):
    """Raised when a ``Last-Event-ID`` is malformed: not an id this gateway mints."""


class UnknownStream(StreamError):
    """Raised when the id's stream life does not exist under the request's session.

    Another session's id, a stream life that ended in a store outage, or one that expired.
    """


class CursorGone(StreamError):
    """Raised when the events right after the cursor are no longer stored.

    They were trimmed (``max_events_per_stream``, memory cap) or lost (store restart). A gap is
    never skipped silently.
    """


class SessionGone(GatewayError):
    """Raised when a request names a session the upstream ended (DELETE): answered with 404."""


class ClientGone(GatewayError):
    """Raised by a client sink when the client's connection is closed under a write."""


class SlowReader(GatewayError):
    """Raised by a client sink when one write stays blocked for ``sse.slow_reader_cut_s``.

    The connection is then cut (aborted, not flushed); the client resumes from the store.
    """


class SSEError(GatewayError, ValueError):
    """Base class of server-sent-events wire violations."""


class InvalidSSEField(SSEError):
    """Raised by the encoder when an ``id`` or ``event`` value holds CR, LF or NUL.

    Such a value would let one event forge fields of the next (SSE injection). WHATWG HTML,
    server-sent events, "Parsing an event stream".
    """


class EventTooLarge(SSEError):
    """Raised by the decoder when one event block grows past its ``max_event_bytes`` bound.

    Attributes:
        events: the blocks the same chunk completed before the oversized one, in order (they
            are valid and must not be lost with the raise).
    """

    def __init__(self, message: str, events: list[object] | None = None) -> None:
        super().__init__(message)
        self.events = events or []
