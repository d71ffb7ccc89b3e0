"""A bare aiohttp pass-through relay: the framework's floor under the gateway's per-call cost.

``python -m bench.aiohttp_relay --upstream URL --port N [--host 127.0.0.1]`` serves ``/mcp``
(any method) by sending the request to *URL* and copying the upstream's status, headers and
body back chunk by chunk as they arrive, and ``/readyz`` (200). It stores nothing, parses no SSE
and resumes nothing: a ``GET`` with ``Last-Event-ID`` goes upstream like any other request. It
is what any aiohttp reverse proxy costs at least, with the gateway's own aiohttp settings: one
pooled :class:`aiohttp.ClientSession` without a pool cap or read timeout, no automatic
decompression or invented headers, and a server runner with handler cancellation (a client
that leaves cancels its handler, which closes the upstream response).

Hop-by-hop headers (RFC 9110 §7.6.1) are dropped both ways, ``Host`` is the upstream's. An
upstream that cannot be reached gets ``502`` with a one-line reason. Loopback benchmarking only:
no limits, no auth, no logging beyond startup failures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Mapping

import aiohttp
from aiohttp import web

from mcp_sse_gateway import headers

#: Headers of one connection or one message's framing, never forwarded (the gateway's own set,
#: RFC 9110 §7.6.1), and ``Host``, which aiohttp sets for the upstream.
HOP_BY_HOP = headers.HOP_BY_HOP | {"host"}
#: Largest request body relayed (the gateway's default).
MAX_BODY_BYTES = 16 * 1024 * 1024
CLIENT_KEY = web.AppKey("client", aiohttp.ClientSession)
UPSTREAM_KEY = web.AppKey("upstream", str)


def _forwarded(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    return [(name, value) for name, value in headers.items() if name.lower() not in HOP_BY_HOP]


async def relay(request: web.Request) -> web.StreamResponse:
    """One request upstream and its response back, chunks copied as they arrive."""
    body = await request.read()
    client = request.app[CLIENT_KEY]
    try:
        upstream = await client.request(
            request.method,
            request.app[UPSTREAM_KEY],
            headers=_forwarded(request.headers),
            data=body or None,
            allow_redirects=False,
        )
    except (aiohttp.ClientError, OSError) as exc:
        return web.Response(status=502, text=f"upstream unreachable: {type(exc).__name__}\n")
    try:
        response = web.StreamResponse(status=upstream.status, headers=_forwarded(upstream.headers))
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        upstream.release()


async def ready(_request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def make_app(upstream_url: str) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[UPSTREAM_KEY] = upstream_url

    async def client_session(app: web.Application) -> AsyncIterator[None]:
        app[CLIENT_KEY] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
            auto_decompress=False,
            skip_auto_headers=("Accept", "User-Agent", "Accept-Encoding", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
        )
        yield
        await app[CLIENT_KEY].close()

    app.cleanup_ctx.append(client_session)
    app.router.add_get("/readyz", ready)
    app.router.add_route("*", "/mcp", relay)
    return app


async def serve(upstream_url: str, host: str, port: int) -> None:
    runner = web.AppRunner(make_app(upstream_url), handler_cancellation=True, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
        print(f"LISTENING http://{host}:{runner.addresses[0][1]}/mcp", flush=True)
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.aiohttp_relay", description=__doc__)
    parser.add_argument("--upstream", required=True, help="the upstream's MCP endpoint URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (announced)")
    args = parser.parse_args(argv)
    if not args.upstream.startswith("http://"):
        parser.error("--upstream must be an http:// URL (loopback benchmarking only)")
    asyncio.run(serve(args.upstream, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
