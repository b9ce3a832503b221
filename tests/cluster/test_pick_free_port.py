"""pick_free_port: a port a server started later can still bind (no race with outgoing connects)."""

from __future__ import annotations

import socket

from tidelog.cluster.zookeeper import _ephemeral_port_range, pick_free_port


def test_ports_come_from_outside_the_ephemeral_range() -> None:
    # Outgoing connections draw their local port from the ephemeral range; a port picked there
    # and bound seconds later by a broker could have been taken meanwhile (EADDRINUSE in CI).
    low, high = _ephemeral_port_range()
    for _ in range(50):
        port = pick_free_port()
        assert not low <= port <= high


def test_a_port_is_never_handed_out_twice_in_one_process() -> None:
    picked = [pick_free_port() for _ in range(300)]
    assert len(set(picked)) == len(picked)


def test_a_picked_port_can_be_bound_and_a_bound_port_is_skipped() -> None:
    port = pick_free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert all(pick_free_port() != port for _ in range(100))
