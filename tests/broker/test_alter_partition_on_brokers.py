"""AlterPartition (KIP-497) on three real brokers with the real controller: a follower that
catches up is added to the ISR by the controller on its leader's request, and every broker's
metadata has the new ISR at once — UpdateMetadata sent because of the AlterPartition, with no
/isr_change_notification written (before: the leader wrote the ISR and the notification, which
the controller took up after the 5 s quiet period)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import BrokerThread, broker_props, produce, wait_until
from zk_chroot import new_chroot

from tidelog.controller import zk_data
from tidelog.controller.admin import AdminZkClient
from tidelog.controller.controller import KafkaController
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records.builder import build_values

pytestmark = pytest.mark.integration

TOPIC = "ap"


def props(broker_id: int, zk: str, d: Path) -> dict[str, str]:
    return broker_props(broker_id, zk, d / f"b{broker_id}",
                        **{"auto.leader.rebalance.enable": "false",
                           "replica.lag.time.max.ms": "1000"})


@pytest.fixture
def cluster(zookeeper: Any, tmp_path: Path) -> Iterator[tuple[str, dict[int, BrokerThread]]]:
    zk = new_chroot(zookeeper)
    brokers = {i: BrokerThread(props(i, zk, tmp_path), controller_factory=KafkaController)
               .start() for i in (1, 2, 3)}
    try:
        wait_until(lambda: all(len(b.server.metadata_cache.brokers) == 3
                               for b in brokers.values()), what="every broker knows the three")
        yield zk, brokers
    finally:
        for b in brokers.values():
            b.stop()


def metadata_isr(b: BrokerThread) -> tuple[int, ...] | None:
    parts = b.call(lambda: b.server.metadata_cache.topic_partitions(TOPIC))
    return tuple(sorted(parts[0].isr)) if 0 in parts else None


def test_a_follower_that_catches_up_is_in_every_brokers_metadata_without_a_notification(
        cluster: tuple[str, dict[int, BrokerThread]], tmp_path: Path) -> None:
    zk_connect, brokers = cluster
    zk = KafkaZkClient(zk_connect).start(create_top_level_paths=False)
    try:
        AdminZkClient(zk).create_topic(TOPIC, 1, 3, replica_assignment={0: [1, 2, 3]})
        wait_until(lambda: all(metadata_isr(b) == (1, 2, 3) for b in brokers.values()),
                   what="the topic in every broker's metadata")
        notifications = zk._zk.exists(zk_data.ISR_CHANGE_NOTIFICATION_PATH)
        assert notifications is not None
        # Broker 3 stops (no controlled shutdown): the controller takes it out of the ISR.
        brokers.pop(3).stop()
        wait_until(lambda: (s := zk.get_partition_state((TOPIC, 0))) is not None
                   and s.isr == (1, 2), what="3 out of the ISR")
        assert produce(brokers[1].port, TOPIC, 0, build_values([b"a", b"b"]))[0] == \
            ErrorCode.NONE
        # It comes back, catches up; leader 1 proposes [1, 2, 3] to the controller.
        brokers[3] = BrokerThread(props(3, zk_connect, tmp_path),
                                  controller_factory=KafkaController).start()
        wait_until(lambda: all(metadata_isr(b) == (1, 2, 3) for b in brokers.values()),
                   timeout_s=20, what="3 back in the ISR in every broker's metadata")
        manager = brokers[1].server.replica_manager.alter_partition_manager
        assert brokers[1].call(lambda: manager.answered.get(ErrorCode.NONE, 0)) >= 1
        state = zk.get_partition_state((TOPIC, 0))
        assert state is not None and state.isr == (1, 2, 3) and state.leader == 1
        # The controller wrote it; no leader wrote an ISR-change notification (the znode's
        # children were never created: its child version is unchanged).
        after = zk._zk.exists(zk_data.ISR_CHANGE_NOTIFICATION_PATH)
        assert after is not None and after.cversion == notifications.cversion
    finally:
        zk.close()
