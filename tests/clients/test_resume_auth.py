"""Resumes authorized as strictly as the upstream authorizes requests (DESIGN D8).

The upstream is the bundled example server (official SDK, no event store) requiring bearer
tokens of two users, alice and bob (``--auth``), with session binding on (a session belongs to
its creator; others get 404) or off. Everything the gateway answers from its store is tried
with each kind of credentials; the upstream counts the probes it received.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest

from mcp_sse_gateway.example.process import RunningUpstream, example_upstream_process
from mcp_sse_gateway.web.keys import METRICS
from tests.support.mcp_http import open_session
from tests.support.mcp_http import stream_notifications_call as _call
from tests.support.sse_client import read_events

pytestmark = pytest.mark.timeout(120)

SECRET = "example-jwt-secret-0123456789abcdef"
ISSUER = "https://issuer.example"
N = 3


def _jwt(sub: str, *, exp_in_s: float = 3600, nonce: str = "1") -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": sub, "iat": now, "exp": now + int(exp_in_s), "jti": nonce}
    return jwt.encode(claims, SECRET, algorithm="HS256")


#: The credentials tried, by name: (token, user). ``creator`` is alice's token that created
#: the session; the same user's other token stands for a refreshed one.
OPAQUE = {
    "creator": "alice-1",
    "refreshed": "alice-2",
    "other user": "bob-1",
    "unknown token": "forged-token",
    "no token": None,
}


def _jwts() -> dict[str, str | None]:
    return {
        "creator": _jwt("alice", nonce="a1"),
        "refreshed": _jwt("alice", nonce="a2"),
        "other user": _jwt("bob", nonce="b1"),
        "expired": _jwt("alice", exp_in_s=-60, nonce="a0"),
        "no token": None,
    }


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class Tokens:
    """The example server's token file (re-read by it when it changes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "tokens": {"alice-1": "alice", "alice-2": "alice", "bob-1": "bob"},
            "jwt_secret": SECRET,
            "delay_ms": {},
        }
        self.write()

    def write(self) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.data))
        temporary.replace(self.path)

    def revoke(self, token: str) -> None:
        del self.data["tokens"][token]
        self.write()

    def add(self, token: str, user: str, *, delay_ms: int = 0) -> None:
        self.data["tokens"][token] = user
        if delay_ms:
            self.data["delay_ms"][token] = delay_ms
        self.write()


@contextlib.asynccontextmanager
async def _upstream(tokens: Tokens, *, bind_sessions: bool) -> AsyncIterator[RunningUpstream]:
    args = ["--auth", str(tokens.path)]
    if bind_sessions:
        args.append("--bind-sessions")
    async with example_upstream_process(*args) as upstream:
        yield upstream


async def _stats(http: aiohttp.ClientSession, upstream: RunningUpstream) -> dict[str, Any]:
    async with http.get(f"{upstream.origin}/_example/auth-stats") as response:
        return await response.json()


@dataclass
class Stream:
    """A finished tool-call stream of alice's session, and the cursor to resume it from."""

    session: dict[str, str]  # Accept + Mcp-Session-Id, no credentials
    cursor: str
    messages: list[dict[str, Any]]


async def _alice_stream(http: aiohttp.ClientSession, url: str, token: str) -> Stream:
    headers = await open_session(http, url, headers=_auth(token))
    call = await http.post(url, headers=headers, json=_call(N, 5))
    assert call.status == 200
    events, ended = await read_events(call)
    assert ended
    session = {k: v for k, v in headers.items() if k != "Authorization"}
    messages = [json.loads(e.data) for e in events if e.data]
    assert len(messages) == N + 1
    return Stream(session, events[0].id, messages)


async def _resume(
    http: aiohttp.ClientSession, url: str, stream: Stream, token: str | None
) -> tuple[int, dict[str, str], list[dict[str, Any]]]:
    headers = {**stream.session, **_auth(token), "Last-Event-ID": stream.cursor}
    async with http.get(url, headers=headers) as response:
        if response.status != 200:
            await response.read()
            return response.status, dict(response.headers), []
        events, _ = await read_events(response)
        return 200, dict(response.headers), [json.loads(e.data) for e in events if e.data]


