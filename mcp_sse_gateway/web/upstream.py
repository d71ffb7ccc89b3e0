"""The one seam to the upstream: open a request, get response headers, map failures.

Foreign exceptions (aiohttp's) are mapped here, once, to the gateway's
:class:`~mcp_sse_gateway.errors.UpstreamError` tree, raised ``from`` the original.
Nothing is retried: a POST may carry a JSON-RPC request that must not run twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import aiohttp
from yarl import URL

from mcp_sse_gateway.config import UpstreamSettings
from mcp_sse_gateway.errors import UpstreamConnectError, UpstreamProtocolError, UpstreamTimeout


def make_client_session(settings: UpstreamSettings) -> aiohttp.ClientSession:
    """The pooled HTTP client used for every upstream request.

    No pool cap by default (``max_connections = 0``): a cap would queue tool calls behind
    long-running streams. Only the connect phase has a socket timeout; the wait for response
    headers is bounded per request by :func:`open_upstream`, and a quiet stream is never cut.
    """
    connector = aiohttp.TCPConnector(
        limit=settings.max_connections,
        limit_per_host=0,
        enable_cleanup_closed=False,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=settings.connect_timeout_s, sock_read=None
        ),
        auto_decompress=False,
        # The relay sends exactly the client's headers: no invented Accept (a client that sent
        # none must get the upstream's own answer to that, a 406 say), User-Agent,
        # Accept-Encoding or Content-Type.
        skip_auto_headers=("Accept", "User-Agent", "Accept-Encoding", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
    )


async def open_upstream(
    client: aiohttp.ClientSession,
    method: str,
    url: URL,
    headers: Sequence[tuple[str, str]],
    body: bytes | None,
    *,
    headers_timeout_s: float,
) -> tuple[aiohttp.ClientResponse, float]:
    """Send one request upstream and wait for its response headers.

    Redirects are never followed (the client gets the 3xx as is).

    Args:
        client: from :func:`make_client_session`.
        method: the HTTP method, as received.
        url: absolute upstream URL (always the configured origin).
        headers: from :func:`mcp_sse_gateway.headers.upstream_request_headers`.
        body: the request body, or None for none.
        headers_timeout_s: bound on the wait for response headers, seconds.

    Returns:
        The response, body not yet read (the caller must release or close it), and the wait
        for headers in seconds.

    Raises:
        UpstreamConnectError: connection refused, DNS or TLS failure, connect timeout.
        UpstreamTimeout: no response headers within ``headers_timeout_s``.
        UpstreamProtocolError: the upstream closed the connection or sent invalid HTTP.

    Cancelling closes the upstream connection; nothing is retried.
    """
    started = time.perf_counter()
    try:
        async with asyncio.timeout(headers_timeout_s):
            response = await client.request(
                method, url, headers=list(headers), data=body, allow_redirects=False
            )
    except TimeoutError as exc:
        raise UpstreamTimeout("no response headers from the upstream in time") from exc
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
        raise UpstreamConnectError("cannot connect to the upstream") from exc
    except (aiohttp.ClientError, ValueError) as exc:
        raise UpstreamProtocolError("the upstream failed before answering") from exc
    return response, time.perf_counter() - started
