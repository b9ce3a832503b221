"""Fixtures for the broker tests: real ZooKeeper chroots and real BrokerServer instances."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import ActingController, BrokerThread, broker_props  # noqa: E402
from zk_chroot import new_chroot

from tidelog.cluster.zookeeper import ZooKeeperServer  # noqa: E402


@pytest.fixture(scope="module")
def module_zk(zookeeper: ZooKeeperServer) -> str:
    return new_chroot(zookeeper)


@pytest.fixture(scope="module")
def one_broker(module_zk: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    """One broker shared by a module's tests (each test uses its own topics). Its tests act
    as the transaction coordinator themselves (WriteTxnMarkers by hand), so there is none to
    verify a transactional produce with (KIP-890): verification is off."""
    b = BrokerThread(broker_props(1, module_zk, tmp_path_factory.mktemp("broker1"),
                                  **{"connections.max.idle.ms": 60000,
                                     "transaction.partition.verification.enable": "false"})
                     ).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def start_brokers(zookeeper: ZooKeeperServer, tmp_path: Path
                  ) -> Iterator[Callable[..., tuple[str, list[BrokerThread]]]]:
    """``start_brokers(n, **props)``: brokers 1..n on a fresh chroot with ``props`` over
    broker_props'; (the chroot, the brokers), stopped at the test's end."""
    started: list[BrokerThread] = []

    def start(n: int, **props: Any) -> tuple[str, list[BrokerThread]]:
        zk = new_chroot(zookeeper)
        for i in range(1, n + 1):
            started.append(BrokerThread(broker_props(i, zk, tmp_path / f"b{i}", **props)).start())
        return zk, started[-n:]

    try:
        yield start
    finally:
        for b in started:
            b.stop()


@pytest.fixture(scope="module")
def controller(module_zk: str, one_broker: BrokerThread) -> Iterator[ActingController]:
    c = ActingController(module_zk, [one_broker])
    try:
        yield c
    finally:
        c.close()
