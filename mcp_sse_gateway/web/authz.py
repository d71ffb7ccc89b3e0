"""Resume authorization against the upstream (DESIGN D8): the probe, its cache, its answers.

:class:`Authorizer` is asked before the gateway serves anything from its store: a resume, a
plain GET that joins the session's open standalone stream. It decides with
:func:`mcp_sse_gateway.auth.decide`; when that says "probe", it sends the upstream one
JSON-RPC ``ping`` in the session with the request's own headers (its credentials):

======================================  ==================================================
upstream answer                         the client gets
======================================  ==================================================
2xx with the JSON-RPC result of the     served (after the principal rules), cached
ping (or an error that shows it was
dispatched: -32600, -32601, -32602)
401, 403, 404, 429                      that answer verbatim (``WWW-Authenticate`` too);
                                        a 404 to the creator also tombstones the session
5xx, timeout, unreachable               503 + ``Retry-After``
anything else (a 2xx without that       403
response: a sign-in page, a 202)
======================================  ==================================================

Concurrent probes of the same session and credentials share one request. A 2xx body is read
until the ping's response and a refusal's is relayed with it, each at most
:data:`PROBE_MAX_BODY_BYTES`; neither is ever stored.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import secrets
import time
from dataclasses import dataclass, field
from http import HTTPStatus

import aiohttp
import structlog
from aiohttp import web

from mcp_sse_gateway import auth, jsonrpc
from mcp_sse_gateway.config import AuthSettings, Settings
from mcp_sse_gateway.errors import (
    AuthUnavailable,
    ResumeForbidden,
    SSEError,
    StoreError,
    UpstreamError,
)
from mcp_sse_gateway.headers import client_response_headers, peer_trusted
from mcp_sse_gateway.metrics import Metrics
from mcp_sse_gateway.sse import SSEDecoder
from mcp_sse_gateway.store.base import EventStore, session_digest
from mcp_sse_gateway.web.upstream import open_upstream

log = structlog.get_logger("mcp_sse_gateway.auth")

#: At most this much of a probe's answer is read (never stored; relayed only with a refusal).
PROBE_MAX_BODY_BYTES = 64 * 1024
#: Upstream answers to a probe that are relayed to the client as they are.
RELAYED_REFUSALS = frozenset({401, 403, 404, 429})
#: Positive checks kept per replica (session, credentials); the oldest go first.
MAX_CACHED_CHECKS = 65_536
#: The JSON-RPC id of every probe starts with this (the rest is random): reserved for the
#: gateway, so upstream logs and metering can tell probes apart.
PROBE_ID_PREFIX = "mcp-sse-gateway/auth-probe/"
#: JSON-RPC errors that show the ping was dispatched, so past the upstream's authentication:
#: invalid request, method not found, invalid params. Other errors (an in-dispatcher
#: "unauthorized", a server error) authorize nothing.
DISPATCHED_ERRORS = frozenset({-32600, -32601, -32602})
#: Request headers a probe does not take from the request (it sets its own).
_NOT_FORWARDED = frozenset({"content-type", "accept", "last-event-id", "content-length"})


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """What the upstream answered one probe.

    Attributes:
        status: the HTTP status, or None when there was no answer (timeout, unreachable).
        headers: its headers (end-to-end only), in order.
        body: up to :data:`PROBE_MAX_BODY_BYTES` of its body.
        complete: *body* is the whole body.
        answered: a 2xx carried the JSON-RPC response to the probe's ping.
    """

    status: int | None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    complete: bool = True
    answered: bool = False


def probe_request(
    session_id: str, protocol_version: str | None
) -> tuple[str, bytes, dict[str, str]]:
    """The JSON-RPC id, body and gateway-set headers of one probe: a ``ping`` in the session."""
    probe_id = PROBE_ID_PREFIX + secrets.token_hex(8)
    body = json.dumps({"jsonrpc": "2.0", "id": probe_id, "method": "ping"}).encode()
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Mcp-Session-Id": session_id,
    }
    if protocol_version:
        headers["MCP-Protocol-Version"] = protocol_version
    return probe_id, body, headers


def _token_only(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Of a request's upstream headers, those a token-only probe keeps.

    See :func:`mcp_sse_gateway.auth.probe_token_only`.
    """
    keep = {"authorization", "mcp-protocol-version", "traceparent", "tracestate"}
    return [(n, v) for n, v in headers if n.lower() in keep]


