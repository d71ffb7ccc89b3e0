"""A free TCP port on loopback, for a process a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port free on 127.0.0.1 right now (released before use: the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
