"""The SSE response adapter: the stream layer's client sink over aiohttp's streaming response.

See :class:`~mcp_sse_gateway.streams.sink.ClientSink`.
"""

from __future__ import annotations

import asyncio

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
        try:
            if self._takes(data):
                await self._response.write(data)
                return
            async with asyncio.timeout(self._cut_s):
                await self._response.write(data)
        except TimeoutError:
            raise SlowReader from None
        except ConnectionResetError:
            raise ClientGone from None

    def _takes(self, data: bytes) -> bool:
        """Whether the transport takes *data* without pausing the protocol (so no wait)."""
        transport = self._request.transport
        return (
            transport is not None
            and not transport.is_closing()
            and not self._request.protocol.writing_paused
            and transport.get_write_buffer_size() + len(data) + CHUNK_FRAMING_BYTES
            <= transport.get_write_buffer_limits()[1]
        )

    def write_now(self, data: bytes) -> bool:
        """Write *data* now if the transport takes it without pausing; False: nothing written.

        aiohttp's ``StreamResponse.write`` only waits (drains) on a paused protocol, after it
        handed the bytes to the transport (no compression or chunk hook on these responses).
        When the transport takes the bytes without pausing, the coroutine therefore completes
        in one step, driven here without a task: the caller (the pump's task, see
        :meth:`~mcp_sse_gateway.streams.delivery.Delivery`) needs no loop turn for it. Should
        it wait anyway, the bytes are written already and the wait is dropped (the
        connection's next :meth:`write` waits instead).
        """
        if not self._takes(data):
            return False
        step = self._response.write(data)
        try:
            step.send(None)
        except StopIteration:
            return True
        except (ConnectionResetError, RuntimeError):  # closing, or ended: nothing written
            return False
        step.close()  # it waits to drain, after the write
        return True

    async def end(self, last: bytes = b"") -> None:
        """Write *last* and end the response, in one write; a client already gone is no error.

        aiohttp sends *last* and the chunked body's end together. Bounded like :meth:`write`.

        Raises:
            SlowReader: the write stayed blocked for ``cut_s`` (the connection is aborted).
        """
        try:
            if self._takes(last):
                await self._response.write_eof(last)
                return
            async with asyncio.timeout(self._cut_s):
                await self._response.write_eof(last)
        except TimeoutError:
            self.abort()
            raise SlowReader from None
        except ConnectionResetError:
            pass

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
