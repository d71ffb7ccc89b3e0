"""The upstream seam on aiohttp's client (:mod:`mcp_sse_gateway.streams.upstream`).

Foreign exceptions (aiohttp's, the socket's) are mapped here, once, before and after the
response headers, to the gateway's :class:`~mcp_sse_gateway.errors.UpstreamError` tree, raised
``from`` the original. Nothing is retried: a POST may carry a JSON-RPC request that must not
run twice.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Self

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

from mcp_sse_gateway.config import UpstreamSettings
from mcp_sse_gateway.errors import (
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamTimeout,
)

#: What reading a response body may raise besides cancellation: all of it means "broken"
#: (aiohttp's reader raises RuntimeError when its connection closed before the body ended).
_BODY_ERRORS = (
    aiohttp.ClientError,
    HttpProcessingError,
    OSError,
    TimeoutError,
    ValueError,
    RuntimeError,
)


def make_client_session(
    settings: UpstreamSettings, trace_configs: Sequence[aiohttp.TraceConfig] = ()
) -> aiohttp.ClientSession:
    """The pooled HTTP client used for every upstream request.

    *trace_configs* are tracing's request hooks (a client span per request, and its
    ``traceparent`` sent upstream). No pool cap by default (``max_connections = 0``): a cap
    would queue tool calls behind long-running streams. Only the connect phase has a socket
    timeout; the wait for response headers is bounded per request by :meth:`HttpUpstream.open`,
    and a quiet stream is never cut.
    """
    connector = aiohttp.TCPConnector(
        limit=settings.max_connections,
        limit_per_host=0,
        enable_cleanup_closed=False,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=settings.connect_timeout_s, sock_read=None
        ),
        auto_decompress=False,
        # The relay sends exactly the client's headers: no invented Accept (a client that sent
        # none must get the upstream's own answer to that, a 406 say), User-Agent,
        # Accept-Encoding or Content-Type.
        skip_auto_headers=("Accept", "User-Agent", "Accept-Encoding", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        trace_configs=list(trace_configs) or None,
    )


class HttpResponse:
    """An :class:`~mcp_sse_gateway.streams.upstream.UpstreamResponse` over aiohttp's."""

    __slots__ = ("_response", "_watch")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._watch: _ConnectionWatch | None = None

    @property
    def status(self) -> int:
        """The HTTP status code."""
        return self._response.status

    @property
    def reason(self) -> str | None:
        """The reason phrase as received."""
        return self._response.reason

    @property
    def headers(self) -> list[tuple[str, str]]:
        """The response headers as received (in order, repeated names kept)."""
        return list(self._response.headers.items())

    @property
    def content_type(self) -> str:
        """The media type of ``Content-Type``, lower case (``application/octet-stream``: none)."""
        return self._response.content_type

    def header(self, name: str) -> str | None:
        """The first value of header *name*, or None."""
        return self._response.headers.get(name)

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives.

        Raises:
            UpstreamBroken: reset, truncated chunked body, malformed encoding, read timeout.
        """
        response = self._response
        watch = self._watch = _watch(response)
        return _Body(response.content, watch)

    def close(self) -> None:
        """Close the connection now."""
        self._unwatch()
        self._response.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._unwatch()
        await self._response.__aexit__(exc_type, exc, tb)

    def _unwatch(self) -> None:
        # A body left unread keeps no buffer alive on a pooled connection's watch.
        if self._watch is not None:
            self._watch.release(self._response.content)


class _Body:
    """A response body's chunks, as they arrive (:meth:`HttpResponse.chunks`).

    An iterator rather than an async generator: every stream waiting on its upstream keeps one
    read pending, and this one keeps two fewer objects alive for the collector to walk.
    """

    __slots__ = ("_content", "_watch")

    def __init__(self, content: aiohttp.StreamReader, watch: _ConnectionWatch | None) -> None:
        self._content = content
        self._watch = watch

    def __aiter__(self) -> Self:
        return self

    @property
    def ended(self) -> bool:
        """The whole body has been read: its end came with the chunks returned so far."""
        return self._content.at_eof()

    async def __anext__(self) -> bytes:
        content = self._content
        try:
            chunk = await content.readany()
        except _BODY_ERRORS as exc:
            if self._watch is not None:
                self._watch.release(content)
            raise UpstreamBroken("the upstream's response body broke off") from exc
        if not chunk:
            if self._watch is not None:
                self._watch.release(content)
            raise StopAsyncIteration
        return chunk


class _ConnectionWatch:
    """Ends the body in flight on one upstream connection when the connection closes under it.

    aiohttp's C parser, on a malformed chunk-size line, closes the connection without ending
    the body it was reading (aiohttp 3.14: no EOF, no exception): a read would wait forever,
    and a tool call's stream with it. One watch per connection, one callback on its
    ``closed`` future; the body it guards is swapped per response.
    """

    __slots__ = ("body",)

    def __init__(self) -> None:
        self.body: aiohttp.StreamReader | None = None

    def release(self, body: aiohttp.StreamReader) -> None:
        """Stop guarding *body* (it ended, or its response was released)."""
        if self.body is body:
            self.body = None

    def closed(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled():
            future.exception()  # retrieved here, or asyncio would log it as never retrieved
        body, self.body = self.body, None
        if body is not None:
            _break(body)


#: The watch of each upstream connection in use (weak: it goes with its connection).
_WATCHES: weakref.WeakKeyDictionary[ResponseHandler, _ConnectionWatch] = weakref.WeakKeyDictionary()


def _watch(response: aiohttp.ClientResponse) -> _ConnectionWatch | None:
    """The watch of *response*'s connection, now guarding its body.

    None when the body holds all it will get (the connection already given back) or the
    connection is already closed (then the body is ended here if it was not).
    """
    connection = response.connection
    protocol = connection.protocol if connection is not None else None
    if protocol is None:
        return None
    closed = protocol.closed
    if closed is None:  # lost before anyone asked
        _break(response.content)
        return None
    watch = _WATCHES.get(protocol)
    if watch is None:
        watch = _WATCHES[protocol] = _ConnectionWatch()
        closed.add_done_callback(watch.closed)
    watch.body = response.content
    return watch


def _break(body: aiohttp.StreamReader) -> None:
    """End *body* with an error if it has neither ended nor failed."""
    if not body.is_eof() and body.exception() is None:
        body.set_exception(
            aiohttp.ClientPayloadError("the connection closed before the body ended")
        )


class HttpUpstream:
    """The :class:`~mcp_sse_gateway.streams.upstream.Upstream` of a running app.

    Args:
        settings: the ``[upstream]`` section.
        observe_headers_wait: called with each wait for response headers, seconds (a metric).
        trace_configs: tracing's aiohttp request hooks (none when tracing is off).

    The pooled client exists between :meth:`start` and :meth:`close` (the app's lifetime).
    """

    def __init__(
        self,
        settings: UpstreamSettings,
        observe_headers_wait: Callable[[float], None],
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        self._settings = settings
        self._observe = observe_headers_wait
        self._trace_configs = tuple(trace_configs)
        self._client: aiohttp.ClientSession | None = None

    def start(self) -> None:
        """Create the pooled client (inside the running event loop)."""
        if self._client is None:
            self._client = make_client_session(self._settings, self._trace_configs)

    async def close(self) -> None:
        """Close the pooled client and every connection in it."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def open(
        self,
        method: str,
        url: URL,
        headers: Sequence[tuple[str, str]],
        body: bytes | None,
        *,
        headers_timeout_s: float | None = None,
    ) -> HttpResponse:
        """Send one request upstream and wait for its response headers.

        Args:
            method: the HTTP method, as received.
            url: absolute upstream URL (always the configured origin).
            headers: from :func:`mcp_sse_gateway.headers.upstream_request_headers`.
            body: the request body, or None for none.
            headers_timeout_s: bound on the wait for headers, seconds (default
                ``upstream.headers_timeout_s``).

        Returns:
            The response, body not yet read (release it with ``async with`` or close it).

        Raises:
            UpstreamConnectError: connection refused, DNS or TLS failure, connect timeout.
            UpstreamTimeout: no response headers within the bound.
            UpstreamProtocolError: the upstream closed the connection or sent invalid HTTP.
            RuntimeError: called outside :meth:`start` … :meth:`close`.
        """
        if self._client is None:
            raise RuntimeError("the upstream client is not started")
        timeout_s = (
            self._settings.headers_timeout_s if headers_timeout_s is None else headers_timeout_s
        )
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._client.request(
                    method, url, headers=list(headers), data=body, allow_redirects=False
                )
        except TimeoutError as exc:
            raise UpstreamTimeout("no response headers from the upstream in time") from exc
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise UpstreamConnectError("cannot connect to the upstream") from exc
        except (aiohttp.ClientError, HttpProcessingError, ValueError) as exc:
            raise UpstreamProtocolError("the upstream failed before answering") from exc
        self._observe(time.perf_counter() - started)
        return HttpResponse(response)
