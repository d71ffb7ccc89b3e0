"""Server-sent events codec: an incremental decoder and an encoder, sans-IO.

Exact to WHATWG HTML, "Server-sent events": §9.2.5 "Parsing an event stream" (UTF-8 decoding,
one leading BOM stripped, CRLF / LF / CR line ends, comments, ``field: value`` lines) and §9.2.6
"Interpreting an event stream" (the ``data``, ``event``, ``id`` and ``retry`` fields, the last
event ID buffer and string, dispatch on an empty line, incomplete block discarded at EOF).

Round trip: ``SSEDecoder().feed(encode(ev))`` gives back ``[ev]`` exactly (for an ``ev`` with
at least one field), except that line breaks in ``data`` (CRLF, CR, LF) come back as LF: the
wire format cannot tell them apart.

This package imports neither aiohttp nor redis. Every name is re-exported here; one job per
module:

* :mod:`.event`: :class:`ServerSentEvent`, one event block.
* :mod:`.decoder`: :class:`SSEDecoder`, bytes in, blocks out (§9.2.5 and §9.2.6).
* :mod:`.encoder`: :func:`encode` and the ``encode_*`` functions, blocks out as bytes
  (:func:`format_event`, :func:`format_head`: as text).
"""

from mcp_sse_gateway.sse.decoder import SSEDecoder
from mcp_sse_gateway.sse.encoder import (
    encode,
    encode_comment,
    encode_event,
    encode_priming,
    encode_retry,
    format_event,
    format_head,
)
from mcp_sse_gateway.sse.event import ServerSentEvent

__all__ = [
    "SSEDecoder",
    "ServerSentEvent",
    "encode",
    "encode_comment",
    "encode_event",
    "encode_priming",
    "encode_retry",
    "format_event",
    "format_head",
]
