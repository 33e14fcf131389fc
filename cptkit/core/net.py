"""Small network helpers shared by the launchers, the benchmarks and the tests."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether something accepts a TCP connection at ``host:port`` within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
