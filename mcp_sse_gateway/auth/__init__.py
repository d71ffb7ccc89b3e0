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

One job per module:

* :mod:`.credentials`: :class:`CredentialReader`, :class:`Presented` and :class:`Binding`
  (reading a request's credentials, their digests, what a record keeps of them).
* :mod:`.tokens`: bearer JWTs (claims, verification with ``auth.jwks_file``, :func:`load_jwks`).
* :mod:`.decisions`: :func:`decide`, :func:`accept_after_probe` and the rules they share.

Sans-IO: no aiohttp, no redis.
"""

from mcp_sse_gateway.auth.credentials import BINDING_VERSION, Binding, CredentialReader, Presented
from mcp_sse_gateway.auth.decisions import (
    Decision,
    Verdict,
    accept_after_probe,
    cache_until,
    decide,
    is_creator,
    is_exact,
    probe_token_only,
    same_principal,
)
from mcp_sse_gateway.auth.tokens import MAX_JWT_CHARS, load_jwks

__all__ = [
    "BINDING_VERSION",
    "MAX_JWT_CHARS",
    "Binding",
    "CredentialReader",
    "Decision",
    "Presented",
    "Verdict",
    "accept_after_probe",
    "cache_until",
    "decide",
    "is_creator",
    "is_exact",
    "load_jwks",
    "probe_token_only",
    "same_principal",
]
