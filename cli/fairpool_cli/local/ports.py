"""Free loopback ports for the processes local mode starts."""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])
