"""The stream layer: managed streams without HTTP or Redis (DESIGN D4 to D7).

Everything a managed stream is, independent of how clients and the upstream are spoken to:

* :mod:`~mcp_sse_gateway.streams.upstream`: the seam to the upstream (a protocol; aiohttp's
  implementation lives in :mod:`mcp_sse_gateway.web.upstream`);
* :mod:`~mcp_sse_gateway.streams.pump`: one upstream SSE body into the store;
* :mod:`~mcp_sse_gateway.streams.feed`, :mod:`~mcp_sse_gateway.streams.life`,
  :mod:`~mcp_sse_gateway.streams.registry`: a stream life's in-memory tail, its phases and
  its one reader; every background task;
* :mod:`~mcp_sse_gateway.streams.delivery`: the state machine writing one stream to one client
  sink (an SSE response in production);
* :mod:`~mcp_sse_gateway.streams.requests`, :mod:`~mcp_sse_gateway.streams.resumes`,
  :mod:`~mcp_sse_gateway.streams.standalone`: POST streams (:mod:`.upgrade`: JSON answers as
  streams), resumes, the session's standalone GET stream;
* :mod:`~mcp_sse_gateway.streams.tasks`: tool calls run as tasks for clients of the 2026-07-28
  era (:mod:`.task_record`: their records and wire shapes).

It imports neither aiohttp nor redis (checked by import-linter in CI); ``web/`` depends on it,
never the reverse. See docs/architecture.md.
"""

from __future__ import annotations

from mcp_sse_gateway.streams.context import StreamContext
from mcp_sse_gateway.streams.requests import RequestStreams
from mcp_sse_gateway.streams.resumes import Resumes
from mcp_sse_gateway.streams.standalone import StandaloneStreams
from mcp_sse_gateway.streams.tasks import Tasks


class Streams:
    """The stream layer of one app: request streams, resumes and standalone streams."""

    def __init__(self, ctx: StreamContext) -> None:
        self.ctx = ctx
        self.requests = RequestStreams(ctx)
        self.resumes = Resumes(ctx)
        self.standalone = StandaloneStreams(ctx)
        self.tasks = Tasks(ctx)


__all__ = ["RequestStreams", "Resumes", "StandaloneStreams", "StreamContext", "Streams", "Tasks"]
