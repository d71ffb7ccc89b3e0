"""Script and command replies as Python values: text, and stored events built in bulk."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import cast

from mcp_sse_gateway.store.base import StoredEvent


def text(value: bytes | str) -> str:
    """A reply value as ``str``."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def stored_events(
    first: int,
    datas: Sequence[bytes | str],
    types: Sequence[bytes | str | None] | None = None,
) -> list[StoredEvent]:
    """Events at offsets *first*, *first* + 1, … with *datas* and, when given, *types*.

    *types*: each event's type, or None for an untyped one (same length as *datas*); None:
    none is typed. Built by C-level iteration (a replay makes a thousand per read, and
    upstreams commonly type every event ``message``): ``tuple.__new__`` is what
    ``StoredEvent(offset, data, event)`` calls, without its Python-level ``__new__``, and each
    distinct type is decoded once.
    """
    if not datas:
        return []
    decoded = map(text, datas)
    if isinstance(datas[0], bytes):
        decoded = map(bytes.decode, cast("Sequence[bytes]", datas))
    if types is None:
        kinds: Iterable[str | None] = itertools.repeat(None)
    else:
        # Each distinct type decoded once, for this read only: a type may be as big as an
        # event, so nothing is kept once the read is done.
        table = {value: None if value is None else text(value) for value in set(types)}
        kinds = map(table.__getitem__, types)
    rows = zip(range(first, first + len(datas)), decoded, kinds, strict=False)
    return list(map(tuple.__new__, itertools.repeat(StoredEvent), rows))
