"""Which paths are the MCP endpoint (RFC 3986 §6.2.2 normalization; DESIGN D3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_sse_gateway.paths import PathRole, normalize_path, path_role, remove_dot_segments


@pytest.mark.parametrize(
    ("raw", "role"),
    [
        ("/mcp", PathRole.MCP),
        ("/mcp?x=1", PathRole.MCP),
        ("/%6Dcp", PathRole.MCP),
        ("/%6dcp", PathRole.MCP),
        ("/a/../mcp", PathRole.MCP),
        ("/./mcp", PathRole.MCP),
        ("/%2e%2e/mcp", PathRole.MCP),
        ("/mcp/", PathRole.AMBIGUOUS),
        ("//mcp", PathRole.AMBIGUOUS),
        ("/MCP", PathRole.AMBIGUOUS),
        ("/Mcp/", PathRole.AMBIGUOUS),
        ("/mcp;jsessionid=1", PathRole.AMBIGUOUS),
        ("/mcp%3bx", PathRole.AMBIGUOUS),
        ("/mcp%2F", PathRole.AMBIGUOUS),
        ("/mcp/.", PathRole.AMBIGUOUS),
        ("/x/..//mcp", PathRole.AMBIGUOUS),
        ("/mcp/x", PathRole.OTHER),
        ("/mcpx", PathRole.OTHER),
        ("/.well-known/oauth-protected-resource", PathRole.OTHER),
        ("/", PathRole.OTHER),
    ],
)
def test_roles(raw, role):
    assert path_role(raw, "/mcp") is role


def test_nested_mcp_path():
    assert path_role("/api/v1/mcp", "/api/v1/mcp") is PathRole.MCP
    assert path_role("/api//v1/mcp", "/api/v1/mcp") is PathRole.AMBIGUOUS
    assert path_role("/api%2Fv1/mcp", "/api/v1/mcp") is PathRole.AMBIGUOUS
    assert path_role("/API/v1/mcp", "/api/v1/mcp") is PathRole.AMBIGUOUS


@pytest.mark.parametrize(
    ("path", "expected"),
    [  # RFC 3986 §5.4 examples, as absolute paths
        ("/a/b/c/./../../g", "/a/g"),
        ("/mid/content=5/../6", "/mid/6"),
        ("/a/..", "/"),
        ("/a/.", "/a/"),
        ("/..", "/"),
        ("/a/b/../../../g", "/g"),
    ],
)
def test_remove_dot_segments(path, expected):
    assert remove_dot_segments(path) == expected


def test_reserved_escapes_are_kept_upper_case():
    assert normalize_path("/a%2fb%7e") == "/a%2Fb~"


@settings(max_examples=300, derandomize=True)
@given(st.text(alphabet="/.%;aAmcpM2Ff6D~", max_size=24))
def test_normalization_is_idempotent_and_roles_total(raw):
    path = "/" + raw
    once = normalize_path(path)
    if "%" not in path:  # decoding may form a new escape (%2%62 -> %2b): one pass, by the RFC
        assert normalize_path(once) == once
    role = path_role(path, "/mcp")
    if "mcp" not in path.lower().replace("%", ""):
        assert role is PathRole.OTHER or "%" in path


def test_double_encoding_is_ambiguous():
    # One pass gives /%6dcp; an upstream that decodes twice would route it to /mcp.
    assert path_role("/%6%64cp", "/mcp") is PathRole.AMBIGUOUS
    assert path_role("/%256Dcp", "/mcp") is PathRole.AMBIGUOUS
    assert path_role("/%25256Dcp", "/mcp") is PathRole.AMBIGUOUS


@pytest.mark.parametrize(
    "raw", ["/mcp\\", "/mcp%5C", "/mcp%00", "/x/..%2Fmcp", "/mcp%20", "/MCP%2e"]
)
def test_what_lenient_routers_make_of_odd_bytes_is_ambiguous(raw):
    assert path_role(raw, "/mcp") is PathRole.AMBIGUOUS
