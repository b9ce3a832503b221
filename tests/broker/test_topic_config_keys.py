"""Every topic config key the broker's DescribeConfigs reports is enforced or refused (issue 11).

The keys come from a real broker over the wire; each must have an entry here (a new key without
one fails the walk). An enforced key is set on a topic and the behaviour it governs is observed
next to the same observation under the broker's defaults: the two must differ. A refused key
(a feature tidelog does not implement) must make CreateTopics fail with INVALID_CONFIG and a
message naming the key, and the topic must not exist afterwards.

Observations of the produce path go over the wire (a topic of the broker, the test acting as the
controller); the log's own policies (rolls, indexes, retention, flushes, file deletion) run on a
log built from the topic's config exactly as the broker builds it (`LogConfig.from_dict(topic
overrides, broker defaults)`), where the test controls the clock; the election policy runs on the
controller's per-topic election core.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from harness import ActingController, BrokerThread, fetch, produce, send, values_of

from tidelog.controller.controller import _TopicAwareCore, _unclean_override
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import create_topics as m_ct
from tidelog.protocol.messages import describe_configs as m_dc
from tidelog.protocol.messages.api_versions import ApiVersionsRequest
from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import Record, build_batch, build_values
from tidelog.protocol.records.compression import GZIP
from tidelog.protocol.records.decoder import decode_records
from tidelog.replication.replication_quota import QUOTA_BYTES_PER_SECOND_DEFAULT
from tidelog.replication.types import TopicPartition
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.cleaner.log_cleaner import (
    Cleaner,
    CleanerConfig,
    LogCleanerManager,
    cleanable_offsets,
    log_to_clean,
)
from tidelog.storage.cleaner.offset_map import OffsetMap
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

pytestmark = pytest.mark.integration

_names = itertools.count()
Observe = Callable[[dict[str, str]], Any]


def _topic_config(broker: BrokerThread, overrides: dict[str, str]) -> LogConfig:
    return LogConfig.from_dict(overrides, LogConfig.from_dict(broker.config.log_config()))


# ----------------------------------------------------------------- observations: the wire


def _wire(fn: Callable[[BrokerThread, str], Any]) -> Callable[..., Any]:
    def observe(broker: BrokerThread, controller: ActingController, cfg: dict[str, str]) -> Any:
        topic = f"walk{next(_names)}"
        # Replicas [1, 2], broker 2 absent: broker 1 leads with ISR [1] of two replicas (an
        # ISR of one below min.insync.replicas=2; Kafka caps it at the replication factor).
        controller.create_topic(topic, {0: [1, 2]}, config=cfg)
        return fn(broker, topic)
    return observe


@_wire
def stored_codec(broker: BrokerThread, topic: str) -> int:
    assert produce(broker.port, topic, 0, build_values([b"x" * 100] * 5), acks=1)[0] == 0
    return next(iter_batches(fetch(broker.port, topic, 0, 0).records)).compression_type


@_wire
def stored_batch_size(broker: BrokerThread, topic: str) -> int:
    """The size of an uncompressed batch of text as the leader stores it, recompressed under
    the topic's compression.type (and level)."""
    words = [b"tide%d log%d" % (i * 7919 % 1000, i * 104729 % 977) for i in range(2000)]
    assert produce(broker.port, topic, 0, build_values(words), acks=1)[0] == 0
    return next(iter_batches(fetch(broker.port, topic, 0, 0).records)).size_in_bytes


@_wire
def stored_timestamp_type(broker: BrokerThread, topic: str) -> int:
    assert produce(broker.port, topic, 0, build_values([b"x"]), acks=1)[0] == 0
    return next(iter_batches(fetch(broker.port, topic, 0, 0).records)).timestamp_type


@_wire
def an_hour_old_timestamp(broker: BrokerThread, topic: str) -> int:
    import time

    old = int(time.time() * 1000) - 3_600_000
    return produce(broker.port, topic, 0, build_batch([Record(b"x", timestamp=old)]), acks=1)[0]