class Authorizer:
    """Authorizes what the gateway serves from its store, for one app (see the module doc).

    Args:
        settings: the gateway's settings (``auth``, ``server.trusted_proxies``, ``upstream``).
        store: to tombstone a session the upstream no longer knows.
        metrics: probes by outcome, refusals by reason, store answers served without a probe.
        key: the credential digest key.
    """

    def __init__(self, settings: Settings, store: EventStore, metrics: Metrics, key: bytes) -> None:
        self._settings = settings
        self._auth: AuthSettings = settings.auth
        self._store = store
        self._metrics = metrics
        self.reader = auth.CredentialReader(settings.auth, key, auth.load_jwks(settings.auth))
        self._cache: collections.OrderedDict[tuple[str, str, str], float] = (
            collections.OrderedDict()
        )
        self._inflight: dict[tuple[str, ...], asyncio.Task[ProbeAnswer]] = {}
        self._warned_anonymous = False
        self.client: aiohttp.ClientSession | None = None

    def presented(self, request: web.Request) -> auth.Presented:
        """The credentials *request* (to the MCP endpoint) presents, its query string included."""
        trusted = peer_trusted(request.remote, self._settings.server.trusted_proxies)
        return self.reader.presented(
            list(request.headers.items()),
            trusted_peer=trusted,
            query=request.rel_url.raw_query_string,
        )

    def binding(self, request: web.Request) -> tuple[str, str]:
        """What a record *request* creates keeps of its credentials.

        Returns:
            The encoded binding (its credentials, accepted now) and the ``creator`` whose
            finished streams a new stream may evict (the verified principal, else the
            credentials' digest); both ``""`` when authorization is off.
        """
        if self._auth.resume == "none":
            return "", ""
        presented = self.presented(request)
        # Requests without credentials share one creator: they may evict each other's finished
        # streams (in front of an upstream without authorization, a session's many calls must
        # make room for new ones), never a credentialed creator's.
        # A verified principal outlives its tokens: a refreshed one may evict its own streams.
        creator = presented.principal if presented.principal_verified else None
        return presented.binding().encode(), creator or presented.digest

    def may_end_session(self, binding: str, request: web.Request) -> bool:
        """Whether *request* may make the gateway forget the session on an upstream 404."""
        if self._auth.resume == "none":
            return True
        return auth.is_creator(auth.Binding.decode(binding), self.presented(request))

    async def authorize(
        self,
        request: web.Request,
        *,
        session_id: str,
        binding: str,
        url: object,
        headers: list[tuple[str, str]],
        protocol_version: str | None,
    ) -> web.StreamResponse | None:
        """Check *request*'s credentials before serving it from the store.

        Args:
            request: the client's request (its credentials are read from it).
            session_id: its ``Mcp-Session-Id``.
            binding: the encoded binding of what it asks for (the stream's, else the session's;
                ``""`` when the gateway has none).
            url: the upstream URL a probe goes to.
            headers: the request's upstream headers (its credentials go with the probe).
            protocol_version: the session's recorded version, sent when the request has none.

        Returns:
            None when authorized, else the response to answer with (the upstream's refusal).

        Raises:
            ResumeForbidden: the credentials are not the creator's where that is required (403).
            AuthUnavailable: the upstream could not be asked (503 + ``Retry-After``).
        """
        presented = self.presented(request)
        stored = auth.Binding.decode(binding)
        now = time.time()
        probe_key = (session_digest(session_id), presented.digest)
        # A positive check holds for records of the same creator principal only: the principal
        # rules were applied against that one (a session may hold streams of several users).
        cache_key = (*probe_key, stored.principal if stored is not None else "")
        decision = auth.decide(
            self._auth, stored, presented, now=now, cached_until=self._cached(cache_key)
        )
        if decision.verdict is auth.Verdict.SERVE:
            self._metrics.auth_served.labels(decision.reason).inc()
            return None
        if decision.verdict is auth.Verdict.REFUSE:
            self._refused(decision.reason)
            raise ResumeForbidden
        if presented.anonymous and not self._warned_anonymous:
            self._warned_anonymous = True
            log.warning(
                "auth.anonymous_resume",
                hint="a request without credentials is checked with the upstream every time; "
                "name the upstream's credentials in auth.credential_headers or "
                "auth.credential_cookies, or set auth.resume = 'none' for an upstream "
                "without authorization",
            )
        token_only = auth.probe_token_only(self._auth, presented)
        # Anonymous requests are nobody in particular: each is asked about on its own (sharing
        # would hand one client the answer to another's, differently credentialed, probe).
        share = secrets.token_hex(8) if presented.anonymous else ("token" if token_only else "all")
        answer = await self._shared_probe(
            (*probe_key, share),
            session_id,
            url,
            _token_only(headers) if token_only else headers,
            protocol_version,
        )
        outcome = _outcome(answer)
        self._metrics.auth_probes.labels(outcome).inc()
        log.info("auth.probed", outcome=outcome, status=answer.status)
        if outcome == "ok":
            after = auth.accept_after_probe(self._auth, stored, presented)
            if after.verdict is not auth.Verdict.SERVE:
                self._refused(after.reason)
                raise ResumeForbidden
            if not presented.anonymous:
                self._remember(cache_key, auth.cache_until(self._auth, presented, now))
            self._metrics.auth_served.labels("probed").inc()
            return None
        if answer.status is None or answer.status >= HTTPStatus.INTERNAL_SERVER_ERROR:
            self._refused("upstream_unavailable")
            raise AuthUnavailable
        if answer.status not in RELAYED_REFUSALS:
            # A 2xx that is no JSON-RPC answer to the ping (a sign-in page, a 202), a 3xx …
            self._refused("upstream_other")
            raise ResumeForbidden
        self._refused(f"upstream_{answer.status}")
        if answer.status == HTTPStatus.NOT_FOUND and auth.is_creator(stored, presented):
            # The upstream no longer knows the session (it restarted): forget it, as a DELETE's
            # 404 does. Only for the creator: another user's 404 must not end a victim's session.
            with contextlib.suppress(StoreError):
                await self._store.tombstone_session(session_id)
            log.info("session.gone_upstream")
        return _refusal(answer)

    def _cached(self, key: tuple[str, str, str]) -> float | None:
        until = self._cache.get(key)
        if until is not None and until <= time.time():
            del self._cache[key]
            return None
        return until

    def _remember(self, key: tuple[str, str, str], until: float) -> None:
        self._cache[key] = until
        self._cache.move_to_end(key)
        while len(self._cache) > MAX_CACHED_CHECKS:
            self._cache.popitem(last=False)

    def _refused(self, reason: str) -> None:
        self._metrics.auth_refusals.labels(reason).inc()
        log.info("auth.refused", reason=reason)

    async def _shared_probe(
        self,
        key: tuple[str, ...],
        session_id: str,
        url: object,
        headers: list[tuple[str, str]],
        protocol_version: str | None,
    ) -> ProbeAnswer:
        """One probe per (session, credentials) at a time; every concurrent asker gets its answer.

        The probe runs in a task of its own, so a client that leaves does not cancel it for
        the others.
        """
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._probe(session_id, url, headers, protocol_version), name="auth.probe"
            )
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._forget(key, done))
        await asyncio.wait({task})
        return task.result()

    def _forget(self, key: tuple[str, ...], task: asyncio.Task[ProbeAnswer]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]

    async def _probe(
        self,
        session_id: str,
        url: object,
        headers: list[tuple[str, str]],
        protocol_version: str | None,
    ) -> ProbeAnswer:
        assert self.client is not None, "the upstream client is set at start-up"
        probe_id, body, own = probe_request(session_id, None)
        forwarded = [(n, v) for n, v in headers if n.lower() not in _NOT_FORWARDED]
        if protocol_version and not any(n.lower() == "mcp-protocol-version" for n, _ in forwarded):
            own["MCP-Protocol-Version"] = protocol_version
        forwarded = [(n, v) for n, v in forwarded if n.lower() != "mcp-session-id"]
        started = time.perf_counter()
        answer: ProbeAnswer | None = None
        try:
            async with asyncio.timeout(self._auth.probe_timeout_s):
                try:
                    response, _ = await open_upstream(
                        self.client,
                        "POST",
                        url,  # type: ignore[arg-type]
                        [*forwarded, *own.items()],
                        body,
                        headers_timeout_s=self._auth.probe_timeout_s,
                    )
                except UpstreamError as exc:
                    log.warning("auth.probe_failed", error=type(exc).__name__)
                    return ProbeAnswer(None)
                async with response:
                    if 200 <= response.status < 300:  # noqa: PLR2004
                        # A 2xx counts only with the JSON-RPC answer to this ping in it (a
                        # result or an error): a sign-in page served with 200 is no consent.
                        answered = await _answers(response, probe_id)
                        return ProbeAnswer(response.status, answered=answered)
                    relayed = client_response_headers(
                        list(response.headers.items()), keep_length=False
                    )
                    answer = ProbeAnswer(response.status, relayed, b"", complete=False)
                    with contextlib.suppress(aiohttp.ClientError, OSError):
                        read, complete = await _read_bounded(response, PROBE_MAX_BODY_BYTES)
                        answer = ProbeAnswer(response.status, relayed, read, complete)
                    return answer
        except TimeoutError:
            if answer is not None:
                # The status came in time; only the body did not (it is not needed to decide).
                return answer
            log.warning("auth.probe_timed_out", timeout_s=self._auth.probe_timeout_s)
            return ProbeAnswer(None)
        finally:
            self._metrics.auth_probe_seconds.observe(time.perf_counter() - started)

    async def close(self) -> None:
        """Cancel probes still running (shutdown)."""
        for task in list(self._inflight.values()):
            task.cancel()
        for task in list(self._inflight.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """Up to *limit* bytes of *response*'s body, and whether that is all of it."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], False
    return b"".join(chunks), True


def _outcome(answer: ProbeAnswer) -> str:
    """The probe outcome label: ``ok``, ``401`` … (relayed refusals), ``unavailable``, ``other``."""
    status = answer.status
    if status is None or status >= HTTPStatus.INTERNAL_SERVER_ERROR:
        return "unavailable"
    if 200 <= status < 300 and answer.answered:  # noqa: PLR2004
        return "ok"
    if status in RELAYED_REFUSALS:
        return str(status)
    return "other"


def _is_answer(data: bytes | str, probe_id: str) -> bool:
    """Whether *data* is JSON holding a JSON-RPC result (or dispatched error) for *probe_id*."""
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        return False
    messages = message if isinstance(message, list) else [message]
    return any(
        isinstance(m, dict)
        and m.get("id") == probe_id
        and (
            "result" in m
            or (isinstance(m.get("error"), dict) and m["error"].get("code") in DISPATCHED_ERRORS)
        )
        for m in messages
    )


async def _answers(response: aiohttp.ClientResponse, probe_id: str) -> bool:
    """Whether *response* (a 2xx) carries the JSON-RPC response to the ping *probe_id*.

    JSON is read whole (at most :data:`PROBE_MAX_BODY_BYTES`); an event stream is read until
    that response (the same bound), so an upstream that keeps it open costs nothing more.
    """
    if response.content_type == "application/json":
        body, complete = await _read_bounded(response, PROBE_MAX_BODY_BYTES)
        return complete and _is_answer(body, probe_id)
    if response.content_type != "text/event-stream":
        return False
    decoder = SSEDecoder(max_event_bytes=PROBE_MAX_BODY_BYTES)
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        try:
            events = [] if size > PROBE_MAX_BODY_BYTES else decoder.feed(chunk)
        except SSEError:
            return False
        if size > PROBE_MAX_BODY_BYTES:
            return False
        if any(e.data and probe_id in e.data and _is_answer(e.data, probe_id) for e in events):
            return True
    return False


def _refusal(answer: ProbeAnswer) -> web.Response:
    """The upstream's refusal as the client gets it: status, headers and body as they were.

    A body longer than :data:`PROBE_MAX_BODY_BYTES` is replaced by a JSON-RPC error.
    """
    assert answer.status is not None
    out = web.Response(status=answer.status)
    headers = answer.headers
    body = answer.body
    if not answer.complete:
        headers = [
            (n, v) for n, v in headers if n.lower() not in {"content-type", "content-encoding"}
        ]
        headers.append(("Content-Type", "application/json"))
        body = json.dumps(
            jsonrpc.error_response(None, -32600, HTTPStatus(answer.status).phrase)
        ).encode()
    for name, value in headers:
        out.headers.add(name, value)
    out.body = body
    return out
