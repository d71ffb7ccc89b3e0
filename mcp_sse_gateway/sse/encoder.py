"""The ``text/event-stream`` encoder: event, comment, retry and priming blocks, sans-IO.

Blocks are written for WHATWG HTML §9.2.6 "Interpreting an event stream": fields in the order
event, id, retry, data, LF line ends, and no CR, LF or NUL inside a field's value (it would forge
fields). The encoder has a fast path for data without line breaks. The priming block is that of
MCP 2025-11-25 (SEP-1699).
"""

from __future__ import annotations

from mcp_sse_gateway.errors import InvalidSSEField
from mcp_sse_gateway.sse.event import ServerSentEvent


def _check_field(name: str, value: str) -> None:
    if "\n" in value or "\r" in value or "\x00" in value:
        raise InvalidSSEField(f"the {name} field must not contain CR, LF or NUL")


def _check_retry(retry_ms: object) -> None:
    if type(retry_ms) is not int or retry_ms < 0:
        raise ValueError("retry_ms must be a non-negative int (milliseconds)")


def _head(event: str | None, id: str | None, retry_ms: int | None) -> str:
    """The event, id and retry lines, checked."""
    head = ""
    if event is not None:
        _check_field("event", event)
        head = f"event: {event}\n" if event else "event:\n"
    if id is not None:
        _check_field("id", id)
        head += f"id: {id}\n" if id else "id:\n"
    if retry_ms is not None:
        _check_retry(retry_ms)
        head += f"retry: {retry_ms}\n"
    return head


def format_head(event: str | None = None, id: str | None = None) -> str:
    r"""The event and id lines of a block, checked: ``"event: T\nid: I\n"``.

    Either line is left out when its value is None.

    Raises:
        InvalidSSEField: ``event`` or ``id`` holds CR, LF or NUL (it would forge fields).
    """
    return _head(event, id, None)


def _data_lines(data: str) -> str:
    """One data line per line of ``data`` (which holds a CR or LF), then the empty line."""
    if "\r" in data:
        data = data.replace("\r\n", "\n").replace("\r", "\n")
    lines = [f"data: {line}\n" if line else "data:\n" for line in data.split("\n")]
    lines.append("\n")
    return "".join(lines)


def format_event(
    data: str,
    *,
    event: str | None = None,
    id: str | None = None,
    retry_ms: int | None = None,
) -> str:
    """:func:`encode_event` as text: for joining many blocks before one encode.

    Raises:
        InvalidSSEField: ``event`` or ``id`` holds CR, LF or NUL (it would forge fields).
        ValueError: ``retry_ms`` is not a non-negative int.
    """
    if "\n" in data or "\r" in data:
        if event is None and id is None and retry_ms is None:
            return _data_lines(data)
        return _head(event, id, retry_ms) + _data_lines(data)
    # The fast path: one data line.
    if event is None and id is None and retry_ms is None:
        return f"data: {data}\n\n" if data else "data:\n\n"
    head = _head(event, id, retry_ms)
    return f"{head}data: {data}\n\n" if data else f"{head}data:\n\n"


def encode_event(
    data: str,
    *,
    event: str | None = None,
    id: str | None = None,
    retry_ms: int | None = None,
) -> bytes:
    """Encode one event block, fields in the order event, id, retry, data; LF line ends.

    Each line of ``data`` (split on CRLF, CR and LF) becomes one ``data:`` line, so the decoder
    gives back ``data`` with its line breaks normalised to LF. Values are written after
    ``": "`` (a bare ``field:`` when empty), so a value that starts with a space survives the
    decoder's removal of one space. Empty ``data`` gives a bare ``data:`` line (dispatched as
    ``""`` by a browser).

    Args:
        data: the event's data, any text.
        event: the event type, or None to omit the field (the client sees ``"message"``).
        id: the event id (becomes the client's ``Last-Event-ID``), or None to omit the field.
        retry_ms: the client's reconnection delay in milliseconds, sent as is on the wire, or
            None to omit the field.

    Returns:
        The UTF-8 bytes of the block, ending with the empty line that dispatches it.

    Raises:
        InvalidSSEField: ``event`` or ``id`` holds CR, LF or NUL (it would forge fields).
        ValueError: ``retry_ms`` is not a non-negative int; or the text holds a lone surrogate
            (UnicodeEncodeError).
    """
    return format_event(data, event=event, id=id, retry_ms=retry_ms).encode()


def encode_comment(text: str = "") -> bytes:
    r"""Encode a comment block, ignored by clients: a keepalive that also flushes proxies.

    Args:
        text: the comment's text, one line.

    Returns:
        ``b": text\n\n"``, or ``b":\n\n"`` when ``text`` is empty.

    Raises:
        InvalidSSEField: ``text`` holds CR or LF (the rest would be read as fields).
    """
    if "\n" in text or "\r" in text:
        raise InvalidSSEField("a comment must not contain CR or LF")
    return f": {text}\n\n".encode() if text else b":\n\n"


def encode_retry(retry_ms: int) -> bytes:
    r"""Encode a block that only sets the client's reconnection delay.

    Args:
        retry_ms: the delay in milliseconds, sent as is on the wire.

    Returns:
        ``b"retry: N\n\n"``.

    Raises:
        ValueError: ``retry_ms`` is not a non-negative int.
    """
    _check_retry(retry_ms)
    return f"retry: {retry_ms}\n\n".encode()


def encode_priming(id: str, retry_ms: int | None) -> bytes:
    r"""Encode the priming event of MCP 2025-11-25 (SEP-1699): an id with an empty data line.

    It gives the client a ``Last-Event-ID`` to resume from before any real event is sent.

    Args:
        id: the event id to prime the client with.
        retry_ms: the reconnection delay in milliseconds, or None to omit the field.

    Returns:
        ``b"id: X\nretry: N\ndata:\n\n"`` (without the retry line when ``retry_ms`` is None).

    Raises:
        InvalidSSEField: ``id`` holds CR, LF or NUL.
        ValueError: ``retry_ms`` is not a non-negative int.
    """
    return f"{_head(None, id, retry_ms)}data:\n\n".encode()


def encode(ev: ServerSentEvent) -> bytes:
    """Re-encode a decoded event losslessly (data line breaks come back as LF).

    Args:
        ev: the event; ``ev.retry`` is in milliseconds. ``data=None`` writes no data line (the
            block sets only id / event / retry and is not dispatched by browsers).

    Returns:
        The block's bytes, fields in the order event, id, retry, data; ``b""`` when ``ev`` has
        no field at all (there is nothing to send).

    Raises:
        InvalidSSEField: ``ev.event`` or ``ev.id`` holds CR, LF or NUL.
        ValueError: ``ev.retry`` is not a non-negative int.
    """
    if ev.data is not None:
        return encode_event(ev.data, event=ev.event, id=ev.id, retry_ms=ev.retry)
    head = _head(ev.event, ev.id, ev.retry)
    return f"{head}\n".encode() if head else b""
