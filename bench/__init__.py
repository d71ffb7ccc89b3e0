"""Benchmarks of mcp-sse-gateway against alternatives: ``python -m bench`` (see README.md)."""
