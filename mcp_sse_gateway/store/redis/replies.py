"""Script and command replies as Python values: text, and stored events built in bulk."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import cast

from mcp_sse_gateway.store.base import StoredEvent


def text(value: bytes | str) -> str:
    """A reply value as ``str``."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def stored_events(first: int, datas: Sequence[bytes | str]) -> list[StoredEvent]:
    """Events at offsets *first*, *first* + 1, … with *datas*, without an event type.

    Built by C-level iteration (a replay makes a thousand per read): ``tuple.__new__`` is what
    ``StoredEvent(offset, data)`` calls, without its Python-level ``__new__``.
    """
    if not datas:
        return []
    decoded = map(text, datas)
    if isinstance(datas[0], bytes):
        decoded = map(bytes.decode, cast("Sequence[bytes]", datas))
    rows = zip(range(first, first + len(datas)), decoded, itertools.repeat(None))
    return list(map(tuple.__new__, itertools.repeat(StoredEvent), rows))
