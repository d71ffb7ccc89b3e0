"""The bundled example MCP server as a real process on a free loopback port, for tests.

    from tests.support.upstream import example_upstream_process, start_example_upstream

    async with start_example_upstream() as url:             # "http://127.0.0.1:<port>/mcp"
        ...
    async with start_example_upstream("--json-response") as url:
        ...
    async with example_upstream_process("--stateless") as upstream:
        upstream.url, upstream.port, upstream.process, upstream.stderr_tail()
        upstream.kill()                                     # crash it on purpose (SIGKILL)

``start_example_upstream(*args)`` runs ``python -m mcp_sse_gateway.example --host 127.0.0.1
--port 0 *args``, waits for its ``LISTENING <url>`` line (deadline ``start_timeout_s``, default
30 s; :class:`UpstreamStartError` with its stderr otherwise) and stops it when the block is
left, however it is left (SIGTERM, SIGKILL after ``stop_timeout_s``). The implementation lives
in :mod:`mcp_sse_gateway.example.process`, shared with ``mcp-sse-gateway demo``.
"""

from __future__ import annotations

from mcp_sse_gateway.example.process import (
    RunningUpstream,
    UpstreamStartError,
    example_upstream_process,
)
from mcp_sse_gateway.example.process import example_upstream as start_example_upstream

__all__ = [
    "RunningUpstream",
    "UpstreamStartError",
    "example_upstream_process",
    "start_example_upstream",
]
