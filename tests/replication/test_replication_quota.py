"""Replication throttles (Kafka's ReplicationQuotaManager): the sampled rate, the throttled
replica lists, and both sides of the throttle (the leader's reads, the follower's fetches)."""

from __future__ import annotations

import pytest
from replication_helpers import TP, new_log
from test_fetcher import CONFIG, data, leader_log

from tidelog.replication import FetchRequest, ReplicaFetcher
from tidelog.replication.replication_quota import (
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
    quotas.update_rates({"leader.replication.throttled.rate": "50"},
                        {"follower.replication.throttled.rate": "70"})
    assert (quotas.leader.bound, quotas.follower.bound) == (50, 70)
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
