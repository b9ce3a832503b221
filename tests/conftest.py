"""Shared fixtures. Keep this file small and cheap to import; add fixtures below."""

from __future__ import annotations

import random
from collections.abc import Iterator

import kazoo.protocol.connection
import pytest
from zk_chroot import new_chroot

from tidelog.cluster.zookeeper import ZooKeeperServer

# kazoo's connection thread draws its ping jitter from the global `random` on every turn of its
# loop. A ZooKeeper client that lives through the session (the integration tests' real_cluster)
# thus changes the global state while Hypothesis draws in later tests, which Hypothesis reports
# as "Do not use the `random` module inside strategies". Its own generator: same jitter.
kazoo.protocol.connection.random = random.Random()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One private, real ZooKeeper (Debian's) for the whole test session, on 127.0.0.1.

    Started lazily by the first test that asks for it; killed with the test process even if
    pytest itself is killed (die_with_parent).
    """
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), die_with_parent=True)
    server.start(timeout_s=60)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_connect(zookeeper: ZooKeeperServer) -> str:
    """A connect string with a fresh chroot, so each test sees an empty ZooKeeper tree."""
    return new_chroot(zookeeper)