@_wire
def an_hour_ahead_timestamp(broker: BrokerThread, topic: str) -> int:
    import time

    ahead = int(time.time() * 1000) + 3_600_000
    return produce(broker.port, topic, 0, build_batch([Record(b"x", timestamp=ahead)]), acks=1)[0]


@_wire
def a_2kb_batch(broker: BrokerThread, topic: str) -> int:
    return produce(broker.port, topic, 0, build_values([b"x" * 2048]), acks=1)[0]


@_wire
def an_unkeyed_record(broker: BrokerThread, topic: str) -> int:
    return produce(broker.port, topic, 0, build_values([b"x"]), acks=1)[0]


@_wire
def acks_all_on_one_replica(broker: BrokerThread, topic: str) -> int:
    return produce(broker.port, topic, 0, build_values([b"x"]), acks=-1)[0]


@_wire
def a_lagging_follower_fetching_twice(broker: BrokerThread, topic: str) -> list[int]:
    """Bytes a replica out of the ISR (2) gets in two fetches of the same offset while the
    broker's leader.replication.throttled.rate is 1 byte/s (the first fetch's bytes count)."""
    quota = broker.server.replication_quotas.leader
    assert produce(broker.port, topic, 0, build_values([b"x" * 100] * 5), acks=1)[0] == 0
    quota.update_quota(1)
    try:
        return [len(fetch(broker.port, topic, 0, 0, replica_id=2).records or b"")
                for _ in range(2)]
    finally:
        quota.update_quota(QUOTA_BYTES_PER_SECOND_DEFAULT)


@_wire
def follower_quota_applies(broker: BrokerThread, topic: str) -> bool:
    """Whether the broker's fetchers throttle the partition (the fetcher's side of the
    throttle is tests/replication/test_replication_quota.py's)."""
    return broker.server.replication_quotas.follower.is_throttled(TopicPartition(topic, 0))


# ----------------------------------------------------------------- observations: the log


def _log(fn: Callable[[Log], Any]) -> Callable[..., Any]:
    def observe(broker: BrokerThread, controller: ActingController, cfg: dict[str, str]) -> Any:
        log = Log(f"/d/walk-{next(_names)}", _topic_config(broker, cfg), MemoryFileIO())
        return fn(log)
    return observe


def _append(log: Log, n: int, size: int = 100, t0: int = 0, step: int = 0) -> None:
    for i in range(n):
        ts = t0 + i * step
        log.append_as_leader(build_values([b"x" * size], base_timestamp=ts), 0, now_ms=ts)


@_log
def segments_after_20_batches(log: Log) -> int:
    _append(log, 20)
    return len(log.segments)


@_log
def segments_after_a_day_of_batches(log: Log) -> int:
    _append(log, 5, step=3_600_000)  # record timestamps drive segment.ms rolls
    return len(log.segments)


@_log
def roll_jitter_ms(log: Log) -> int:
    return log.active_segment.roll_jitter_ms


@_log
def offset_index_entries(log: Log) -> int:
    _append(log, 10)
    return len(log.active_segment.offset_index.entries())


@_log
def segments_retained(log: Log) -> int:
    _append(log, 20, size=10_000, step=1000)
    log.roll(20_000)
    log.update_high_watermark(log.log_end_offset)
    log.delete_old_segments(now_ms=10**8)
    return len(log.segments)


@_log
def recovery_point_after_3_appends(log: Log) -> int:
    _append(log, 3)
    return log.recovery_point


@_log
def flushed_by_the_flusher(log: Log) -> bool:
    _append(log, 3)
    return log.maybe_flush(now_ms=1)


@_log
def deleted_files_still_on_disk(log: Log) -> int:
    _append(log, 3, size=10_000)
    log.roll(0)
    log.update_high_watermark(log.log_end_offset)
    log.delete_old_segments(now_ms=10**10)  # retention.ms (7 days) has passed
    return sum(n.endswith(".deleted") for n in log.file_io.listdir(log.dir))


def _keyed(log: Log, key: bytes, value: bytes | None, ts: int) -> None:
    log.append_as_leader(build_batch([Record(value, key=key)], base_timestamp=ts), 0, now_ms=ts)