#: What each kind of credentials gets on a resume of alice's stream: the HTTP status.
#: (token kind, upstream binds sessions) -> {credentials: status}
EXPECTED = {
    ("opaque", True): {
        "creator": 200,
        "refreshed": 200,
        "other user": 404,  # the upstream's word: not bob's session
        "unknown token": 401,
        "no token": 401,
    },
    ("opaque", False): {
        "creator": 200,
        "refreshed": 200,
        # The upstream lets bob use alice's session; opaque tokens name no user the gateway
        # could compare (SECURITY.md: use auth.bind = "creator" or principal mode).
        "other user": 200,
        "unknown token": 401,
        "no token": 401,
    },
    ("jwt", True): {
        "creator": 200,
        "refreshed": 200,
        "other user": 404,
        "expired": 401,
        "no token": 401,
    },
    ("jwt", False): {
        "creator": 200,
        "refreshed": 200,
        "other user": 403,  # the gateway's own rule: another iss + sub
        "expired": 401,
        "no token": 401,
    },
}


@pytest.mark.parametrize("bind_sessions", [True, False], ids=["bound", "unbound"])
@pytest.mark.parametrize("kind", ["opaque", "jwt"])
async def test_resume_matrix(gateway, tmp_path, kind, bind_sessions):
    tokens = Tokens(tmp_path / "tokens.json")
    credentials = OPAQUE if kind == "opaque" else _jwts()
    async with (
        _upstream(tokens, bind_sessions=bind_sessions) as upstream,
        gateway(upstream.url) as gw,
        aiohttp.ClientSession() as http,
    ):
        stream = await _alice_stream(http, gw.mcp_url, credentials["creator"])
        got: dict[str, int] = {}
        for name, token in credentials.items():
            status, headers, messages = await _resume(http, gw.mcp_url, stream, token)
            got[name] = status
            if status == 200:
                assert messages == stream.messages, name  # exactly what alice received
            if status == 401:
                # The upstream's refusal, verbatim: the client can start its OAuth flow.
                assert headers["WWW-Authenticate"].startswith("Bearer realm="), name
            if status == 503:
                raise AssertionError(f"{name}: upstream unavailable?")
        # Refusals never ended alice's session: she still resumes.
        assert (await _resume(http, gw.mcp_url, stream, credentials["creator"]))[0] == 200
        stats = await _stats(http, upstream)
    print(f"\nmatrix {kind}, sessions {'bound' if bind_sessions else 'unbound'}: {got}")
    assert got == EXPECTED[(kind, bind_sessions)]
    # The creator was served from the store without asking the upstream; every other cell
    # was probed once.
    assert stats["methods"].get("ping", 0) == len(credentials) - 1


async def test_no_probe_over_100_resumes_by_the_creator(gateway, tmp_path):
    """poll_after_ms = 0: the POST's stream closes after its priming event; the client then
    resumes 100 times, one event per connection, within the recheck window."""
    tokens = Tokens(tmp_path / "tokens.json")
    resumes = 100
    async with (
        _upstream(tokens, bind_sessions=True) as upstream,
        gateway(upstream.url, sse={"poll_after_ms": 0}) as gw,
        aiohttp.ClientSession() as http,
    ):
        headers = await open_session(http, gw.mcp_url, headers=_auth("alice-1"))
        call = await http.post(gw.mcp_url, headers=headers, json=_call(resumes + 5, 2))
        first, ended = await read_events(call)
        assert ended
        assert not [e for e in first if e.data]  # closed right after priming
        cursor = next(e.id for e in reversed(first) if e.id)
        received: list[dict[str, Any]] = []
        for _ in range(resumes):
            response = await http.get(gw.mcp_url, headers={**headers, "Last-Event-ID": cursor})
            assert response.status == 200
            events, _ = await read_events(response, until=2)
            response.close()
            data = [e for e in events if e.data]
            assert data, "every resume makes progress"
            received.append(json.loads(data[0].data))
            cursor = data[0].id
        stats = await _stats(http, upstream)
        served = gw.app[METRICS].registry.get_sample_value(
            "mcp_sse_gateway_auth_served_total", {"by": "creator"}
        )
    indexes = [m["params"]["data"]["index"] for m in received]
    assert indexes == list(range(resumes))  # each event once, none skipped
    assert stats["methods"].get("ping", 0) == 0
    assert served == resumes


