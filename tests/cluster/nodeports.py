"""Ports for cluster nodes in tests: each node listens on its gRPC port and, for PeersV1,
on the next one, so both must be free."""

from __future__ import annotations

import socket


def free_node_ports(n: int) -> list[int]:
    """``n`` gRPC ports on 127.0.0.1 whose port + 1 is free too (none overlapping)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            first = socket.socket()
            first.bind(("127.0.0.1", 0))
            held.append(first)
            port = int(first.getsockname()[1])
            second = socket.socket()
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                second.close()
                continue
            held.append(second)
            ports.append(port)
        return ports
    finally:
        for sock in held:
            sock.close()
