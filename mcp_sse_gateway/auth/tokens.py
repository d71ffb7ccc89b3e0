"""Bearer JWTs for resume authorization (DESIGN D8): their claims, signatures, the JWKS.

A JWT's claims are read without verifying its signature (:func:`jwt_claims`) unless
``auth.jwks_file`` is set (:func:`load_jwks`, then :func:`verified`): unverified claims are
trusted only for credentials the upstream accepted.

Sans-IO: no aiohttp, no redis (only :func:`load_jwks` reads its file, once at start-up).
"""

from __future__ import annotations

from typing import Any

import jwt

from mcp_sse_gateway.config import AuthSettings

#: Longest ``Authorization`` value parsed as a JWT, characters (longer ones are opaque).
MAX_JWT_CHARS = 16 * 1024
#: Largest integer a float holds exactly: bigger ``exp`` claims are treated as unusable.
_MAX_EXACT = 2**53


def expiry(value: object) -> float | None:
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


def jwt_claims(token: str) -> dict[str, Any] | None:
    """The claims of a JWT read without verification, or None when *token* is not a JWT."""
    if len(token) > MAX_JWT_CHARS or token.count(".") != 2:  # noqa: PLR2004 - JWS compact form
        return None
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        return None
    return claims if isinstance(claims, dict) else None


def verified(token: str, jwks: jwt.PyJWKSet, audience: str | None) -> bool:
    """Whether *token*'s signature, ``exp`` and ``aud`` check out with the keys of *jwks*.

    Each key verifies only with its own algorithm (never the one the token's header
    names: that would let an HS256 token signed with a public key pass).
    """
    try:
        kid = jwt.get_unverified_header(token).get("kid")
    except jwt.InvalidTokenError:
        return False
    for key in jwks.keys:
        if kid is not None and key.key_id != kid:
            continue
        try:
            jwt.decode(
                token,
                key=key,
                algorithms=[key.algorithm_name],
                audience=audience,
                options={"require": ["exp", "sub"]},
            )
        except (jwt.InvalidTokenError, TypeError, ValueError):
            continue
        return True
    return False


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