async def test_revoked_token_is_refused_once_the_recheck_window_passed(gateway, tmp_path):
    """recheck_s = 0: the creator's own token is checked with the upstream on every resume."""
    tokens = Tokens(tmp_path / "tokens.json")
    async with (
        _upstream(tokens, bind_sessions=True) as upstream,
        gateway(upstream.url, auth={"recheck_s": 0}) as gw,
        aiohttp.ClientSession() as http,
    ):
        stream = await _alice_stream(http, gw.mcp_url, "alice-1")
        assert (await _resume(http, gw.mcp_url, stream, "alice-1"))[0] == 200
        tokens.revoke("alice-1")
        status, headers, messages = await _resume(http, gw.mcp_url, stream, "alice-1")
        assert (status, messages) == (401, [])
        assert 'error="invalid_token"' in headers["WWW-Authenticate"]
        # Her other (refreshed) token still works.
        assert (await _resume(http, gw.mcp_url, stream, "alice-2"))[0] == 200
        assert (await _stats(http, upstream))["methods"]["ping"] == 3


async def test_delete_by_another_user_does_not_end_the_session(gateway, tmp_path):
    tokens = Tokens(tmp_path / "tokens.json")
    async with (
        _upstream(tokens, bind_sessions=True) as upstream,
        gateway(upstream.url) as gw,
        aiohttp.ClientSession() as http,
    ):
        stream = await _alice_stream(http, gw.mcp_url, "alice-1")
        deleted = await http.delete(gw.mcp_url, headers={**stream.session, **_auth("bob-1")})
        assert deleted.status == 404  # the upstream's answer to bob, relayed
        status, _, messages = await _resume(http, gw.mcp_url, stream, "alice-1")
        assert (status, messages) == (200, stream.messages)
        # Alice's own DELETE ends it: the upstream says 200, the gateway forgets the session.
        deleted = await http.delete(gw.mcp_url, headers={**stream.session, **_auth("alice-1")})
        assert deleted.status == 200
        assert (await _resume(http, gw.mcp_url, stream, "alice-1"))[0] == 404
        assert upstream.process.returncode is None


async def test_standalone_get_joining_an_open_one_is_checked(gateway, tmp_path):
    tokens = Tokens(tmp_path / "tokens.json")
    async with (
        _upstream(tokens, bind_sessions=True) as upstream,
        gateway(upstream.url) as gw,
        aiohttp.ClientSession() as http,
    ):
        headers = await open_session(http, gw.mcp_url, headers=_auth("alice-1"))
        session = {k: v for k, v in headers.items() if k != "Authorization"}
        alice = await http.get(gw.mcp_url, headers=headers)
        assert alice.status == 200  # opens the session's upstream GET
        bob = await http.get(gw.mcp_url, headers={**session, **_auth("bob-1")})
        assert bob.status == 404  # probed: the upstream refuses bob in alice's session
        await bob.read()
        nobody = await http.get(gw.mcp_url, headers=session)
        assert nobody.status == 401
        await nobody.read()
        assert not alice.content.at_eof()  # refusals did not replace alice's connection
        refreshed = await http.get(gw.mcp_url, headers={**session, **_auth("alice-2")})
        assert refreshed.status == 200  # probed and accepted: it replaces the older one
        _, ended = await read_events(alice)
        assert ended
        refreshed.close()
        stats = await _stats(http, upstream)
    assert stats["methods"]["ping"] == 3


async def test_a_probe_that_times_out_gets_503(gateway, tmp_path):
    tokens = Tokens(tmp_path / "tokens.json")
    tokens.add("alice-slow", "alice", delay_ms=5000)
    async with (
        _upstream(tokens, bind_sessions=True) as upstream,
        gateway(upstream.url, auth={"probe_timeout_s": 0.3}) as gw,
        aiohttp.ClientSession() as http,
    ):
        stream = await _alice_stream(http, gw.mcp_url, "alice-1")
        headers = {**stream.session, **_auth("alice-slow"), "Last-Event-ID": stream.cursor}
        async with http.get(gw.mcp_url, headers=headers) as response:
            body = await response.json()
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"
        assert body["error"]["message"] == "Upstream authorization unavailable"
        assert (await _resume(http, gw.mcp_url, stream, "alice-1"))[0] == 200
        assert upstream.process.returncode is None


async def test_upstream_restarted_404_tombstones_the_session(gateway, tmp_path):
    """The upstream lost its sessions (restart): the creator's probe gets 404, relayed, and the
    gateway remembers the session as gone (it answers 404 itself from then on)."""
    tokens = Tokens(tmp_path / "tokens.json")
    async with (
        _upstream(tokens, bind_sessions=True) as first,
        gateway(first.url, auth={"recheck_s": 0}) as gw,
        aiohttp.ClientSession() as http,
    ):
        stream = await _alice_stream(http, gw.mcp_url, "alice-1")
        port = first.port
        first.kill()
        await first.process.wait()
        async with example_upstream_process(
            "--auth", str(tokens.path), "--bind-sessions", "--port", str(port)
        ) as second:
            status, _, messages = await _resume(http, gw.mcp_url, stream, "alice-1")
            assert (status, messages) == (404, [])
            assert (await _resume(http, gw.mcp_url, stream, "alice-1"))[0] == 404
            stats = await _stats(http, second)
    assert stats["methods"] == {"ping": 1}  # the second 404 came from the gateway's tombstone


