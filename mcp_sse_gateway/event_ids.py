"""Event ids of managed streams: a stream life and a sequential offset, opaque to clients.

Wire form (ASCII, never CR/LF/NUL; MCP 2025-11-25 transports, "Resumability and Redelivery"):

* ``<life>-<offset>`` for a stored event: *life* is 32 lower-case hex digits (128 random bits,
  new for every stream life), *offset* the event's position in that life (1, 2, …, decimal,
  no leading zeros);
* ``<life>-<offset>-<nonce>`` for a priming event: as a cursor it means "everything up to
  *offset* was received" (it loses nothing), and the nonce keeps every id the session sees
  unique even when several connections prime at the same offset.

An id is meaningful only together with the request's ``Mcp-Session-Id``: streams are looked up
under the session, so an id of another session is simply unknown. Sans-IO.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

LIFE_HEX_DIGITS = 32
#: Offsets above this are refused (a bound keeps the parser's work constant for hostile input).
#: 2^53 - 1: exact in the Redis store's Lua numbers. A re-created standalone stream life starts
#: after the current time in microseconds (about 1.8 x 10^15), well below it.
MAX_OFFSET = 2**53 - 1
#: Longer values are refused before any parsing.
MAX_ID_LENGTH = 64
_EVENT_ID = re.compile(r"\A([0-9a-f]{32})-(0|[1-9][0-9]{0,15})(?:-([0-9a-f]{8}))?\Z")


@dataclass(frozen=True, slots=True)
class Cursor:
    """A parsed event id: the client has received every event of *life* up to *offset*.

    Attributes:
        life: the stream life (32 hex digits).
        offset: last offset received; 0 means "nothing yet" (a priming event's cursor).
    """

    life: str
    offset: int


def new_life() -> str:
    """A fresh stream life id: 128 random bits as 32 lower-case hex digits."""
    return secrets.token_hex(LIFE_HEX_DIGITS // 2)


def event_id(life: str, offset: int) -> str:
    """The wire id of the event at *offset* (≥ 1) of *life*."""
    return f"{life}-{offset}"


def priming_id(life: str, offset: int) -> str:
    """A unique wire id for a priming event whose cursor is *offset* (≥ 0) of *life*."""
    return f"{life}-{offset}-{secrets.token_hex(4)}"


def parse_event_id(value: str | None) -> Cursor | None:
    """Parse a ``Last-Event-ID`` value.

    Returns:
        The cursor, or None when the value is not an id this gateway mints (the caller answers
        400 without echoing it).
    """
    if not value or len(value) > MAX_ID_LENGTH:
        return None
    match = _EVENT_ID.match(value)
    if match is None:
        return None
    offset = int(match.group(2))
    if offset > MAX_OFFSET:
        return None
    return Cursor(match.group(1), offset)
