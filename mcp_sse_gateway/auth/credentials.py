"""Credentials as resume authorization compares them (DESIGN D8): reading, digests, bindings.

:class:`CredentialReader` reads a request's :class:`Presented` credentials: a keyed digest
(HMAC-SHA256 with ``auth.digest_key``) of the configured credential headers, cookies and query
string, never their value, plus a digest of the principal when one is known (the trusted
principal header, or a bearer JWT's ``iss`` + ``sub``, see :mod:`~mcp_sse_gateway.auth.tokens`).
What a session or stream record keeps of its creator's is a :class:`Binding`.

Sans-IO: no aiohttp, no redis.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import jwt

from mcp_sse_gateway.auth.tokens import expiry, jwt_claims, verified
from mcp_sse_gateway.config import AuthSettings

#: Version prefix of an encoded :class:`Binding` (the store holds it as one string).
BINDING_VERSION = "a1"
_DIGEST_CHARS = 64


def _hmac(key: bytes, domain: bytes, message: bytes) -> str:
    return hmac.new(key, domain + b"\0" + message, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Presented:
    """The credentials one request presents, as the gateway compares them.

    Attributes:
        digest: keyed digest (64 hex digits) of the configured credential headers and cookies
            (and the MCP endpoint's query string, which may carry a token).
        anonymous: the request carries none of those: it cannot be told from anyone else's
            (never taken for the creator's, never cached; the upstream is asked every time).
        principal: keyed digest of the identity (a JWT's ``iss`` + ``sub``, or the trusted
            principal header), or None when the request carries none.
        principal_verified: the identity holds without asking the upstream (a trusted proxy's
            header, or a JWT verified with ``auth.jwks_file``).
        is_jwt: the ``Authorization`` is a bearer JWT (its claims could be read).
        expires_at: the JWT's ``exp`` (Unix seconds), or None.
    """

    digest: str
    anonymous: bool = False
    principal: str | None = None
    principal_verified: bool = False
    is_jwt: bool = False
    expires_at: float | None = None

    def binding(self, now: float | None = None) -> Binding:
        """The binding of a record created by a request with these credentials (accepted now)."""
        return Binding(
            credentials=self.digest,
            principal=self.principal or "",
            accepted_at=time.time() if now is None else now,
            expires_at=self.expires_at,
        )


@dataclass(frozen=True, slots=True)
class Binding:
    """What a session or stream record keeps of its creator's credentials.

    Attributes:
        credentials: :attr:`Presented.digest` of the creator's request.
        principal: :attr:`Presented.principal` of it, or ``""``.
        accepted_at: when the upstream accepted those credentials (Unix seconds).
        expires_at: the creator's JWT ``exp`` (Unix seconds), or None.
    """

    credentials: str
    principal: str
    accepted_at: float
    expires_at: float | None

    def encode(self) -> str:
        """``a1.<credentials>.<principal>.<accepted ms>.<exp s or ->``: ASCII, no secret."""
        exp = "-" if self.expires_at is None else str(int(self.expires_at))
        return ".".join(
            (
                BINDING_VERSION,
                self.credentials,
                self.principal,
                str(int(self.accepted_at * 1000)),
                exp,
            )
        )

    @classmethod
    def decode(cls, value: str | None) -> Binding | None:
        """The binding *value* encodes, or None (empty, another version, or malformed)."""
        if not value:
            return None
        parts = value.split(".")
        if len(parts) != 5 or parts[0] != BINDING_VERSION:  # noqa: PLR2004 - the format's fields
            return None
        _, credentials, principal, accepted_ms, exp = parts
        if len(credentials) != _DIGEST_CHARS or (principal and len(principal) != _DIGEST_CHARS):
            return None
        try:
            return cls(
                credentials=credentials,
                principal=principal,
                accepted_at=int(accepted_ms) / 1000,
                expires_at=None if exp == "-" else float(int(exp)),
            )
        except ValueError:
            return None


def _bearer_token(headers: Sequence[tuple[str, str]]) -> str | None:
    for name, value in headers:
        if name.lower() == "authorization":
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


def _cookies(headers: Sequence[tuple[str, str]], names: Sequence[str]) -> list[tuple[str, str]]:
    """The named cookies of every ``Cookie`` header, sorted by name, duplicates kept in order.

    Parsed leniently, as servers do (split on ``;``, then on the first ``=``): a strict parser
    such as ``http.cookies`` drops a whole header over one value it dislikes (JSON, a space),
    which would make a victim's credentials look like none at all.
    """
    if not names:
        return []
    wanted = set(names)
    found: list[tuple[str, str]] = []
    for name, value in headers:
        if name.lower() != "cookie":
            continue
        for pair in value.split(";"):
            key, sep, cookie = pair.strip().partition("=")
            if sep and key.strip() in wanted:
                found.append((key.strip(), cookie.strip()))
    return sorted(found, key=lambda item: item[0])


class CredentialReader:
    """Reads :class:`Presented` credentials from request headers, per ``[auth]``.

    Args:
        settings: the ``[auth]`` section.
        key: the digest key (``auth.digest_key``, or a random per-process key).
        jwks: the verification keys of ``auth.jwks_file``, when set.
    """

    def __init__(
        self, settings: AuthSettings, key: bytes, jwks: jwt.PyJWKSet | None = None
    ) -> None:
        self._settings = settings
        self._key = key
        self._headers = frozenset(name.lower() for name in settings.credential_headers)
        self._principal_header = (
            settings.principal_header.lower() if settings.principal_header else None
        )
        self._jwks = jwks

    @property
    def principal_header(self) -> str | None:
        """The trusted principal header (lower case), dropped from untrusted requests."""
        return self._principal_header

    def presented(
        self, headers: Sequence[tuple[str, str]], *, trusted_peer: bool, query: str = ""
    ) -> Presented:
        """The credentials *headers* (and the MCP endpoint's *query* string) present.

        Args:
            headers: the client request's headers, in order.
            trusted_peer: the request comes from ``server.trusted_proxies`` (only then does the
                principal header count; sent more than once, it counts not at all).
            query: the raw query string of a request to the MCP endpoint (``access_token=``).
        """
        material: list[tuple[str, str]] = [
            (name.lower(), value) for name, value in headers if name.lower() in self._headers
        ]
        material.extend(_cookies(headers, self._settings.credential_cookies))
        if query:
            material.append(("?", query))
        digest = _hmac(
            self._key, b"credentials", json.dumps(material, separators=(",", ":")).encode()
        )
        anonymous = not material
        if self._principal_header is not None and trusted_peer:
            identities = [v for n, v in headers if n.lower() == self._principal_header and v]
            if len(identities) > 1:
                # A proxy that appends instead of replacing left the client's own copy in.
                return Presented(digest, anonymous=anonymous)
            if identities:
                return Presented(
                    digest,
                    anonymous=anonymous,
                    principal=self._principal_digest("header", identities[0]),
                    principal_verified=True,
                )
        token = _bearer_token(headers)
        claims = jwt_claims(token) if token else None
        if claims is None:
            return Presented(digest, anonymous=anonymous)
        checked = (
            verified(token, self._jwks, self._settings.jwt_audience)
            if token and self._jwks is not None
            else False
        )
        iss, sub = claims.get("iss"), claims.get("sub")
        principal = (
            self._principal_digest("jwt", json.dumps([iss, sub]))
            if isinstance(sub, str) and sub and (iss is None or isinstance(iss, str))
            else None
        )
        return Presented(
            digest,
            anonymous=anonymous,
            principal=principal,
            principal_verified=checked and principal is not None,
            is_jwt=True,
            expires_at=expiry(claims.get("exp")),
        )

    def _principal_digest(self, source: str, identity: str) -> str:
        return _hmac(
            self._key, b"principal:" + source.encode(), identity.encode("utf-8", "surrogatepass")
        )