def _clean(log: Log, now_ms: int) -> None:
    log.roll(now_ms)
    log.update_high_watermark(log.log_end_offset)
    for _ in Cleaner(OffsetMap(1 << 20)).clean(log_to_clean(log, None, now_ms), now_ms):
        pass


@_log
def tombstones_after_two_cleans(log: Log) -> int:
    _keyed(log, b"k", b"v", 0)
    _keyed(log, b"k", None, 0)
    _clean(log, 0)  # the tombstone's batch gets its delete horizon
    _clean(log, 5_000)
    return sum(1 for b in log.batches(0) for r in decode_records(b) if r.value is None)


@_log
def first_uncleanable_offset(log: Log) -> int:
    _keyed(log, b"k", b"v", 1_000)
    log.roll(1_000)
    _keyed(log, b"k", b"w", 1_000)
    log.update_high_watermark(log.log_end_offset)
    return cleanable_offsets(log, None, 1_500)[1]


@_log
def compaction_forced(log: Log) -> bool:
    _keyed(log, b"k", b"v", 0)
    log.roll(0)
    log.update_high_watermark(log.log_end_offset)
    return cleanable_offsets(log, None, 200_000)[2]


def log_chosen_by_the_cleaner(broker: BrokerThread, controller: ActingController,
                              cfg: dict[str, str]) -> bool:
    """A log with one duplicate key in four is dirty at a ratio of 1 (never cleaned)."""
    manager = LogManager(["/d"], _topic_config(broker, {}), MemoryFileIO(),
                         topic_configs={"r": _topic_config(broker, cfg)})
    log = manager.get_or_create_log("r", 0)
    for i in range(4):
        _keyed(log, b"k%d" % (i % 3), b"v", 0)
    log.roll(0)
    log.update_high_watermark(log.log_end_offset)
    return LogCleanerManager(manager, CleanerConfig()).grab_filthiest_log(0) is not None


# ----------------------------------------------------------------- observations: the controller


def leader_after_the_isr_dies(broker: BrokerThread, controller: ActingController,
                              cfg: dict[str, str]) -> int:
    """ISR [3] of replicas [3, 2]; broker 3 dies: the topic's unclean flag decides."""
    tp = TopicPartition("u", 0)
    core = _TopicAwareCore(100, 1, unclean_leader_election_enable=broker.config.get(
        "unclean.leader.election.enable"))
    override = _unclean_override(cfg)  # how the controller reads /config/topics/<t>
    if override is not None:
        core.topic_unclean[tp.topic] = override
    core.add_partition(tp, (3, 2))
    core.live_brokers.update({3: 1, 2: 2})
    core.commit(d := core.initial_leaders(), {w.tp: w.expected_zk_version + 1 for w in d.writes})
    state = core.partition_states[tp]
    core.partition_states[tp] = type(state)(*(
        (3,) if f == "isr" else getattr(state, f) for f in state.__dataclass_fields__))
    d = core.on_broker_failure(3)
    return d.writes[0].state.leader if d.writes else core.partition_states[tp].leader


