"""Dynamic broker configs: precedence, validation and Kafka's synonym lists."""

from __future__ import annotations

import pytest

from tidelog.broker.config import ConfigError, KafkaConfig
from tidelog.broker.dynamic_config import DynamicBrokerConfig


def dynamic(text: str = "") -> DynamicBrokerConfig:
    return DynamicBrokerConfig(KafkaConfig.from_text(text))


def test_per_broker_over_cluster_default_over_static_over_default() -> None:
    d = dynamic("log.segment.bytes=5000000\n")
    assert d.current.get("log.segment.bytes") == 5000000 and d.source_of("log.segment.bytes") == 4
    d.update({"log.segment.bytes": "6000000", "min.insync.replicas": "2"},
             {"log.segment.bytes": "7000000"})
    assert d.current.get("log.segment.bytes") == 7000000 and d.source_of("log.segment.bytes") == 2
    assert d.current.get("min.insync.replicas") == 2 and d.source_of("min.insync.replicas") == 3
    assert d.current.log_config()["segment.bytes"] == 7000000
    assert d.config_synonyms("log.segment.bytes") == [
        ("log.segment.bytes", "7000000", 2), ("log.segment.bytes", "6000000", 3),
        ("log.segment.bytes", "5000000", 4), ("log.segment.bytes", str(1 << 30), 5)]
    assert d.source_of("num.partitions") == 5


def test_derived_keys_list_synonyms_only_from_their_own_name_on() -> None:
    d = dynamic("log.retention.hours=24\n")
    assert d.config_synonyms("log.retention.ms") == []  # Kafka 3.9 shows none here
    d.update({"log.retention.ms": "7200000"}, {})
    assert d.config_synonyms("log.retention.ms") == [
        ("log.retention.ms", "7200000", 3), ("log.retention.hours", "24", 4),
        ("log.retention.hours", "168", 5)]
    assert d.current.log_config()["retention.ms"] == 7200000


def test_only_dynamic_keys_change_and_bad_values_change_nothing() -> None:
    d = dynamic()
    with pytest.raises(ConfigError, match=r"Cannot update these configs dynamically: Set\(log.dirs\)"):
        d.validate({"log.dirs": "/x"}, per_broker=True)
    d.validate({"unclean.leader.election.enable": "true"}, per_broker=False)  # dynamic
    with pytest.raises(ConfigError, match="log.segment.bytes"):
        d.validate({"log.segment.bytes": "lots"}, per_broker=True)
    with pytest.raises(ConfigError, match="log.cleanup.policy"):
        d.validate({"log.cleanup.policy": "shred"}, per_broker=False)
    d.validate({"log.cleanup.policy": "compact"}, per_broker=False)  # compaction is dynamic too
    d.validate({"custom.key": "kept", "log.retention.ms": "1000"}, per_broker=True)
    with pytest.raises(ConfigError):
        d.update({}, {"log.segment.bytes": "lots"})
    assert d.per_broker == {} and d.current is d.static
