"""Resume authorization, the pure part (DESIGN D8): credentials, their digests, the decision.

The gateway answers resumes (``GET`` + ``Last-Event-ID``) and joins of a session's open
standalone stream itself, from the store, so it must not serve them to credentials the upstream
would refuse (MCP 2025-11-25, Authorization: every request carries its token, and sessions are
never authentication). What it keeps of a stream's or session's creator is a
:class:`Binding`: a keyed digest (HMAC-SHA256 with ``auth.digest_key``) of the credentials,
never their value, plus a digest of the creator's principal when one is known.

A request's :class:`Presented` credentials are compared with the binding by :func:`decide`:

* ``serve`` when the credentials are the creator's and were accepted less than ``recheck_s``
  ago (never past a JWT's ``exp``), or a positive upstream check of them is cached;
* ``refuse`` when the configuration forbids them outright (``bind = "creator"``, or a verified
  principal that is not the creator's);
* ``probe`` otherwise: the upstream is asked (one JSON-RPC ``ping`` in the session) and
  :func:`accept_after_probe` then applies the principal rules to credentials it accepted.

A JWT's claims are read without verifying its signature unless ``auth.jwks_file`` is set: they
are trusted only for credentials the upstream accepted (the creator's, or a probed request's).

Sans-IO: no aiohttp, no redis.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jwt

from mcp_sse_gateway.config import AuthSettings

#: Version prefix of an encoded :class:`Binding` (the store holds it as one string).
BINDING_VERSION = "a1"
#: Longest ``Authorization`` value parsed as a JWT, characters (longer ones are opaque).
MAX_JWT_CHARS = 16 * 1024
_DIGEST_CHARS = 64
#: Largest integer a float holds exactly: bigger ``exp`` claims are treated as unusable.
_MAX_EXACT = 2**53


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


class Verdict(enum.Enum):
    """What :func:`decide` concludes before asking the upstream anything."""

    SERVE = "serve"
    PROBE = "probe"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class Decision:
    """A verdict and the reason for it (a metric label, never a credential)."""

    verdict: Verdict
    reason: str


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


def _expiry(value: object) -> float | None:
    """A JWT's ``exp`` as Unix seconds, read as PyJWT reads it (``int(exp)``).

    None when absent; ``0.0`` (long expired: the upstream is asked) when present but not a
    usable number (a string of letters, NaN, infinity, beyond 2**53).
    """
    if value is None:
        return None
    try:
        exp = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return float(exp) if abs(exp) < _MAX_EXACT else 0.0


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
        claims = _jwt_claims(token) if token else None
        if claims is None:
            return Presented(digest, anonymous=anonymous)
        verified = self._verified(token) if token and self._jwks is not None else False
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
            principal_verified=verified and principal is not None,
            is_jwt=True,
            expires_at=_expiry(claims.get("exp")),
        )

    def _principal_digest(self, source: str, identity: str) -> str:
        return _hmac(
            self._key, b"principal:" + source.encode(), identity.encode("utf-8", "surrogatepass")
        )

    def _verified(self, token: str) -> bool:
        """Whether *token*'s signature, ``exp`` and ``aud`` check out with ``auth.jwks_file``.

        Each key verifies only with its own algorithm (never the one the token's header
        names: that would let an HS256 token signed with a public key pass).
        """
        assert self._jwks is not None
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.InvalidTokenError:
            return False
        for key in self._jwks.keys:
            if kid is not None and key.key_id != kid:
                continue
            try:
                jwt.decode(
                    token,
                    key=key,
                    algorithms=[key.algorithm_name],
                    audience=self._settings.jwt_audience,
                    options={"require": ["exp", "sub"]},
                )
            except (jwt.InvalidTokenError, TypeError, ValueError):
                continue
            return True
        return False


def _jwt_claims(token: str) -> dict[str, Any] | None:
    """The claims of a JWT read without verification, or None when *token* is not a JWT."""
    if len(token) > MAX_JWT_CHARS or token.count(".") != 2:  # noqa: PLR2004 - JWS compact form
        return None
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        return None
    return claims if isinstance(claims, dict) else None


def load_jwks(settings: AuthSettings) -> jwt.PyJWKSet | None:
    """The key set of ``auth.jwks_file``, or None when it is not set.

    Raises:
        ValueError: the file is not a JWKS PyJWT can use.
    """
    if settings.jwks_file is None:
        return None
    try:
        return jwt.PyJWKSet.from_json(settings.jwks_file.read_text(encoding="utf-8"))
    except (OSError, jwt.PyJWTError, ValueError) as exc:
        raise ValueError(f"auth.jwks_file cannot be used: {type(exc).__name__}") from None


def is_exact(binding: Binding | None, presented: Presented) -> bool:
    """Whether *presented* are the creator's exact credentials (compared in constant time).

    Never for anonymous credentials: a request carrying none is anybody's.
    """
    return (
        binding is not None
        and not presented.anonymous
        and hmac.compare_digest(binding.credentials, presented.digest)
    )


def same_principal(binding: Binding | None, presented: Presented) -> bool:
    """Whether both sides carry a principal and it is the same."""
    return (
        binding is not None
        and bool(binding.principal)
        and presented.principal is not None
        and hmac.compare_digest(binding.principal, presented.principal)
    )


def is_creator(binding: Binding | None, presented: Presented) -> bool:
    """Whether *presented* belong to the record's creator (credentials or verified principal).

    Same credentials, or the same *verified* principal (a trusted proxy's header, a JWT
    verified with ``auth.jwks_file``). Only the creator may make the gateway forget a session
    on the upstream's 404 (a DELETE or a probe answered 404), so another user cannot end a
    victim's session. Unverified JWT
    claims do not count here: an upstream that authenticates by another credential would
    answer 404 to a forged token naming the victim.
    """
    return is_exact(binding, presented) or (
        presented.principal_verified and same_principal(binding, presented)
    )


def decide(  # noqa: PLR0911 - one return per rule, in the order they apply
    settings: AuthSettings,
    binding: Binding | None,
    presented: Presented,
    *,
    now: float,
    cached_until: float | None = None,
) -> Decision:
    """Whether to serve *presented* from the store, refuse them, or ask the upstream first.

    Args:
        settings: the ``[auth]`` section.
        binding: the creator's binding (the stream's, else the session's), or None when the
            gateway has none (a session created before it was deployed).
        presented: the request's credentials.
        now: Unix seconds.
        cached_until: until when a positive upstream check of *presented* on this session
            holds, if one is cached.
    """
    if settings.resume == "none":
        return Decision(Verdict.SERVE, "disabled")
    if (
        settings.resume == "principal"
        and presented.principal_verified
        and binding is not None
        and binding.principal
    ):
        if same_principal(binding, presented):
            return Decision(Verdict.SERVE, "principal")
        return Decision(Verdict.REFUSE, "principal_mismatch")
    if presented.expires_at is not None and presented.expires_at <= now:
        # An expired JWT is never served from the store: the upstream gets to say 401.
        return Decision(Verdict.PROBE, "expired")
    if (
        is_exact(binding, presented)
        and binding is not None
        and now < binding.accepted_at + settings.recheck_s
        and (binding.expires_at is None or now < binding.expires_at)
    ):
        return Decision(Verdict.SERVE, "creator")
    if cached_until is not None and now < cached_until:
        return Decision(Verdict.SERVE, "cached")
    if settings.bind == "creator" and binding is not None and not is_exact(binding, presented):
        return Decision(Verdict.REFUSE, "creator_only")
    return Decision(Verdict.PROBE, "unverified")


def accept_after_probe(
    settings: AuthSettings, binding: Binding | None, presented: Presented
) -> Decision:
    """Apply the principal rules to credentials the upstream just accepted (a 2xx probe).

    * ``upstream`` mode: when the creator's and these credentials both carry a JWT principal,
      it must be the same (another user's valid token must not read the session).
    * ``principal`` mode: when the creator had a principal, these must carry the same one.
    """
    if binding is None or not binding.principal:
        return Decision(Verdict.SERVE, "probed")
    if settings.resume == "principal":
        if same_principal(binding, presented):
            return Decision(Verdict.SERVE, "probed")
        return Decision(Verdict.REFUSE, "principal_mismatch")
    if presented.principal is not None and not same_principal(binding, presented):
        return Decision(Verdict.REFUSE, "principal_mismatch")
    return Decision(Verdict.SERVE, "probed")


def probe_token_only(settings: AuthSettings, presented: Presented) -> bool:
    """Whether a probe must carry the bearer token alone (no cookie, no other header).

    In principal mode an unverified JWT's identity counts once the upstream accepted *that
    token*; a probe carrying other credentials too (an API key the upstream authenticates by)
    would prove nothing about it.
    """
    return (
        settings.resume == "principal"
        and presented.is_jwt
        and presented.principal is not None
        and not presented.principal_verified
    )


def cache_until(settings: AuthSettings, presented: Presented, now: float) -> float:
    """Until when a positive check of *presented* may be reused: ``recheck_s``, never past exp."""
    until = now + settings.recheck_s
    if presented.expires_at is not None:
        until = min(until, presented.expires_at)
    return until
