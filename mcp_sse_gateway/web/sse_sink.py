"""The SSE response adapter: the stream layer's client sink over aiohttp's streaming response.

See :class:`~mcp_sse_gateway.streams.sink.ClientSink`.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from mcp_sse_gateway.errors import ClientGone, SlowReader

#: Headers of every managed stream the gateway serves: no caching or transformation by
#: intermediaries, no buffering by nginx-style proxies.
SSE_RESPONSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
}

#: The most bytes aiohttp adds around one write of a chunked body (its size line and CRLFs).
CHUNK_FRAMING_BYTES = 32


class SSEResponseSink:
    """Writes to one prepared SSE response; a write blocked for *cut_s* seconds is a slow reader.

    Args:
        request: the client's request (its transport is aborted for a slow reader).
        response: the prepared response.
        cut_s: ``sse.slow_reader_cut_s``.
    """

    def __init__(self, request: web.Request, response: web.StreamResponse, cut_s: float) -> None:
        self._request, self._response, self._cut_s = request, response, cut_s

    async def write(self, data: bytes) -> None:
        """Write *data*.

        A write the transport's buffer takes without pausing the connection's protocol cannot
        block (aiohttp waits only on a paused protocol): it goes without the timer, a few µs
        of each event's cost. This holds for the plain TCP transport the gateway serves on
        (TLS ends in front of it); a TLS transport would count its records' overhead too.

        Raises:
            SlowReader: the write stayed blocked for ``cut_s``.
            ClientGone: the client's connection is closed.
        """
        transport = self._request.transport
        try:
            if (
                transport is not None
                and not self._request.protocol.writing_paused
                and transport.get_write_buffer_size() + len(data) + CHUNK_FRAMING_BYTES
                <= transport.get_write_buffer_limits()[1]
            ):
                await self._response.write(data)
                return
            async with asyncio.timeout(self._cut_s):
                await self._response.write(data)
        except TimeoutError:
            raise SlowReader from None
        except ConnectionResetError:
            raise ClientGone from None

    async def end(self) -> None:
        """End the response; a client already gone is no error."""
        with contextlib.suppress(ConnectionResetError):
            await self._response.write_eof()

    def abort(self) -> None:
        """Abort the connection: closing would wait to flush what the reader never drains."""
        if self._request.transport is not None:
            self._request.transport.abort()


async def open_sse(
    request: web.Request, headers: dict[str, str] | None, cut_s: float
) -> tuple[web.StreamResponse, SSEResponseSink]:
    """Prepare a 200 event-stream response (with *headers*, e.g. the upstream's session id)."""
    response = web.StreamResponse(status=200, headers={**(headers or {}), **SSE_RESPONSE_HEADERS})
    await response.prepare(request)
    return response, SSEResponseSink(request, response, cut_s)
