"""Replica assignment as Kafka's AdminUtils, and topic creation / deletion marking in ZooKeeper."""

from __future__ import annotations

import random

import pytest

from tidelog.controller import zk_data
from tidelog.controller.admin import (
    AdminError,
    AdminZkClient,
    assign_replicas_to_brokers,
    validate_topic_name,
)
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.controller.zk_data import BrokerEndPoint, BrokerInfo
from tidelog.protocol.errors import ErrorCode


def test_assignment_matches_kafkas_documented_example() -> None:
    # AdminUtils' scaladoc: 5 brokers, 10 partitions, RF 3, start index 0.
    got = assign_replicas_to_brokers([0, 1, 2, 3, 4], 10, 3, fixed_start_index=0)
    assert got == {
        0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
        5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2],
    }


def test_assignment_uses_the_sorted_broker_list_and_start_partition() -> None:
    got = assign_replicas_to_brokers([3, 1, 2], 2, 2, fixed_start_index=1, start_partition_id=3)
    # partition 3: 3 % 3 == 0 -> shift 2; first index (3+1)%3 = 1 -> broker 2
    assert got == {3: [2, 3], 4: [3, 1]}


def test_random_assignment_spreads_leaders_and_never_repeats_a_broker() -> None:
    rng = random.Random(7)
    for _ in range(50):
        brokers = sorted(rng.sample(range(10), rng.randint(1, 6)))
        rf = rng.randint(1, len(brokers))
        n = rng.randint(1, 20)
        got = assign_replicas_to_brokers(brokers, n, rf, rng=rng)
        assert sorted(got) == list(range(n))
        for replicas in got.values():
            assert len(replicas) == rf == len(set(replicas))
            assert set(replicas) <= set(brokers)
        leaders = [r[0] for r in got.values()]
        counts = [leaders.count(b) for b in brokers]
        assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize(
    ("partitions", "rf", "code"),
    [(0, 1, ErrorCode.INVALID_PARTITIONS), (1, 0, ErrorCode.INVALID_REPLICATION_FACTOR),
     (1, 4, ErrorCode.INVALID_REPLICATION_FACTOR)],
)
def test_assignment_refusals_carry_kafkas_error_codes(partitions: int, rf: int,
                                                      code: ErrorCode) -> None:
    with pytest.raises(AdminError) as e:
        assign_replicas_to_brokers([1, 2, 3], partitions, rf)
    assert e.value.error_code == code


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad name", "ü"])
def test_illegal_topic_names(name: str) -> None:
    with pytest.raises(AdminError) as e:
        validate_topic_name(name)
    assert e.value.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION


def _register(zk: KafkaZkClient, broker_id: int) -> None:
    zk.register_broker(BrokerInfo(broker_id, (BrokerEndPoint("PLAINTEXT", "127.0.0.1", 9000 + broker_id),)))


def test_create_topic_writes_config_and_assignment(zk_connect: str) -> None:
    clients = [KafkaZkClient(zk_connect).start() for _ in range(3)]
    try:
        for i, c in enumerate(clients, start=1):
            _register(c, i)
        admin = AdminZkClient(clients[0], rng=random.Random(1))
        assignment = admin.create_topic("orders", 6, 3, {"retention.ms": "1000"})
        assert clients[0].get_topic_assignment("orders") == assignment
        assert clients[0].get_topic_config("orders") == {"retention.ms": "1000"}
        with pytest.raises(AdminError) as e:
            admin.create_topic("orders", 1, 1)
        assert e.value.error_code == ErrorCode.TOPIC_ALREADY_EXISTS
        admin.create_topic("my.topic", 1, 1)
        with pytest.raises(AdminError) as e:
            admin.create_topic("my_topic", 1, 1)
        assert e.value.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
        with pytest.raises(AdminError) as e:
            admin.create_topic("cfg", 1, 1, {"no.such.key": "1"})
        assert e.value.error_code == ErrorCode.INVALID_CONFIG
        with pytest.raises(AdminError) as e:
            admin.create_topic("manual", 0, 0, replica_assignment={0: [1, 9]})
        assert e.value.error_code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
        assert admin.create_topic("manual", 0, 0, replica_assignment={0: [2, 1], 1: [3, 2]}) == {
            0: [2, 1], 1: [3, 2]}
        assert admin.create_topic("dry", 2, 1, validate_only=True)
        assert not clients[0].topic_exists("dry")

        admin.delete_topic("orders")
        assert clients[0].get_topic_deletions() == {"orders"}
        with pytest.raises(AdminError) as e:
            admin.delete_topic("absent")
        assert e.value.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert clients[0].kazoo.exists(zk_data.topic_path("orders")) is not None
    finally:
        for c in clients:
            c.close()


def test_create_partitions_continues_the_round_robin_and_keeps_the_topic_id(
        zk_connect: str) -> None:
    clients = [KafkaZkClient(zk_connect).start() for _ in range(3)]
    try:
        for i, c in enumerate(clients, start=1):
            _register(c, i)
        admin = AdminZkClient(clients[0])
        admin.create_topic("grown", 0, 0, replica_assignment={0: [2, 3], 1: [3, 1]})
        topic_id = clients[0].get_topic_id("grown")
        # Kafka's createNewPartitionsAssignment: the round-robin starts at partition 0's first
        # replica (broker 2, index 1) and continues from partition 2.
        assert admin.create_partitions("grown", 4, validate_only=True) == {2: [1, 3], 3: [2, 3]}
        assert sorted(clients[0].get_topic_assignment("grown") or {}) == [0, 1]
        assert admin.create_partitions("grown", 4) == {2: [1, 3], 3: [2, 3]}
        assert clients[0].get_topic_znode("grown") == (
            {0: [2, 3], 1: [3, 1], 2: [1, 3], 3: [2, 3]}, topic_id)
        with pytest.raises(AdminError) as e:
            admin.create_partitions("absent", 2)
        assert (e.value.error_code, e.value.message) == (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The topic 'absent' does not exist.")
    finally:
        for c in clients:
            c.close()
