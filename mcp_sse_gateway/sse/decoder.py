"""The incremental ``text/event-stream`` decoder, sans-IO.

Exact to WHATWG HTML, "Server-sent events": §9.2.5 "Parsing an event stream" (UTF-8 decoding,
one leading BOM stripped, CRLF / LF / CR line ends, comments, ``field: value`` lines) and §9.2.6
"Interpreting an event stream" (the ``data``, ``event``, ``id`` and ``retry`` fields, the last
event ID buffer and string, dispatch on an empty line, incomplete block discarded at EOF).

The decoder works on bytes: line ends are found with ``bytes.rfind`` over the new chunk only
(the buffered partial line never holds one, so a multi-megabyte event that arrives in small
chunks is scanned once: linear time); every complete line of a chunk is split off in one pass;
UTF-8 is decoded per field value of complete lines, never per chunk, so a character split
across chunks is kept whole (line ends and colons are ASCII, so this equals decoding the whole
stream with replacement).
"""

from __future__ import annotations

import contextlib
import sys

from mcp_sse_gateway.errors import EventTooLarge
from mcp_sse_gateway.sse.event import ServerSentEvent

_BOM = b"\xef\xbb\xbf"


# ServerSentEvent(...) goes through the named tuple's __new__ (a Python function); the decoder
# makes the tuple directly (about half the time per event). The result is an ordinary
# ServerSentEvent.
_new_tuple = tuple.__new__


