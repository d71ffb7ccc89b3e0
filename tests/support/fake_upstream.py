"""A scripted upstream and a list sink: the stream layer's seams, faked for unit tests.

:class:`ScriptedUpstream` answers each ``open`` with the next scripted :class:`ScriptedResponse`
(or raises the next scripted error) and records the requests; a response's body is a list of
chunks, or an :class:`asyncio.Queue` fed by the test (``None`` ends it, an exception breaks it).
:class:`ListSink` is a client sink that keeps what was written.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from yarl import URL

from mcp_sse_gateway.errors import ClientGone, SlowReader, UpstreamBroken
from mcp_sse_gateway.sse import ServerSentEvent, SSEDecoder

URL_ = URL("http://upstream.test/mcp")


class ScriptedResponse:
    """One scripted upstream response.

    Args:
        status: the HTTP status.
        content_type: the media type (``text/event-stream`` for a stream).
        body: chunks, or a queue the test feeds (None ends the body, an exception is raised
            from the body as :class:`UpstreamBroken`).
        headers: extra response headers.
    """

    def __init__(
        self,
        status: int = 200,
        content_type: str = "text/event-stream",
        body: Sequence[bytes] | asyncio.Queue[bytes | BaseException | None] = (),
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.status = status
        self.reason: str | None = None
        self.content_type = content_type
        self.headers = [("Content-Type", content_type), *headers]
        self._body = body
        self.closed = False

    def header(self, name: str) -> str | None:
        """The first value of header *name*."""
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The scripted body."""
        if isinstance(self._body, asyncio.Queue):
            while (item := await self._body.get()) is not None:
                if isinstance(item, BaseException):
                    raise UpstreamBroken("scripted") from item
                yield item
            return
        for chunk in self._body:
            yield chunk

    def close(self) -> None:
        """Record the close."""
        self.closed = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.closed = True


@dataclass
class Sent:
    """One request the scripted upstream got."""

    method: str
    url: URL
    headers: list[tuple[str, str]]
    body: bytes | None
    headers_timeout_s: float | None = None


@dataclass
class ScriptedUpstream:
    """Answers each ``open`` with the next scripted response or error."""

    script: deque[ScriptedResponse | BaseException] = field(default_factory=deque)
    sent: list[Sent] = field(default_factory=list)

    def then(self, *answers: ScriptedResponse | BaseException) -> ScriptedUpstream:
        """Script the next answers, in order."""
        self.script.extend(answers)
        return self

    async def open(
        self,
        method: str,
        url: URL,
        headers: Sequence[tuple[str, str]],
        body: bytes | None,
        *,
        headers_timeout_s: float | None = None,
    ) -> ScriptedResponse:
        """The next scripted answer (an error is raised)."""
        self.sent.append(Sent(method, url, list(headers), body, headers_timeout_s))
        if not self.script:
            raise AssertionError(f"unscripted upstream request: {method} {url}")
        answer = self.script.popleft()
        if isinstance(answer, BaseException):
            raise answer
        return answer


def sse(*datas: str, event_id: str | None = None) -> bytes:
    """SSE messages with *datas*, optionally each with the upstream's own id."""
    head = f"id: {event_id}\n" if event_id else ""
    return "".join(f"{head}data: {data}\n\n" for data in datas).encode()


class ListSink:
    """A client sink keeping what was written; it can be told to fail its writes.

    Attributes:
        writes: every write, in order.
        ended: ``end`` was called.
        aborted: ``abort`` was called.
        fail_with: raised from the next write (then cleared), e.g. SlowReader or ClientGone.
        blocked: ``write_now`` declines every write (a client whose buffer is full).
        written_now: writes ``write_now`` took.
    """

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.ended = False
        self.aborted = False
        self.fail_with: type[SlowReader] | type[ClientGone] | None = None
        #: write_now declines (as a full client buffer would), and how many it took.
        self.blocked = False
        self.written_now = 0
        self._news = asyncio.Event()

    async def write(self, data: bytes) -> None:
        """Keep *data*, or raise what the test asked for."""
        if self.fail_with is not None:
            failure, self.fail_with = self.fail_with, None
            raise failure
        self.writes.append(data)
        self._news.set()

    def write_now(self, data: bytes) -> bool:
        """Keep *data* unless the test blocks immediate writes or asked a write to fail."""
        if self.blocked or self.fail_with is not None:
            return False
        self.writes.append(data)
        self.written_now += 1
        self._news.set()
        return True

    async def end(self, last: bytes = b"") -> None:
        """Keep *last* (or raise what the test asked for), then record the end."""
        if last:
            await self.write(last)
        self.ended = True

    def abort(self) -> None:
        """Record the abort."""
        self.aborted = True

    def events(self) -> list[ServerSentEvent]:
        """Everything written, decoded as SSE (comments dropped)."""
        return SSEDecoder(max_event_bytes=1 << 20).feed(b"".join(self.writes))

    def datas(self) -> list[str]:
        """The data of every event that has data (the priming event has none)."""
        return [e.data for e in self.events() if e.data]

    async def wait_for(self, count: int, timeout_s: float = 10.0) -> None:
        """Wait until *count* events with data were written."""
        async with asyncio.timeout(timeout_s):
            while len(self.datas()) < count:
                self._news.clear()
                await self._news.wait()