# key -> (a value other than the default, observation, base overrides for both runs)
ENFORCED: dict[str, tuple[str, Any, dict[str, str]]] = {
    "compression.type": ("gzip", stored_codec, {}),
    "compression.gzip.level": ("1", stored_batch_size, {"compression.type": "gzip"}),
    "compression.zstd.level": ("19", stored_batch_size, {"compression.type": "zstd"}),
    "message.timestamp.type": ("LogAppendTime", stored_timestamp_type, {}),
    "message.timestamp.difference.max.ms": ("60000", an_hour_old_timestamp, {}),
    "message.timestamp.before.max.ms": ("60000", an_hour_old_timestamp, {}),
    "message.timestamp.after.max.ms": ("60000", an_hour_ahead_timestamp, {}),
    "max.message.bytes": ("1000", a_2kb_batch, {}),
    "min.insync.replicas": ("2", acks_all_on_one_replica, {}),
    "segment.bytes": ("1024", segments_after_20_batches, {}),
    "segment.ms": ("3600000", segments_after_a_day_of_batches, {}),
    "segment.jitter.ms": ("100000", roll_jitter_ms, {"segment.ms": "200000"}),
    "segment.index.bytes": ("16", segments_after_20_batches, {"index.interval.bytes": "0"}),
    "index.interval.bytes": ("0", offset_index_entries, {}),
    "retention.ms": ("5000", segments_retained, {"segment.bytes": "20000"}),
    "retention.bytes": ("50000", segments_retained, {"segment.bytes": "20000",
                                                     "retention.ms": "-1"}),
    "flush.messages": ("1", recovery_point_after_3_appends, {}),
    "flush.ms": ("0", flushed_by_the_flusher, {}),
    "file.delete.delay.ms": ("0", deleted_files_still_on_disk, {"segment.bytes": "20000"}),
    "unclean.leader.election.enable": ("true", leader_after_the_isr_dies, {}),
    "cleanup.policy": ("compact", an_unkeyed_record, {}),
    "delete.retention.ms": ("1000", tombstones_after_two_cleans, {"cleanup.policy": "compact"}),
    "min.compaction.lag.ms": ("1000", first_uncleanable_offset, {"cleanup.policy": "compact"}),
    "max.compaction.lag.ms": ("100000", compaction_forced, {"cleanup.policy": "compact"}),
    "min.cleanable.dirty.ratio": ("1", log_chosen_by_the_cleaner, {"cleanup.policy": "compact"}),
    "leader.replication.throttled.replicas": ("0:1", a_lagging_follower_fetching_twice, {}),
    "follower.replication.throttled.replicas": ("*", follower_quota_applies, {}),
}
# What Kafka observes with the changed value, where it is one thing (codecs, error codes).
EXACT: dict[str, Any] = {
    "compression.type": GZIP,
    "message.timestamp.type": 1,  # LogAppendTime
    "message.timestamp.difference.max.ms": ErrorCode.INVALID_TIMESTAMP,
    "message.timestamp.before.max.ms": ErrorCode.INVALID_TIMESTAMP,
    "message.timestamp.after.max.ms": ErrorCode.INVALID_TIMESTAMP,
    "max.message.bytes": ErrorCode.MESSAGE_TOO_LARGE,
    "min.insync.replicas": ErrorCode.NOT_ENOUGH_REPLICAS,
    "unclean.leader.election.enable": 2,  # the out-of-sync replica is elected
    "cleanup.policy": ErrorCode.INVALID_RECORD,  # a compacted topic needs keys
}
# key -> a value asking for a feature tidelog does not implement
REFUSED: dict[str, str] = {
    "preallocate": "true",
    "compression.lz4.level": "17",
}




@_wire
def a_consumer_fetch(broker: BrokerThread, topic: str) -> Any:
    assert produce(broker.port, topic, 0, build_values([b"x"]), acks=1)[0] == 0
    data = fetch(broker.port, topic, 0, 0)
    return data.error_code, values_of(data.records)


def fetch_versions_served(broker: BrokerThread) -> tuple[int, int]:
    resp = send(broker.port, ApiVersionsRequest())
    return next((k.min_version, k.max_version) for k in resp.api_keys
                if k.api_key == ApiKey.FETCH)


# key -> the requests Kafka consults it for, none of which tidelog serves: every request tidelog
# answers is answered as Kafka answers it whatever the value (checked by `_assert_inert`).
INERT: dict[str, tuple[str, ...]] = {
    # Kafka: a client's Fetch v0-3 is down-converted (true) or refused UNSUPPORTED_VERSION
    # (false); v4+ never looks at it. tidelog serves Fetch v4+ only.
    "message.downconversion.enable": ("true", "false"),
}


def _assert_inert(broker: BrokerThread, controller: ActingController, key: str,
                  values: tuple[str, ...]) -> None:
    assert fetch_versions_served(broker)[0] >= 4
    default = a_consumer_fetch(broker, controller, {})
    assert default == (0, [b"x"])
    for value in values:
        assert a_consumer_fetch(broker, controller, {key: value}) == default


