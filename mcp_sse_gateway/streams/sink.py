"""Where a delivery writes: the client sink protocol (an SSE response in production)."""

from __future__ import annotations

from typing import Protocol

from mcp_sse_gateway.errors import ClientGone, SlowReader
from mcp_sse_gateway.sse import encode_retry


class ClientSink(Protocol):
    """Where a delivery writes: the client's SSE response in production, a list in tests."""

    async def write(self, data: bytes) -> None:
        """Write *data* (encoded SSE) to the client.

        Raises:
            SlowReader: the write stayed blocked for ``sse.slow_reader_cut_s``.
            ClientGone: the client's connection is closed.
        """
        ...

    def write_now(self, data: bytes) -> bool:
        """Write *data* at once if the connection takes it without blocking.

        Returns:
            True once written; False when nothing was written: the write could block (the
            client's buffer is full), or the connection is closing. Never raises; the caller
            then writes with :meth:`write`, which waits or raises.
        """
        ...

    async def end(self, last: bytes = b"") -> None:
        """Write *last* (encoded SSE, may be empty) and end the response, in one write.

        A client already gone is no error.

        Raises:
            SlowReader: the write stayed blocked for ``sse.slow_reader_cut_s`` (the
                connection is then aborted).
        """
        ...

    def abort(self) -> None:
        """Cut the connection without flushing (a slow reader)."""
        ...


async def close_with_retry(sink: ClientSink, retry_ms: int) -> bool:
    """Send ``retry`` then end the response: a client that reconnects waits *retry_ms*.

    The field and the end of the response go in one write (one send for the connection).

    Returns:
        False when that write stayed blocked for ``sse.slow_reader_cut_s`` and the connection
        was cut (a slow reader), else True (a client already gone included).
    """
    try:
        await sink.end(encode_retry(retry_ms))
    except SlowReader:
        return False
    except ClientGone:
        pass
    return True
