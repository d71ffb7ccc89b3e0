"""The Skills extension (SEP-2640, ``io.modelcontextprotocol/skills``) with one bundled skill.

The SDK offers the extension mechanism (``MCPServer(extensions=[...])``) but not this extension,
so it is written here on that mechanism: the capability (with ``directoryRead``), the methods
``skills/list``, ``skills/get`` and ``resources/directory/read``, and the skill's files as
``skill://`` resources. It serves one skill, ``resumable-streams``:

- ``skill://mcp-sse-gateway/resumable-streams/SKILL.md`` (``text/markdown``, with YAML
  frontmatter ``name`` and ``description``);
- ``skill://mcp-sse-gateway/resumable-streams/references/last-event-id.md``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Extension, MethodBinding, ResourceBinding
from mcp.server.mcpserver.resources import TextResource
from mcp.shared.exceptions import MCPError

IDENTIFIER = "io.modelcontextprotocol/skills"
AUTHORITY = "mcp-sse-gateway"
SKILL_NAME = "resumable-streams"
SKILL_DESCRIPTION = (
    "How to resume an interrupted MCP Streamable HTTP stream with Last-Event-ID, "
    "and what a resumable-streaming gateway guarantees"
)
SKILL_ROOT = f"skill://{AUTHORITY}/{SKILL_NAME}"
SKILL_MD_URI = f"{SKILL_ROOT}/SKILL.md"
DIRECTORY_MIME_TYPE = "inode/directory"
#: Skills change only with a new release of this package: clients may cache them briefly.
CACHE_HINT: dict[str, Any] = {"ttlMs": 60_000, "cacheScope": "public"}

_FRONTMATTER: dict[str, str] = {"name": SKILL_NAME, "description": SKILL_DESCRIPTION}

SKILL_MD = (
    "---\n"
    + "".join(f"{key}: {json.dumps(value)}\n" for key, value in _FRONTMATTER.items())
    + "---\n\n"
    "# Resumable streams\n\n"
    "A Streamable HTTP response stream can break before the server has sent everything.\n"
    "When its events carry ids, reconnect with `GET` on the MCP endpoint, the\n"
    "`Mcp-Session-Id` header and `Last-Event-ID` set to the last id received: the rest of\n"
    "that stream is replayed, then it continues live. Wait the `retry` delay first.\n\n"
    "See `references/last-event-id.md` for the details.\n"
)

LAST_EVENT_ID_MD = (
    "# Last-Event-ID\n\n"
    "- An event id is opaque: send it back exactly as received.\n"
    "- An id only means something together with its session.\n"
    "- A priming event (an id and an empty `data:` line) opens a resumable stream, so a\n"
    "  client has a cursor even before the first message.\n"
    "- An id the server cannot resume from gets HTTP 400: nothing is replayed, and nothing\n"
    "  is silently skipped.\n"
)


@dataclass(frozen=True)
class SkillFile:
    """One file of the skill."""

    path: str  # relative to the skill's root
    text: str
    mime_type: str

    @property
    def uri(self) -> str:
        """Its ``skill://`` URI."""
        return f"{SKILL_ROOT}/{self.path}"

    @property
    def data(self) -> bytes:
        """Its raw bytes (UTF-8)."""
        return self.text.encode("utf-8")


FILES: tuple[SkillFile, ...] = (
    SkillFile("SKILL.md", SKILL_MD, "text/markdown"),
    SkillFile("references/last-event-id.md", LAST_EVENT_ID_MD, "text/markdown"),
)


def skill_entry() -> dict[str, Any]:
    """The skill's entry, as ``skills/list`` and ``skills/get`` return it."""
    return {
        "uri": SKILL_MD_URI,
        "frontmatter": dict(_FRONTMATTER),
        "resources": [
            {
                "uri": file.uri,
                "digest": f"sha256:{hashlib.sha256(file.data).hexdigest()}",
                "size": len(file.data),
            }
            for file in FILES
        ],
    }


def _directories() -> set[str]:
    """Every directory of the skill, as a URI without a trailing slash."""
    directories = {SKILL_ROOT}
    for file in FILES:
        parts = file.path.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            directories.add(f"{SKILL_ROOT}/{'/'.join(parts[:depth])}")
    return directories


def directory_children(uri: str) -> list[dict[str, Any]]:
    """The direct children of directory *uri* (files and subdirectories), as resources."""
    prefix = uri.rstrip("/") + "/"
    children: dict[str, dict[str, Any]] = {}
    for file in FILES:
        if not file.uri.startswith(prefix):
            continue
        head, _, rest = file.uri.removeprefix(prefix).partition("/")
        if rest:  # deeper: the child is a subdirectory
            children[head] = {"uri": prefix + head, "name": head, "mimeType": DIRECTORY_MIME_TYPE}
        else:
            children[head] = {
                "uri": file.uri,
                "name": head,
                "mimeType": file.mime_type,
                "size": len(file.data),
            }
    return [children[name] for name in sorted(children)]


class SkillsGetParams(types.RequestParams):
    """``skills/get`` parameters."""

    uri: str


class DirectoryReadParams(types.PaginatedRequestParams):
    """``resources/directory/read`` parameters."""

    uri: str


async def _list_skills(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams
) -> dict[str, Any]:
    del ctx, params  # one page holds every skill
    return {"skills": [skill_entry()], **CACHE_HINT}


async def _get_skill(
    ctx: ServerRequestContext[Any, Any], params: SkillsGetParams
) -> dict[str, Any]:
    del ctx
    if params.uri != SKILL_MD_URI:
        raise MCPError(code=types.INVALID_PARAMS, message="Unknown skill", data={"uri": params.uri})
    return {"skill": skill_entry(), **CACHE_HINT}


async def _read_directory(
    ctx: ServerRequestContext[Any, Any], params: DirectoryReadParams
) -> dict[str, Any]:
    del ctx
    uri = params.uri.rstrip("/")
    if uri not in _directories():
        raise MCPError(
            code=types.INVALID_PARAMS, message="Not a directory", data={"uri": params.uri}
        )
    return {"resources": directory_children(uri)}


class SkillsExtension(Extension):
    """SEP-2640 skills, with ``resources/directory/read``."""

    identifier = IDENTIFIER

    def settings(self) -> dict[str, Any]:
        """Advertised under ``capabilities.extensions``: directory reads are supported."""
        return {"directoryRead": True}

    def resources(self) -> Sequence[ResourceBinding]:
        """The skill's files, as ``skill://`` resources (SKILL.md named after the skill)."""
        bindings = []
        for file in FILES:
            is_manifest = file.path == "SKILL.md"
            resource = TextResource(
                uri=file.uri,
                name=SKILL_NAME if is_manifest else file.path,
                description=SKILL_DESCRIPTION if is_manifest else f"{SKILL_NAME}: {file.path}",
                mime_type=file.mime_type,
                text=file.text,
            )
            bindings.append(ResourceBinding(resource))
        return bindings

    def methods(self) -> Sequence[MethodBinding]:
        """``skills/list``, ``skills/get`` and ``resources/directory/read``."""
        return (
            MethodBinding("skills/list", types.PaginatedRequestParams, _list_skills),
            MethodBinding("skills/get", SkillsGetParams, _get_skill),
            MethodBinding("resources/directory/read", DirectoryReadParams, _read_directory),
        )
