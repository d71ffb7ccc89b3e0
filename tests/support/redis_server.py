"""The command line of a private ``redis-server`` on loopback, for tests: no persistence."""

from __future__ import annotations


def redis_server_command(executable: str, port: int, directory: str, *extra: str) -> list[str]:
    """``redis-server`` on 127.0.0.1:*port*, no RDB nor AOF, files in *directory*; *extra* last."""
    return [
        executable,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        directory,
        *extra,
    ]
