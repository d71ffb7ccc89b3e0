"""Which request paths are the MCP endpoint (DESIGN D3), after RFC 3986 normalization.

A path is the MCP endpoint when, after RFC 3986 §6.2.2 normalization (percent-decoding of
unreserved characters, §6.2.2.2; removal of dot segments, §5.2.4), it equals ``server.path``.
A *variant* of it, whose meaning depends on how the upstream routes it (another case, ``;``
parameters, an encoded ``/``, a duplicated or trailing slash), is ambiguous: relayed unmanaged
it could reach the upstream's MCP endpoint around the gateway, so it is refused (400).
Everything else is another path, relayed as it is. Sans-IO.
"""

from __future__ import annotations

import enum
import re
import string
from urllib.parse import unquote

_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
_PARAMS = re.compile(r";[^/]*")
_SLASHES = re.compile(r"/{2,}")
#: Percent-decoding passes tried when looking for a variant of the MCP path.
_MAX_DECODES = 4


class PathRole(enum.Enum):
    """What a request path is to the gateway."""

    MCP = "mcp"
    OTHER = "other"
    AMBIGUOUS = "ambiguous"


def _decode_unreserved(path: str) -> str:
    """Percent-decode unreserved characters only; other escapes get upper-case hex (§6.2.2.1)."""

    def one(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else "%" + match.group(1).upper()

    return _PERCENT.sub(one, path)


def remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4 for an absolute path: ``/a/./b/../c`` → ``/a/c``."""
    output: list[str] = []
    segments = path.split("/")
    for index, segment in enumerate(segments[1:], start=1):
        last = index == len(segments) - 1
        if segment == ".":
            if last:
                output.append("")
        elif segment == "..":
            if output:
                output.pop()
            if last:
                output.append("")
        else:
            output.append(segment)
    return "/" + "/".join(output)


def normalize_path(raw_path: str) -> str:
    """The RFC 3986 §6.2.2 normal form of *raw_path* (its query, if any, dropped)."""
    path = raw_path.split("?", 1)[0].split("#", 1)[0] or "/"
    return remove_dot_segments(_decode_unreserved(path))


def _loosen(path: str) -> str:
    """What a lenient router could make of *path* (a variant's loose form).

    Backslashes read as slashes, NUL dropped, no ``;`` parameters, no trailing whitespace or
    dots, and dot segments resolved (after decoding too).
    """
    path = path.replace("\\", "/").replace("\x00", "")
    path = _PARAMS.sub("", path).rstrip(" \t\r\n")
    path = remove_dot_segments(path if path.startswith("/") else "/" + path)
    return path.rstrip(". ") or "/"  # Windows servers drop trailing dots and spaces


def path_role(raw_path: str, mcp_path: str) -> PathRole:
    """Whether *raw_path* (as received, percent-escapes included) is the MCP endpoint.

    Args:
        raw_path: the request target's path, origin-form (``/…``; for an absolute-form target
            ``http://host/…`` pass its path only). A query is ignored.
        mcp_path: ``server.path`` (absolute, no trailing slash except ``/`` itself).
    """
    normal = normalize_path(raw_path)
    if normal == mcp_path:
        return PathRole.MCP
    loose = _loosen(normal)
    for _ in range(_MAX_DECODES):
        # Decoded again as long as it changes: an upstream that decodes twice must not reach
        # its MCP endpoint through /%256Dcp either.
        decoded = _loosen(unquote(loose))
        if decoded == loose:
            break
        loose = decoded
    loose = loose.lower()
    loose = _SLASHES.sub("/", loose).rstrip("/") or "/"
    if loose == mcp_path.lower():
        return PathRole.AMBIGUOUS
    return PathRole.OTHER
