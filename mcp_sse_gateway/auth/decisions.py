"""The resume authorization decision (DESIGN D8): serve, probe the upstream, or refuse.

A request's :class:`~mcp_sse_gateway.auth.credentials.Presented` credentials are compared with
the record's :class:`~mcp_sse_gateway.auth.credentials.Binding` by :func:`decide`, before the
upstream is asked anything; :func:`accept_after_probe` applies the principal rules to
credentials the upstream then accepted. The rules are listed in :mod:`mcp_sse_gateway.auth`.

Sans-IO: no aiohttp, no redis.
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass

from mcp_sse_gateway.auth.credentials import Binding, Presented
from mcp_sse_gateway.config import AuthSettings


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
