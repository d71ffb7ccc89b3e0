"""The seam to the upstream MCP server: open one request, read its body as chunks, close it.

The stream layer sees the upstream only through :class:`Upstream` and :class:`UpstreamResponse`.
Production implements them on aiohttp's client (:mod:`mcp_sse_gateway.web.upstream`), which maps
every failure, before and after the response headers, into the
:class:`~mcp_sse_gateway.errors.UpstreamError` tree; unit tests use a scripted fake.

Nothing here retries: a POST may carry a JSON-RPC request that must not run twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType
from typing import Protocol, Self

from yarl import URL

from mcp_sse_gateway.headers import client_response_headers

#: Response headers of the upstream that describe its body, replaced by the gateway's own on a
#: managed stream.
BODY_HEADERS = frozenset({"content-type", "cache-control", "content-encoding", "x-accel-buffering"})
#: Request headers a re-opening GET sets itself.
_REOPEN_REPLACED = frozenset({"content-type", "accept", "last-event-id"})


class UpstreamResponse(Protocol):
    """One upstream response: status and headers received, body not read yet.

    Used as an async context manager, it is released on exit (the connection goes back to the
    pool if the body was read whole); :meth:`close` closes the connection at once.
    """

    @property
    def status(self) -> int:
        """The HTTP status code."""
        ...

    @property
    def reason(self) -> str | None:
        """The reason phrase as received, or None."""
        ...

    @property
    def headers(self) -> Sequence[tuple[str, str]]:
        """The response headers as received: in order, repeated names kept."""
        ...

    @property
    def content_type(self) -> str:
        """The media type of ``Content-Type``, lower case, without parameters (``""``: none)."""
        ...

    def header(self, name: str) -> str | None:
        """The first value of header *name* (case-insensitive), or None."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, in chunks of any size.

        Raises:
            UpstreamBroken: the body broke off (reset, truncated, malformed, read timeout).
        """
        ...

    def close(self) -> None:
        """Close the connection now (a body nobody reads, or a stream given up on)."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class Upstream(Protocol):
    """Where every request of the gateway goes: the one configured upstream."""

    async def open(
        self,
        method: str,
        url: URL,
        headers: Sequence[tuple[str, str]],
        body: bytes | None,
        *,
        headers_timeout_s: float | None = None,
    ) -> UpstreamResponse:
        """Send one request and wait (bounded) for its response headers.

        Redirects are never followed (the client gets the 3xx as is). Cancelling closes the
        upstream connection. *headers_timeout_s* bounds the wait, seconds (None:
        ``upstream.headers_timeout_s``).

        Raises:
            UpstreamConnectError: connection refused, DNS or TLS failure, connect timeout.
            UpstreamTimeout: no response headers within the bound.
            UpstreamProtocolError: the upstream closed the connection or sent invalid HTTP.
        """
        ...


@dataclass(frozen=True, slots=True)
class UpstreamCall:
    """Everything needed to send (and re-send as a GET) one request upstream.

    Attributes:
        url: the upstream URL.
        headers: the headers to send (the client's credentials among them).
        auth: the encoded binding of those credentials, kept on the records the request
            creates (``""`` when authorization is off; DESIGN D8).
        creator: their keyed digest: a stream the request creates evicts only finished
            streams of the same creator (``""``: any).
    """

    url: URL
    headers: list[tuple[str, str]]
    auth: str = ""
    creator: str = ""

    def reopen(self, last_event_id: str | None = None) -> UpstreamCall:
        """The same call as a GET for an event stream, resuming after *last_event_id* if given."""
        keep = [(n, v) for n, v in self.headers if n.lower() not in _REOPEN_REPLACED]
        extra = [("Last-Event-ID", last_event_id)] if last_event_id is not None else []
        headers = [*keep, ("Accept", "text/event-stream"), *extra]
        return UpstreamCall(self.url, headers, self.auth, self.creator)


def is_event_stream(response: UpstreamResponse) -> bool:
    """Whether *response* is a 200 event stream (what a managed stream is made of)."""
    return response.status == HTTPStatus.OK and response.content_type == "text/event-stream"


async def body_chunks(response: UpstreamResponse) -> AsyncIterator[bytes]:
    """The body of *response*, which is closed once read (or abandoned).

    Raises:
        UpstreamBroken: the body broke off.
    """
    try:
        async for chunk in response.chunks():
            yield chunk
    finally:
        response.close()


def stream_headers(response: UpstreamResponse) -> dict[str, str]:
    """The upstream's headers a managed stream relays (``Mcp-Session-Id`` say), body ones not."""
    return {
        name: value
        for name, value in client_response_headers(list(response.headers), keep_length=False)
        if name.lower() not in BODY_HEADERS
    }
