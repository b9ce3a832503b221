"""Replication throttles (Kafka's ReplicationQuotaManager): the sampled rate, the throttled
replica lists, and both sides of the throttle (the leader's reads, the follower's fetches)."""

from __future__ import annotations

import pytest
from replication_helpers import TP, new_log
from test_fetcher import CONFIG, data, leader_log

from tidelog.replication import FetchRequest, ReplicaFetcher
from tidelog.replication.replication_quota import (
    QUOTA_BYTES_PER_SECOND_DEFAULT,
    ReplicationQuotaManager,
    ReplicationQuotas,
    parse_rate,
    should_throttle,
    throttled_partitions,
)
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import validate_throttled_replicas


def test_the_rate_spans_at_least_the_full_windows_but_one() -> None:
    q = ReplicationQuotaManager(num_windows=11, window_size_ms=1000, bound=100)
    q.record(1000, now_ms=0)
    # 1,000 bytes over (11 - 1) s: 100 B/s, not above the bound
    assert q.rate(0) == pytest.approx(100.0)
    assert not q.is_quota_exceeded(0)
    q.record(100, now_ms=500)
    # 1,100 bytes over 10.5 s (the span so far plus the windows it lacks): above 100 B/s
    assert q.is_quota_exceeded(500)
    # the samples expire after 11 windows
    assert not q.is_quota_exceeded(12_500)


def test_unbounded_is_never_exceeded() -> None:
    q = ReplicationQuotaManager()
    q.record(10**12, now_ms=0)
    assert not q.is_quota_exceeded(0)


def test_throttled_replica_lists_name_this_brokers_partitions() -> None:
    assert throttled_partitions("0:1,1:2, 2:1", 1) == {0, 2}
    assert throttled_partitions("*", 7) is None
    assert throttled_partitions("", 1) == set()
    assert validate_throttled_replicas("k", "0:1,1:2") == "0:1,1:2"
    with pytest.raises(ValueError, match="must be the literal"):
        validate_throttled_replicas("k", "0-1")
    assert parse_rate("leader.replication.throttled.rate", "10") == 10
    with pytest.raises(ValueError, match="Not a number of type LONG"):
        parse_rate("leader.replication.throttled.rate", "x")


def test_quotas_follow_the_broker_configs_and_topic_overrides() -> None:
    quotas = ReplicationQuotas(broker_id=2)
    quotas.update_rates({"leader.replication.throttled.rate": "50",
                         "replica.alter.log.dirs.io.max.bytes.per.second": "90"},
                        {"follower.replication.throttled.rate": "70"})
    assert (quotas.leader.bound, quotas.follower.bound, quotas.alter_log_dirs.bound) == \
        (50, 70, 90)
    quotas.update_rates({}, {})
    assert quotas.alter_log_dirs.bound == QUOTA_BYTES_PER_SECOND_DEFAULT
    quotas.update_topic("orders", {"leader.replication.throttled.replicas": "0:1",
                                   "follower.replication.throttled.replicas": "0:2"})
    assert not quotas.leader.is_throttled(TP) and quotas.follower.is_throttled(TP)
    quotas.update_topic("orders", {})
    assert not quotas.follower.is_throttled(TP)


def test_in_sync_replicas_are_never_throttled() -> None:
    q = ReplicationQuotaManager(bound=1)
    q.mark_throttled(TP.topic, None)
    q.record(100, 0)
    assert should_throttle(q, TP, in_sync=False, now_ms=0)
    assert not should_throttle(q, TP, in_sync=True, now_ms=0)
    assert not should_throttle(None, TP, in_sync=False, now_ms=0)


def test_a_follower_over_its_rate_leaves_a_lagging_throttled_partition_out_of_its_fetch() -> None:
    io = MemoryFileIO()
    leader = leader_log(io, [(0, 5), (0, 5)])
    quota = ReplicationQuotaManager(bound=1)
    quota.mark_throttled(TP.topic, {TP.partition})
    logs = {TP: new_log(io, 2, TP)}
    f = ReplicaFetcher(2, 1, logs.get, CONFIG.with_(follower_quota=quota))
    f.add_partitions({TP: (0, 0)}, now_ms=0)
    quota.record(1000, now_ms=0)  # over the rate already
    # lag unknown (a new leader): fetched anyway, its answer tells the lag
    req = next(r for r in f.poll_requests(0) if isinstance(r, FetchRequest))
    # the first answer carries 5 of the 10 records: still lagging the leader's HW of 10
    half = data(leader, 0, hw=10)
    half = type(half)(half.error, half.high_watermark, half.log_start_offset,
                      bytes(leader.read(0, 1 << 20, max_offset=5).records))
    f.handle_response(req, {TP: half}, 1)
    assert logs[TP].log_end_offset == 5
    # over 1 B/s now: the partition is left out (no fetch at all), asked again after the back-off
    assert not [r for r in f.poll_requests(2) if isinstance(r, FetchRequest)]
    quota.update_quota(10**9)
    later = [r for r in f.poll_requests(2 + CONFIG.replica_fetch_backoff_ms)
             if isinstance(r, FetchRequest)]
    assert later and later[0].partitions[TP].fetch_offset == 5


