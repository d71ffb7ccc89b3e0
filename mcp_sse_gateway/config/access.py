"""Who may read what the gateway answers from its store: the ``[auth]`` section (DESIGN D8).

See SECURITY.md. Validation checks that ``auth.jwks_file`` exists (a file-system lookup, no read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from mcp_sse_gateway.config.defaults import (
    DEFAULT_AUTH_PROBE_TIMEOUT_S,
    DEFAULT_AUTH_RECHECK_S,
    MIN_DIGEST_KEY_CHARS,
)
from mcp_sse_gateway.config.fields import PositiveSeconds, Section


class AuthSettings(Section):
    """Who may read what the gateway answers from its store (DESIGN D8; see SECURITY.md).

    The gateway answers resumes (``GET`` + ``Last-Event-ID``) and joins of an open standalone
    stream itself, so it checks their credentials as strictly as the upstream would:

    * ``upstream`` (default): the creator's exact credentials (kept as a keyed digest) are
      served for ``recheck_s``; any other credentials, or the creator's after that, are checked
      with the upstream by a JSON-RPC ``ping`` in the session first, and a refusal is relayed.
      When the creator's and the resume's credentials are both JWTs, their ``iss`` + ``sub``
      must also match.
    * ``principal``: the identity (``principal_header`` from a trusted proxy, or a JWT's
      ``iss`` + ``sub``) must be the creator's, else 403.
    * ``none``: a valid session id and cursor suffice (only for upstreams without auth).
    """

    resume: Literal["upstream", "principal", "none"] = Field(
        default="upstream",
        description="How resumes and standalone-stream joins are authorized: 'upstream', "
        "'principal' or 'none'.",
    )
    bind: Literal["accepted", "creator"] = Field(
        default="accepted",
        description="'accepted': any credentials the upstream accepts for the session (JWTs "
        "must carry the creator's iss + sub); 'creator': only the creator's exact credentials "
        "(a refreshed opaque token gets 403 and the client starts over).",
    )
    digest_key: SecretStr | None = Field(
        default=None,
        description="Key of the credential digests kept in the store (HMAC-SHA256), shared by "
        f"every replica, at least {MIN_DIGEST_KEY_CHARS} characters; never stored. Required "
        "with the Redis store; the memory store makes a random one per process.",
    )
    credential_headers: tuple[str, ...] = Field(
        default=("authorization",),
        description="Request headers that carry credentials (case-insensitive).",
    )
    credential_cookies: tuple[str, ...] = Field(
        default=(),
        description="Cookies that carry credentials, by name (other cookies are ignored: they "
        "rotate for unrelated reasons).",
    )
    recheck_s: float = Field(
        default=DEFAULT_AUTH_RECHECK_S,
        ge=0,
        description="Credentials the upstream accepted are served this long without asking it "
        "again (never past a JWT's exp), seconds; 0 = ask every time.",
    )
    probe_timeout_s: PositiveSeconds = Field(
        default=DEFAULT_AUTH_PROBE_TIMEOUT_S,
        description="Bound on one authorization probe of the upstream, seconds (then 503).",
    )
    principal_header: str | None = Field(
        default=None,
        description="principal mode: header carrying the authenticated identity, set by a "
        "proxy in server.trusted_proxies (dropped from everyone else's requests).",
    )
    jwks_file: Path | None = Field(
        default=None,
        description="principal mode: JWKS (JSON) whose keys verify bearer JWTs, so their "
        "iss + sub count without asking the upstream.",
    )
    jwt_audience: str | None = Field(
        default=None, description="principal mode: the 'aud' verified JWTs must carry."
    )

    @field_validator("credential_headers", "credential_cookies")
    @classmethod
    def _names(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            if not value or any(c in value for c in " \t\r\n:;=,"):
                raise ValueError(f"not a header or cookie name: {value!r}")
        return values

    @field_validator("principal_header")
    @classmethod
    def _header(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c in value for c in " \t\r\n:")):
            raise ValueError("not a header name")
        return value

    @field_validator("digest_key")
    @classmethod
    def _key_length(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not key.get_secret_value():
            raise ValueError("is empty (unset it, or give a secret of 16 characters or more)")
        if key is not None and len(key.get_secret_value()) < MIN_DIGEST_KEY_CHARS:
            raise ValueError(f"must be at least {MIN_DIGEST_KEY_CHARS} characters")
        return key

    @model_validator(mode="after")
    def _jwks_readable(self) -> AuthSettings:
        if self.jwks_file is not None and not self.jwks_file.is_file():
            raise ValueError("jwks_file: no such file")
        return self
