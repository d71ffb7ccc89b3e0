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

The probe itself (its request, the reading of its answer, the refusal relayed) is in
:mod:`mcp_sse_gateway.web.probe`; this module holds the decisions and the cache.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import secrets
import time
from http import HTTPStatus

import structlog
from aiohttp import web

from mcp_sse_gateway import auth
from mcp_sse_gateway.config import AuthSettings, Settings
from mcp_sse_gateway.errors import AuthUnavailable, ResumeForbidden, StoreError
from mcp_sse_gateway.headers import peer_trusted
from mcp_sse_gateway.metrics import Metrics
from mcp_sse_gateway.store.base import EventStore, session_digest
from mcp_sse_gateway.web.probe import (
    DISPATCHED_ERRORS,
    PROBE_ID_PREFIX,
    PROBE_MAX_BODY_BYTES,
    RELAYED_REFUSALS,
    ProbeAnswer,
    probe_outcome,
    probe_request,
    refusal_response,
    send_probe,
    token_only_headers,
)
from mcp_sse_gateway.web.upstream import HttpUpstream

__all__ = [
    "DISPATCHED_ERRORS",
    "MAX_CACHED_CHECKS",
    "PROBE_ID_PREFIX",
    "PROBE_MAX_BODY_BYTES",
    "RELAYED_REFUSALS",
    "Authorizer",
    "ProbeAnswer",
    "probe_request",
]

log = structlog.get_logger("mcp_sse_gateway.auth")

#: Positive checks kept per replica (session, credentials); the oldest go first.
MAX_CACHED_CHECKS = 65_536


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
        self.upstream: HttpUpstream | None = None

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
        return self.is_creator(binding, request)

    def is_creator(self, binding: str, request: web.Request) -> bool:
        """Whether *request* presents the credentials of the record bound by *binding*.

        Always true when authorization is off (``auth.resume = "none"``).
        """
        if self._auth.resume == "none":
            return True
        return auth.is_creator(auth.Binding.decode(binding), self.presented(request))

    def owns_task(self, binding: str, request: web.Request) -> bool:
        """Whether *request* may see and change the task bound by *binding* (DESIGN D11, D8).

        The creator's credentials (or verified principal) only; a task created without
        credentials (an upstream that takes anonymous calls) is any anonymous request's that
        knows its id (128 random bits), never a credentialed one's. Always true when
        authorization is off.
        """
        if self._auth.resume == "none":
            return True
        presented = self.presented(request)
        if not presented.anonymous:
            return auth.is_creator(auth.Binding.decode(binding), presented)
        created = auth.Binding.decode(binding)
        return created is not None and hmac.compare_digest(created.credentials, presented.digest)

    async def authorize(
        self,
        request: web.Request,
        *,
        session_id: str | None,
        binding: str,
        url: object,
        headers: list[tuple[str, str]],
        protocol_version: str | None,
        scope: str | None = None,
    ) -> web.StreamResponse | None:
        """Check *request*'s credentials before serving it from the store.

        Args:
            request: the client's request (its credentials are read from it).
            session_id: its ``Mcp-Session-Id``; None for a request of the 2026-07-28 era (a
                task's, DESIGN D11), whose probe is a self-contained ``ping``.
            scope: what the check is about, when there is no session (the store's key of the
                task): checks are cached and shared per scope and credentials.
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
        probe_key = (session_digest(scope or session_id or ""), presented.digest)
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
            token_only_headers(headers) if token_only else headers,
            protocol_version,
        )
        outcome = probe_outcome(answer)
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
        if (
            session_id is not None
            and answer.status == HTTPStatus.NOT_FOUND
            and auth.is_creator(stored, presented)
        ):
            # The upstream no longer knows the session (it restarted): forget it, as a DELETE's
            # 404 does. Only for the creator: another user's 404 must not end a victim's session.
            with contextlib.suppress(StoreError):
                await self._store.tombstone_session(session_id)
            log.info("session.gone_upstream")
        return refusal_response(answer)

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
        session_id: str | None,
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
        session_id: str | None,
        url: object,
        headers: list[tuple[str, str]],
        protocol_version: str | None,
    ) -> ProbeAnswer:
        assert self.upstream is not None, "the upstream is set at start-up"
        return await send_probe(
            self.upstream,
            session_id,
            url,
            headers,
            protocol_version,
            timeout_s=self._auth.probe_timeout_s,
            metrics=self._metrics,
        )

    async def close(self) -> None:
        """Cancel probes still running (shutdown)."""
        for task in list(self._inflight.values()):
            task.cancel()
        for task in list(self._inflight.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
