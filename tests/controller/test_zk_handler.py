"""`PollingThreadingHandler`: kazoo's threading handler with `select` on one poll(2) call."""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Iterator

import pytest
from kazoo.handlers.utils import selector_select

from tidelog.controller.zk_client import KafkaZkClient
from tidelog.controller.zk_handler import PollingThreadingHandler, poll_select


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_nothing_to_read_waits_for_the_timeout_and_reports_nothing(
        pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    started = time.monotonic()
    assert poll_select([a], [], [], 0.05) == ([], [], [])
    assert time.monotonic() - started >= 0.05


def test_reports_the_objects_given_ready_to_read_and_to_write(
        pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.send(b"x")
    # as kazoo passes them: sockets, and its wake-up pipe end by descriptor
    assert poll_select([a, b.fileno()], [], [], 1.0) == ([a], [], [])
    assert poll_select([], [b], [], 1.0) == ([], [b], [])


def test_a_descriptor_ready_both_ways_is_reported_as_kazoos_own_select_does(
        pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.send(b"x")
    assert poll_select([a], [a], [], 1.0) == selector_select([a], [a], [], 1.0)
    assert poll_select([a], [a], [], 1.0) == ([a, a], [], [])  # (as listed, readable only)


def test_a_closed_peer_wakes_a_reader(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.close()
    assert poll_select([a], [], [], 1.0) == ([a], [], [])


def test_invalid_arguments_are_refused_as_kazoos(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    with pytest.raises(ValueError):
        poll_select([a], [], [], -1)
    with pytest.raises(TypeError):
        poll_select([a], [], [], "1")  # type: ignore[arg-type]
    closed = socket.socket()
    fd = closed.fileno()
    closed.close()
    with pytest.raises(ValueError):
        poll_select([fd], [], [], 0.01)


@pytest.mark.integration
def test_the_zookeeper_client_builds_no_selector_per_request(
        zk_connect: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """kazoo's own handler builds an epoll selector around every request and reply; with it,
    this client could not even connect."""

    class NoSelector:
        def __init__(self) -> None:
            raise AssertionError("a selector was built")

    monkeypatch.setattr(selectors, "DefaultSelector", NoSelector)
    zk = KafkaZkClient(zk_connect, session_timeout_ms=6000, connection_timeout_ms=3000).start()
    try:
        assert isinstance(zk.kazoo.handler, PollingThreadingHandler)
        for n in range(20):
            zk.kazoo.ensure_path(f"/tidelog-handler-test/{n}")
        assert len(zk.kazoo.get_children("/tidelog-handler-test")) == 20
        zk.kazoo.delete("/tidelog-handler-test", recursive=True)
    finally:
        zk.close()
