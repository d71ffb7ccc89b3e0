"""A deliberately small, independent SSE reader for tests (the gateway's codec is not used,
so a bug there cannot hide itself). Handles LF/CRLF/CR, comments, multi-line data."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp

_LINE = re.compile(rb"\r\n|\r|\n")


@dataclass
class Event:
    data: str | None = None
    event: str | None = None
    id: str | None = None
    retry: int | None = None
    comments: list[str] = field(default_factory=list)


def parse(wire: bytes) -> list[Event]:
    """Every block of *wire* (complete or not) that has at least one field or comment."""
    events: list[Event] = []
    current = Event()
    touched = False
    for line in _LINE.split(wire):
        text = line.decode()
        if text == "":
            if touched:
                events.append(current)
            current, touched = Event(), False
            continue
        touched = True
        if text.startswith(":"):
            current.comments.append(text[1:].strip())
            continue
        name, _, value = text.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            current.data = value if current.data is None else current.data + "\n" + value
        elif name == "event":
            current.event = value
        elif name == "id":
            current.id = value
        elif name == "retry":
            current.retry = int(value)
    return events


def json_messages(events: list[Event]) -> list[Any]:
    """The JSON-RPC messages of *events*: the data of each event that has any, parsed."""
    return [json.loads(e.data) for e in events if e.data]


async def read_events(
    response: aiohttp.ClientResponse, *, until: int | None = None, timeout_s: float = 10
) -> tuple[list[Event], bool]:
    """Read until at least *until* complete blocks arrived or the stream ended.

    Returns:
        The blocks read (every complete one received, possibly more than *until*) and whether
        the stream ended (EOF).
    """
    events: list[Event] = []
    pending = b""
    async with asyncio.timeout(timeout_s):
        while until is None or len(events) < until:
            chunk = await response.content.readany()
            if not chunk:
                return events + parse(pending), True
            pending += chunk
            normalised = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            cut = normalised.rfind(b"\n\n")
            if cut != -1 and not pending.endswith(b"\r"):
                events += parse(normalised[: cut + 2])
                pending = normalised[cut + 2 :]
    return events, False