class SSEDecoder:
    """Incremental ``text/event-stream`` decoder: feed it byte chunks, get complete blocks.

    A block is what lies between two empty lines. Each complete block that carries at least one
    effective field (``data``, ``event``, ``id`` or a valid ``retry``) comes out as one
    :class:`ServerSentEvent`, including blocks without data that a browser would not dispatch
    (so that ids and retries are seen); blocks of only comments or unknown fields yield nothing.

    Chunks may be cut anywhere: inside a UTF-8 character, inside the leading BOM, or between
    the CR and LF of a CRLF (counted as one line end). A block is returned as soon as its ending
    empty line has arrived, even one ended by a lone CR.

    Args:
        max_event_bytes: bound on the bytes of one block: its lines (each line end counting as
            one byte, the empty line that ends the block not counted) plus the partial line
            still waiting for its line end. None means unbounded.
    """

    __slots__ = (
        "_at_start",
        "_block_bytes",
        "_broken",
        "_buf",
        "_comments",
        "_data",
        "_event",
        "_id",
        "_id_buffer",
        "_last_event_id",
        "_limit",
        "_retry",
        "_skip_lf",
    )

    def __init__(self, *, max_event_bytes: int | None = None) -> None:
        if max_event_bytes is not None and max_event_bytes < 0:
            raise ValueError("max_event_bytes must be >= 0 or None")
        self._limit = sys.maxsize if max_event_bytes is None else max_event_bytes
        self._last_event_id = ""
        self._id_buffer = ""
        self._comments = 0
        self._reset()

    def _reset(self) -> None:
        """Forget the stream read so far (not the last event ID nor the comment count)."""
        self._buf = bytearray()  # the partial line: never holds a CR or LF
        self._at_start = True  # a leading BOM may still come
        self._skip_lf = False  # the previous chunk ended with CR: drop one LF right after it
        self._broken = False
        self._block_bytes = 0
        self._data: list[bytes] | None = None
        self._event: str | None = None
        self._id: str | None = None
        self._retry: int | None = None
        self._id_buffer = self._last_event_id

    @property
    def last_event_id(self) -> str:
        """The last event ID: what a reconnection sends as ``Last-Event-ID`` (``""``: none).

        The spec's last event ID buffer as of the last completed block (its "last event ID
        string"): it persists across blocks, changes only with an ``id`` field (an empty one
        resets it to ``""``), and an ``id`` in a block that never completes (cut by EOF) is
        not taken, so a resumption never skips the event it belonged to. It survives
        :meth:`end`.
        """
        return self._last_event_id

    @property
    def comments(self) -> int:
        """Number of comment lines (``:`` first) seen so far: keepalives, for accounting."""
        return self._comments

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode the next chunk of the stream.

        Args:
            chunk: the next bytes of the stream, cut anywhere.

        Returns:
            The blocks completed by this chunk, in stream order (possibly none).

        Raises:
            EventTooLarge: one block, with its pending partial line, passed ``max_event_bytes``.
                The decoder is then broken: every later ``feed`` raises it again, until
                :meth:`end` resets it. Blocks completed earlier in the same chunk are in the
                exception's ``events``. The message never echoes stream content.
        """
        if self._broken:
            raise EventTooLarge("an event block exceeds max_event_bytes")
        if not chunk:
            return []
        if self._at_start:
            chunk = self._strip_bom(chunk)
        elif self._skip_lf:
            self._skip_lf = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        # The buffer holds no line end, so only the new chunk is scanned (linear overall).
        lf = chunk.rfind(b"\n")
        cr = chunk.rfind(b"\r")
        end = lf if lf > cr else cr
        events: list[ServerSentEvent]
        if end < 0:
            self._buf += chunk
            events = []
        else:
            events = self._lines(self._split_lines(chunk, end + 1, cr))
        if self._block_bytes + len(self._buf) > self._limit:
            self._fail(events)
        return events

    def _split_lines(self, chunk: bytes, end: int, cr: int) -> list[bytes]:
        """The complete lines: the buffer, then ``chunk[:end]``; keep the rest as the buffer.

        ``end`` is just past the chunk's last line end, ``cr`` the position of its last CR.
        """
        buf = self._buf
        if buf:
            buf += memoryview(chunk)[:end]
            head = bytes(buf)
            buf.clear()
        else:
            head = chunk[:end] if end < len(chunk) else chunk
        if end < len(chunk):
            buf += memoryview(chunk)[end:]
        elif cr == end - 1:
            self._skip_lf = True  # the LF of this CRLF may open the next chunk
        if cr >= 0:
            head = head.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = head.split(b"\n")
        lines.pop()  # head ends with a line end: the last item is empty
        return lines

    def _strip_bom(self, chunk: bytes) -> bytes:
        """Drop the stream's leading BOM, which may come split over several chunks."""
        buf = self._buf
        if buf:  # a BOM prefix held back by the previous chunk(s)
            chunk = bytes(buf) + chunk
            buf.clear()
        if len(chunk) < len(_BOM) and _BOM.startswith(chunk):
            buf += chunk  # maybe a BOM, maybe not: wait for more
            return b""
        self._at_start = False
        return chunk[len(_BOM) :] if chunk.startswith(_BOM) else chunk

    # One flat loop on purpose: it runs once per line of the stream, and a helper call per line
    # (to please the complexity metrics) would cost a sizeable share of its time.
    def _lines(self, lines: list[bytes]) -> list[ServerSentEvent]:  # noqa: C901, PLR0912, PLR0915
        """Interpret complete lines (WHATWG §9.2.6); the block state lives in locals meanwhile."""
        events: list[ServerSentEvent] = []
        limit = self._limit
        size = self._block_bytes
        comments = self._comments
        data = self._data
        event = self._event
        ident = self._id
        retry = self._retry
        id_buffer = self._id_buffer
        new_tuple = _new_tuple
        for line in lines:
            if not line:  # dispatch
                self._last_event_id = id_buffer
                if data is not None:
                    text = (data[0] if len(data) == 1 else b"\n".join(data)).decode(
                        "utf-8", "replace"
                    )
                    events.append(new_tuple(ServerSentEvent, (text, event, ident, retry)))
                    data = event = ident = retry = None
                elif event is not None or ident is not None or retry is not None:
                    events.append(new_tuple(ServerSentEvent, (None, event, ident, retry)))
                    event = ident = retry = None
                size = 0
                continue
            size += len(line) + 1
            if size > limit:
                self._fail(events)
            if line.startswith(b"data: "):  # the common line, short-cut
                if data is None:
                    data = [line[6:]]
                else:
                    data.append(line[6:])
                continue
            if line == b"event: message":  # what many servers send before every data line
                event = "message"
                continue
            if line.startswith(b"id: "):
                if b"\x00" not in line:
                    ident = id_buffer = line[4:].decode("utf-8", "replace")
                continue
            colon = line.find(b":")
            if colon == 0:
                comments += 1
                continue
            if colon < 0:
                name = line
                value = b""
            else:
                name = line[:colon]
                colon += 1
                if line[colon : colon + 1] == b" ":
                    colon += 1
                value = line[colon:]
            if name == b"data":
                if data is None:
                    data = [value]
                else:
                    data.append(value)
            elif name == b"id":
                if b"\x00" not in value:
                    ident = id_buffer = value.decode("utf-8", "replace")
            elif name == b"event":
                event = value.decode("utf-8", "replace")
            elif name == b"retry" and value.isdigit():  # bytes.isdigit: ASCII digits only
                # More digits than int() converts (sys.get_int_max_str_digits): no usable delay.
                with contextlib.suppress(ValueError):
                    retry = int(value)
        self._block_bytes = size
        self._comments = comments
        self._data = data
        self._event = event
        self._id = ident
        self._retry = retry
        self._id_buffer = id_buffer
        return events

    def _fail(self, completed: list[ServerSentEvent]) -> None:
        limit = self._limit
        self._reset()
        self._broken = True
        raise EventTooLarge(
            f"an event block exceeds max_event_bytes ({limit})",
            events=list(completed),
        )

    def end(self) -> list[ServerSentEvent]:
        """Mark the end of the stream; the decoder can then read a new stream (a reconnection).

        Per spec the block still incomplete at EOF is discarded, with its fields (an ``id`` in
        it does not reach :attr:`last_event_id`). A leading BOM is stripped again from the next
        stream. :attr:`last_event_id` and :attr:`comments` persist, as ``EventSource``'s last
        event ID does across reconnections.

        Returns:
            Always ``[]``; the method exists for symmetry with :meth:`feed` and to reset.
        """
        self._reset()
        return []