def _reported_topic_keys(broker: BrokerThread, controller: ActingController) -> list[str]:
    controller.create_topic("walk-keys", {0: [1]})
    req = m_dc.DescribeConfigsRequest(resources=[m_dc.DescribeConfigsResource(2, "walk-keys", None)])
    [result] = send(broker.port, req).results
    assert result.error_code == 0
    return sorted(c.name for c in result.configs)


def test_every_reported_key_is_enforced_or_refused(one_broker: BrokerThread,
                                                   controller: ActingController) -> None:
    keys = _reported_topic_keys(one_broker, controller)
    assert keys == sorted(ENFORCED.keys() | REFUSED.keys() | INERT.keys())
    assert not ENFORCED.keys() & REFUSED.keys()
    for key in keys:
        if key in INERT:
            _assert_inert(one_broker, controller, key, INERT[key])
            continue
        if key in REFUSED:
            _assert_refused(one_broker, controller, key, REFUSED[key])
            continue
        value, observe, base = ENFORCED[key]
        default = observe(one_broker, controller, dict(base))
        changed = observe(one_broker, controller, {**base, key: value})
        assert changed != default, f"{key}={value} changed nothing: {default!r} both times"
        if key in EXACT:
            assert changed == EXACT[key], (key, changed)


def _assert_refused(broker: BrokerThread, controller: ActingController, key: str,
                    value: str) -> None:
    topic = f"walk{next(_names)}"
    resp = send(broker.port, m_ct.CreateTopicsRequest(timeout_ms=0, topics=[
        m_ct.CreatableTopic(topic, 1, 1, configs=[m_ct.CreatableTopicConfig(key, value)])]))
    [res] = resp.topics
    assert res.error_code == ErrorCode.INVALID_CONFIG, (key, res)
    assert key in (res.error_message or ""), res.error_message
    assert controller.zk.get_topic_assignment(topic) is None  # nothing applied


# ----------------------------------------------------------------- broker keys


def test_every_broker_key_is_read_or_documented_as_unused() -> None:
    """A key of server.properties is read somewhere in tidelog, or its doc (shown by
    `tidelog server --help` and DescribeConfigs) says it is accepted and unused."""
    import re
    from pathlib import Path

    import tidelog
    from tidelog.broker.config import CONFIG_DEFS

    root = Path(tidelog.__file__).parent
    config_py = root / "broker" / "config.py"
    sources = "\n".join(p.read_text() for p in root.rglob("*.py") if p != config_py)
    own = config_py.read_text()
    silent = []
    for key, spec in CONFIG_DEFS.items():
        read_elsewhere = f'"{key}"' in sources
        read_in_config = len(re.findall(re.escape(f'"{key}"'), own)) > 1  # beyond define()
        if not (read_elsewhere or read_in_config or spec.doc.startswith("accepted, unused")):
            silent.append(key)
    assert silent == []


def test_broker_describe_configs_documents_unused_keys(one_broker: BrokerThread) -> None:
    req = m_dc.DescribeConfigsRequest(resources=[m_dc.DescribeConfigsResource(
        4, "1", ["queued.max.requests", "num.partitions"])])
    [result] = send(one_broker.port, req, 3).results
    docs = {c.name: c.documentation for c in result.configs}
    assert docs["queued.max.requests"].startswith("accepted, unused by tidelog: ")
    assert docs["num.partitions"] is None


def test_fetch_max_bytes_caps_a_fetch_response(module_zk: str,
                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    from harness import broker_props, fetch_request

    b = BrokerThread(broker_props(2, module_zk, tmp_path_factory.mktemp("b2"),
                                  **{"fetch.max.bytes": "1024"})).start()
    ctl = ActingController(module_zk, [b])
    try:
        ctl.create_topic("capped", {0: [2]})
        for _ in range(4):
            assert produce(b.port, "capped", 0, build_values([b"x" * 600]), acks=1)[0] == 0
        resp = send(b.port, fetch_request("capped", 0, 0, max_bytes=1 << 20))
        got = list(iter_batches(resp.responses[0].partitions[0].records))
        assert len(got) == 1  # 1024 bytes hold one 600-byte batch (the first always comes)
    finally:
        ctl.close()
        b.stop()
