"""Topic ids (KIP-516) in ZooKeeper and from the controller: a random id in the topic's znode at
creation (Kafka's TopicZNode v3), read back by the controller and sent in UpdateMetadata v7; a
topic written before topic ids gets one from the controller."""

from __future__ import annotations

import asyncio
import uuid

from test_controller import Cluster, create_topic, three_brokers, wait_for, with_cluster

from tidelog.controller import zk_data
from tidelog.controller.admin import AdminZkClient, new_topic_id
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.primitives import ZERO_UUID

# /brokers/topics/big as Apache Kafka 3.9.1 wrote it (read from a reference cluster).
KAFKA_TOPIC_ZNODE = (b'{"partitions":{"0":[2,1,3]},"topic_id":"UCx8j9NvSV6UZo-kLaX6Lw",'
                     b'"adding_replicas":{},"removing_replicas":{},"version":3}')


def test_a_topic_znode_written_by_kafka_decodes_with_its_id() -> None:
    assignment, topic_id = zk_data.decode_topic_znode("big", KAFKA_TOPIC_ZNODE)
    assert assignment == {0: [2, 1, 3]}
    assert topic_id is not None
    assert zk_data.topic_id_to_string(topic_id) == "UCx8j9NvSV6UZo-kLaX6Lw"  # URL-safe: '-'


def test_a_topic_znode_with_an_id_is_version_3_and_round_trips() -> None:
    topic_id = new_topic_id()
    data = zk_data.encode_topic_assignment({0: [1, 2], 1: [2, 1]}, topic_id)
    assert b'"version":3' in data
    assert zk_data.decode_topic_znode("t", data) == ({0: [1, 2], 1: [2, 1]}, topic_id)


def test_a_topic_znode_from_before_topic_ids_has_none() -> None:
    data = zk_data.encode_topic_assignment({0: [1]})
    assert b'"version":2' in data and b"topic_id" not in data
    assert zk_data.decode_topic_znode("t", data) == ({0: [1]}, None)


def test_new_topic_ids_are_random_never_zero_nor_a_flag() -> None:
    ids = {new_topic_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(i.int > 1 and not zk_data.topic_id_to_string(i).startswith("-") for i in ids)


@with_cluster
async def test_each_created_topic_gets_its_own_id_in_its_znode(cluster: Cluster) -> None:
    await three_brokers(cluster)
    admin = AdminZkClient(cluster.admin_zk)
    await asyncio.to_thread(admin.create_topic, "a", 1, 1)
    await asyncio.to_thread(admin.create_topic, "b", 1, 1)
    ida = cluster.admin_zk.get_topic_id("a")
    idb = cluster.admin_zk.get_topic_id("b")
    assert ida is not None and idb is not None and ida != idb


@with_cluster
async def test_update_metadata_carries_each_topics_id(cluster: Cluster) -> None:
    await three_brokers(cluster)
    await create_topic(cluster, "orders", {0: [1, 2, 3], 1: [2, 3, 1]})
    topic_id = cluster.admin_zk.get_topic_id("orders")
    assert topic_id is not None
    for b in cluster.brokers.values():
        ums = await wait_for(lambda b=b: [u for u in b.of(ApiKey.UPDATE_METADATA)
                                          if any(t.topic_name == "orders"
                                                 for t in u.topic_states)],
                             what=f"UpdateMetadata naming orders to broker {b.broker_id}")
        ids = {t.topic_id for u in ums for t in u.topic_states if t.topic_name == "orders"}
        assert ids == {topic_id}


@with_cluster
async def test_a_topic_written_without_an_id_gets_one_from_the_controller(
        cluster: Cluster) -> None:
    # As a ZooKeeper written by Kafka < 2.8 (or tidelog before topic ids) holds it.
    await asyncio.to_thread(cluster.admin_zk.create_topic, "legacy", {0: [1, 2, 3]})
    assert cluster.admin_zk.get_topic_id("legacy") is None
    await three_brokers(cluster)
    topic_id = await wait_for(lambda: cluster.admin_zk.get_topic_id("legacy"),
                              what="an id written to the legacy topic's znode")
    assert topic_id != ZERO_UUID
    b = cluster.brokers[2]
    await wait_for(lambda: any(t.topic_name == "legacy" and t.topic_id == topic_id
                               for u in b.of(ApiKey.UPDATE_METADATA) for t in u.topic_states),
                   what="UpdateMetadata with the legacy topic's new id")
    assert isinstance(topic_id, uuid.UUID)


def test_a_partition_added_while_the_controller_gives_a_topic_its_id_is_kept() -> None:
    # A pre-2.8 admin's CreatePartitions lands between the controller's read of the legacy
    # znode and its write-back with the new id: the write is on the version read, so the
    # controller reads again instead of overwriting the addition.
    from typing import Any

    from tidelog.controller.controller import KafkaController
    from tidelog.sim.clock import Scheduler
    from tidelog.sim.zookeeper import SimZooKeeper

    zk = SimZooKeeper(Scheduler())
    assert zk.create_path(zk_data.topic_path("legacy"), zk_data.encode_topic_assignment({0: [1, 2]}))
    write = zk.set_topic_assignment
    raced: list[int] = []

    def admin_writes_first(topic: str, assignment: Any, *args: Any, **kwargs: Any) -> int:
        if not raced:
            raced.append(write(topic, {0: [1, 2], 1: [2, 1]}))
        return write(topic, assignment, *args, **kwargs)

    zk.set_topic_assignment = admin_writes_first  # type: ignore[method-assign]
    assert zk.create_path(zk_data.CONTROLLER_EPOCH_PATH, zk_data.encode_controller_epoch(1))
    controller = KafkaController({}, zk, 1)  # type: ignore[arg-type]
    controller.epoch_zk_version = zk.get_data_and_version(zk_data.CONTROLLER_EPOCH_PATH)[1]
    assert controller._read_topic("legacy") == {0: [1, 2], 1: [2, 1]}
    data, _ = zk.get_data_and_version(zk_data.topic_path("legacy"))
    assert zk_data.decode_topic_znode("legacy", data) == (
        {0: [1, 2], 1: [2, 1]}, controller.topic_ids["legacy"])
