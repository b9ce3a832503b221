"""LogConfig: Kafka's topic keys, defaults and validation."""

from __future__ import annotations

import pytest

from tidelog.storage.log_config import LONG_MAX, LogConfig


def test_defaults_are_kafkas() -> None:
    c = LogConfig()
    assert c.segment_bytes == 1 << 30
    assert c.segment_ms == 604_800_000 and c.retention_ms == 604_800_000
    assert c.index_interval_bytes == 4096 and c.segment_index_bytes == 10 * 1024 * 1024
    assert c.retention_bytes == -1
    assert c.flush_messages == LONG_MAX and c.flush_ms == LONG_MAX
    assert c.max_message_bytes == 1048588
    assert c.min_insync_replicas == 1 and c.unclean_leader_election_enable is False
    assert c.to_dict()["segment.bytes"] == 1 << 30


def test_from_dict_parses_kafka_keys_over_a_base() -> None:
    c = LogConfig.from_dict({"segment.bytes": "1048576", "min.insync.replicas": 2,
                             "unclean.leader.election.enable": "true",
                             "cleanup.policy": "delete"})
    assert c.segment_bytes == 1048576 and c.min_insync_replicas == 2
    assert c.unclean_leader_election_enable is True and c.cleanup_policy == "delete"
    d = LogConfig.from_dict({"retention.ms": "-1"}, base=c)
    assert d.retention_ms == -1 and d.segment_bytes == 1048576


def test_the_compaction_keys_are_accepted() -> None:
    c = LogConfig.from_dict({"cleanup.policy": "compact,delete", "delete.retention.ms": "1000",
                             "min.compaction.lag.ms": "1", "max.compaction.lag.ms": "1000",
                             "min.cleanable.dirty.ratio": "0.1"})
    assert (c.cleanup_policy, c.delete_retention_ms, c.min_compaction_lag_ms,
            c.max_compaction_lag_ms, c.min_cleanable_dirty_ratio) == ("compact,delete", 1000, 1,
                                                                      1000, 0.1)


def test_message_downconversion_enable_takes_both_values_true_by_default() -> None:
    assert LogConfig().message_downconversion_enable is True  # Kafka's default
    off = LogConfig.from_dict({"message.downconversion.enable": "false"})
    assert off.message_downconversion_enable is False


@pytest.mark.parametrize(("key", "value"), [
    ("preallocate", "true"),
])
def test_settings_of_unimplemented_features_are_refused_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"for configuration {key}: .*not|never"):
        LogConfig.from_dict({key: value})
    default = LogConfig().to_dict()[key]
    assert LogConfig.from_dict({key: default}) == LogConfig()  # what tidelog does: accepted


@pytest.mark.parametrize("key", ["leader.replication.throttled.replicas",
                                 "follower.replication.throttled.replicas"])
def test_throttled_replica_lists_take_kafkas_values(key: str) -> None:
    for value in ("0:1,0:2", "*", "", " 1:3 , 2:4 "):
        assert getattr(LogConfig.from_dict({key: value}), key.replace(".", "_")) == value
    with pytest.raises(ValueError, match=f"Invalid value 0-1 for configuration {key}: {key} "
                                         "must be the literal '\\*' or a list of replicas"):
        LogConfig.from_dict({key: "0-1"})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("segment.bytes", "10"),  # below Kafka's minimum of 14
        ("segment.bytes", "lots"),
        ("segment.ms", 0),
        ("retention.ms", -2),
        ("min.insync.replicas", 0),
        ("unclean.leader.election.enable", "yes"),
        ("cleanup.policy", "shred"),
        ("message.timestamp.type", "WallClock"),
        ("max.message.bytes", 1.5),
        ("flush.messages", True),
        ("min.cleanable.dirty.ratio", "2"),
        ("preallocate", "maybe"),
    ],
)
def test_bad_values_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"configuration {key}"):
        LogConfig.from_dict({key: value})


def test_an_unknown_key_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown configuration segment.size"):
        LogConfig.from_dict({"segment.size": 5})