def exceeded_after_a_burst(num_windows: int, window_size_ms: int, bound: int,
                           at_ms: int) -> bool:
    """1,000 bytes at t=0 against `bound` B/s, asked at `at_ms`."""
    q = ReplicationQuotaManager(num_windows, window_size_ms, bound)
    q.record(1000, now_ms=0)
    return q.is_quota_exceeded(at_ms)


def test_the_number_of_windows_sets_how_much_a_burst_is_diluted_and_how_long_it_is_held() -> None:
    # 11 windows: 1,000 B over 10 s = 100 B/s; 2 windows: over 1 s = 1,000 B/s
    assert not exceeded_after_a_burst(11, 1000, 200, at_ms=0)
    assert exceeded_after_a_burst(2, 1000, 200, at_ms=0)
    # held for 11 windows with 11 of them, 2 with 2 (Kafka's purgeObsoleteSamples)
    assert exceeded_after_a_burst(11, 1000, 50, at_ms=10_999)
    assert not exceeded_after_a_burst(2, 1000, 50, at_ms=2_000)
    assert exceeded_after_a_burst(2, 1000, 50, at_ms=1_999)


def test_the_window_size_sets_how_much_a_burst_is_diluted_and_how_long_it_is_held() -> None:
    # 11 windows of 1 s: 1,000 B over 10 s = 100 B/s; of 2 s: over 20 s = 50 B/s
    assert exceeded_after_a_burst(11, 1000, 60, at_ms=0)
    assert not exceeded_after_a_burst(11, 2000, 60, at_ms=0)
    assert not exceeded_after_a_burst(11, 1000, 1, at_ms=11_000)
    assert exceeded_after_a_burst(11, 2000, 1, at_ms=11_000)
    assert not exceeded_after_a_burst(11, 2000, 1, at_ms=22_000)


def test_samples_are_reused_in_a_ring_of_one_more_than_the_windows() -> None:
    """Kafka's SampledStat.advance: 3 windows keep 4 samples; a record once the current
    sample has lasted a window goes into the next, the oldest one started over."""
    q = ReplicationQuotaManager(num_windows=3, window_size_ms=1000, bound=1)
    for t in range(5):  # 100 B in each of 5 consecutive windows
        q.record(100, now_ms=t * 1000)
    # the samples of t = 1..4 s are kept (t = 0 was reused): 400 B since the oldest began
    assert q.rate(3999) == pytest.approx(400 / 2.999)
    # at 4 s the sample of t = 1 s has had no event for 3 windows: it starts over, empty
    assert q.rate(4000) == pytest.approx(300 / 2)


def test_the_broker_builds_its_quotas_from_the_window_configs() -> None:
    from tidelog.broker.config import ConfigError, KafkaConfig
    from tidelog.broker.server import BrokerServer

    base = "broker.id=1\nzookeeper.connect=127.0.0.1:2181\nlog.dirs=/nonexistent\n"
    default = BrokerServer(KafkaConfig.from_text(base)).replication_quotas
    assert (default.leader.num_windows, default.leader.window_size_ms) == (11, 1000)
    quotas = BrokerServer(KafkaConfig.from_text(
        base + "replication.quota.window.num=3\nreplication.quota.window.size.seconds=2\n"
        "alter.log.dirs.replication.quota.window.num=4\n"
        "alter.log.dirs.replication.quota.window.size.seconds=5\n"
    )).replication_quotas
    for q in (quotas.leader, quotas.follower):
        assert (q.num_windows, q.window_size_ms) == (3, 2000)
    assert (quotas.alter_log_dirs.num_windows, quotas.alter_log_dirs.window_size_ms) == (4, 5000)
    assert (default.alter_log_dirs.num_windows, default.alter_log_dirs.window_size_ms) == \
        (11, 1000)
    for key in ("replication.quota.window.num", "replication.quota.window.size.seconds",
                "alter.log.dirs.replication.quota.window.num",
                "alter.log.dirs.replication.quota.window.size.seconds"):
        with pytest.raises(ConfigError, match=f"^{key}: value 0 must be at least 1"):
            KafkaConfig.from_text(base + f"{key}=0\n")