async def test_bind_creator_refuses_every_other_credential_without_asking(gateway, tmp_path):
    tokens = Tokens(tmp_path / "tokens.json")
    async with (
        _upstream(tokens, bind_sessions=False) as upstream,
        gateway(upstream.url, auth={"bind": "creator"}) as gw,
        aiohttp.ClientSession() as http,
    ):
        stream = await _alice_stream(http, gw.mcp_url, "alice-1")
        got = {t: (await _resume(http, gw.mcp_url, stream, t))[0] for t in ["alice-2", "bob-1"]}
        assert (await _resume(http, gw.mcp_url, stream, "alice-1"))[0] == 200
        stats = await _stats(http, upstream)
    assert got == {"alice-2": 403, "bob-1": 403}
    assert stats["methods"].get("ping", 0) == 0


async def test_principal_mode_with_a_trusted_header(gateway, tmp_path):
    """An authenticating proxy on loopback sets X-Auth-User; the gateway compares it alone."""
    tokens = Tokens(tmp_path / "tokens.json")
    auth = {"resume": "principal", "principal_header": "X-Auth-User"}
    async with (
        _upstream(tokens, bind_sessions=False) as upstream,
        gateway(upstream.url, auth=auth, server={"trusted_proxies": ["127.0.0.1/32"]}) as gw,
        aiohttp.ClientSession() as http,
    ):
        headers = await open_session(
            http, gw.mcp_url, headers={**_auth("alice-1"), "X-Auth-User": "alice"}
        )
        call = await http.post(gw.mcp_url, headers=headers, json=_call(N, 5))
        events, _ = await read_events(call)
        stream = Stream(
            {k: v for k, v in headers.items() if k not in {"Authorization", "X-Auth-User"}},
            events[0].id,
            [json.loads(e.data) for e in events if e.data],
        )

        async def resume(token: str, user: str) -> int:
            extra = {**_auth(token), "X-Auth-User": user, "Last-Event-ID": stream.cursor}
            async with http.get(gw.mcp_url, headers={**stream.session, **extra}) as response:
                await response.read()
                return response.status

        got = {
            "refreshed": await resume("alice-2", "alice"),
            "other user": await resume("bob-1", "bob"),
            "other user, alice's token": await resume("alice-1", "bob"),
        }
        stats = await _stats(http, upstream)
    assert got == {"refreshed": 200, "other user": 403, "other user, alice's token": 403}
    assert stats["methods"].get("ping", 0) == 0


async def test_a_check_passed_for_ones_own_stream_does_not_open_anothers(gateway, tmp_path):
    """An upstream that lets bob into alice's session: bob's stream there is his, alice's is not.

    Bob's refreshed token passes the check for his own stream (and is cached); that must not
    let it read alice's stream of the same session.
    """
    tokens = Tokens(tmp_path / "tokens.json")
    alice, bob, bob_refreshed = _jwt("alice"), _jwt("bob", nonce="b1"), _jwt("bob", nonce="b2")
    async with (
        _upstream(tokens, bind_sessions=False) as upstream,
        gateway(upstream.url) as gw,
        aiohttp.ClientSession() as http,
    ):
        alices = await _alice_stream(http, gw.mcp_url, alice)
        call = await http.post(
            gw.mcp_url, headers={**alices.session, **_auth(bob)}, json=_call(N, 5, request_id=2)
        )
        events, _ = await read_events(call)
        bobs = Stream(alices.session, events[0].id, [json.loads(e.data) for e in events if e.data])
        assert (await _resume(http, gw.mcp_url, bobs, bob_refreshed))[0] == 200  # probed, cached
        assert (await _resume(http, gw.mcp_url, bobs, bob_refreshed))[0] == 200  # from the cache
        assert (await _resume(http, gw.mcp_url, alices, bob_refreshed))[0] == 403
        assert (await _resume(http, gw.mcp_url, alices, bob))[0] == 403
        stats = await _stats(http, upstream)
    assert stats["methods"]["ping"] == 3
