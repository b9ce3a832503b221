from __future__ import annotations

import json

import pytest

from tidelog.controller import zk_data
from tidelog.controller.zk_data import (
    BrokerEndPoint,
    BrokerInfo,
    LeaderIsrAndControllerEpoch,
    ZkDataError,
)


def test_broker_info_round_trips_with_several_listeners_and_a_rack() -> None:
    info = BrokerInfo(
        3,
        (BrokerEndPoint("CLIENT", "127.0.0.1", 9092), BrokerEndPoint("REPL", "::1", 9093)),
        rack="r1",
    )
    data = info.encode(timestamp_ms=1234)
    obj = json.loads(data)
    assert obj["endpoints"] == ["CLIENT://127.0.0.1:9092", "REPL://[::1]:9093"]
    assert obj["timestamp"] == "1234" and obj["rack"] == "r1"
    assert BrokerInfo.decode(3, data) == info
    assert info.endpoint("REPL") == BrokerEndPoint("REPL", "::1", 9093)
    assert info.endpoint("NOPE") is None


def test_version_1_broker_registration_is_read() -> None:
    data = b'{"version":1,"host":"h","port":9092,"jmx_port":-1,"timestamp":"1"}'
    assert BrokerInfo.decode(5, data).endpoints == (BrokerEndPoint("PLAINTEXT", "h", 9092),)


def test_broker_info_from_kafka_config_endpoints() -> None:
    from tidelog.broker.config import KafkaConfig

    config = KafkaConfig.from_text("broker.id=4\nlisteners=PLAINTEXT://127.0.0.1:9101\n")
    info = BrokerInfo.from_endpoints(4, config.advertised_listeners)
    assert info.endpoints == (BrokerEndPoint("PLAINTEXT", "127.0.0.1", 9101, "PLAINTEXT"),)


@pytest.mark.parametrize(
    ("decode", "data"),
    [
        (lambda d: BrokerInfo.decode(1, d), b"not json"),
        (lambda d: BrokerInfo.decode(1, d), b'{"version":4}'),
        (lambda d: zk_data.decode_controller(d), b'{"version":1}'),
        (lambda d: zk_data.decode_controller(d), None),
        (lambda d: zk_data.decode_controller_epoch(d), b"x1"),
        (lambda d: zk_data.decode_topic_assignment("t", d), b'{"partitions":{"a":[1]}}'),
        (lambda d: LeaderIsrAndControllerEpoch.decode(("t", 0), d, 0), b'{"leader":1}'),
        (lambda d: zk_data.decode_isr_change_notification("/p", d), b'{"partitions":[{}]}'),
        (lambda d: zk_data.decode_cluster_id(d), b"[]"),
    ],
)
def test_malformed_znode_data_is_a_zk_data_error(decode: object, data: bytes | None) -> None:
    with pytest.raises(ZkDataError):
        decode(data)  # type: ignore[operator]


def test_partition_state_encoding_is_kafkas() -> None:
    state = LeaderIsrAndControllerEpoch(leader=2, leader_epoch=5, isr=(2, 3), controller_epoch=7)
    assert json.loads(state.encode()) == {
        "controller_epoch": 7, "leader": 2, "version": 1, "leader_epoch": 5, "isr": [2, 3]}
    back = LeaderIsrAndControllerEpoch.decode(("t", 0), state.encode(), 9)
    assert back.zk_version == 9 and back.same_state(state) and back != state


def test_paths() -> None:
    assert zk_data.partition_state_path(("orders", 3)) == "/brokers/topics/orders/partitions/3/state"
    assert zk_data.broker_path(1) == "/brokers/ids/1"
    assert zk_data.delete_topic_path("t") == "/admin/delete_topics/t"
    assert zk_data.topic_config_path("t") == "/config/topics/t"
    assert zk_data.isr_change_sequence_number("/isr_change_notification/isr_change_0000000004") == (
        "0000000004")


def test_config_values_are_stored_as_strings() -> None:
    data = zk_data.encode_config({"a": True, "b": 5, "c": ["x", "y"]})
    assert json.loads(data) == {"version": 1, "config": {"a": "true", "b": "5", "c": "x,y"}}
    assert zk_data.decode_config("/p", data) == {"a": "true", "b": "5", "c": "x,y"}
    assert zk_data.decode_config("/p", None) == {}
