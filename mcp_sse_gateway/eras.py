"""Which resumability rules apply to a request, from the session's recorded protocol version.

DESIGN D2. The era is learned from the ``protocolVersion`` of the session's InitializeResult,
never from the per-request ``MCP-Protocol-Version`` header (clients send older values than they
negotiated). Sans-IO.
Sources: MCP 2025-11-25 transports, "Resumability and Redelivery" and "Sending Messages to the
Server" (SEP-1699 priming events and ``retry``); MCP 2025-03-26 "Session Management".
"""

from __future__ import annotations

import enum
import re

#: First version whose clients accept an empty ``data:`` priming event and polling (SEP-1699).
PRIMING_SINCE = "2025-11-25"
_DATE = re.compile(r"\A\d{4}-\d{2}-\d{2}\Z")


class Era(enum.Enum):
    """The rules of D2's table, one member per row that behaves differently."""

    #: No ``Mcp-Session-Id``: relay as is; a client disconnect closes the upstream request.
    PASS_THROUGH = "pass-through"  # noqa: S105 - an enum value, not a password
    #: Ids, store and replay; no priming, no closing on purpose (2025-03-26, 2025-06-18, and
    #: sessions the gateway has no record of).
    RESUMABLE = "resumable"
    #: Ids, store and replay, plus priming events and closing on purpose (2025-11-25 and later).
    RESUMABLE_PRIMED = "resumable-primed"

    @property
    def resumable(self) -> bool:
        """Whether streams of this era get gateway ids, are stored and can be resumed."""
        return self is not Era.PASS_THROUGH

    @property
    def primes(self) -> bool:
        """Whether streams of this era open with a priming event and may be closed on purpose."""
        return self is Era.RESUMABLE_PRIMED


def era_for(session_id: str | None, recorded_version: str | None) -> Era:
    """The era of a request.

    Args:
        session_id: the request's ``Mcp-Session-Id``, or None.
        recorded_version: the protocol version recorded for that session, or None when the
            gateway has no record of it (created before deployment, record expired).

    Returns:
        ``PASS_THROUGH`` without a session; ``RESUMABLE_PRIMED`` for a recorded version of
        2025-11-25 or later; ``RESUMABLE`` otherwise (older, unknown or unparseable versions are
        treated conservatively: older clients break on an empty ``data`` line).
    """
    if not session_id:
        return Era.PASS_THROUGH
    if recorded_version and _DATE.match(recorded_version) and recorded_version >= PRIMING_SINCE:
        return Era.RESUMABLE_PRIMED
    return Era.RESUMABLE
