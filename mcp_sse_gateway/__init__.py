"""mcp-sse-gateway: a reverse proxy that makes any MCP server's SSE streams resumable."""

__version__ = "0.1.0"
