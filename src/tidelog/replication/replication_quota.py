"""Replication throttles: Kafka's `ReplicationQuotaManager`, pure (the time is an argument).

A broker has two: the leader quota bounds the bytes it serves to followers' fetches of
throttled partitions (`leader.replication.throttled.rate`), the follower quota the bytes its
fetchers fetch of throttled partitions (`follower.replication.throttled.rate`), both in bytes
per second, per broker (dynamic, `/config/brokers/<id>` or `<default>`). A partition is
throttled on a broker when its topic's `leader.replication.throttled.replicas` /
`follower.replication.throttled.replicas` lists `<partition>:<this broker>` or is `*`.

Only replicas out of the ISR are held back (Kafka's shouldLeaderThrottle /
shouldFollowerThrottle): a replica that is moving to a new broker catches up at the bounded
rate while the in-sync followers, and so the producers' acks=all, are never slowed down. When
the measured rate is above the bound, the leader answers a throttled partition with no records
and the follower leaves it out of its fetch; every byte of a throttled partition is recorded.

The rate is Kafka's `Rate` over a `SampledStat` (kafka-clients 3.9.1) of
`replication.quota.window.num` (11) samples of `replication.quota.window.size.seconds` (1 s),
broker configs read at start: the bytes of the samples kept, over the time since the oldest
one began, counted as at least the full windows but the current one. More windows remember a
burst longer and dilute it more; longer windows do both too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tidelog.replication.types import TopicPartition
from tidelog.storage.log_config import validate_throttled_replicas

QUOTA_BYTES_PER_SECOND_DEFAULT = 2**63 - 1  # Long.MAX_VALUE: unthrottled
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
# Bounds the copy of replicas between this broker's log dirs (every byte copied counts).
ALTER_LOG_DIRS_RATE = "replica.alter.log.dirs.io.max.bytes.per.second"
BROKER_RATES = (LEADER_RATE, FOLLOWER_RATE, ALTER_LOG_DIRS_RATE)
LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
ALL_REPLICAS = "*"


def throttled_partitions(value: str, broker_id: int) -> set[int] | None:
    """The partitions `value` throttles on `broker_id` (Kafka's parseThrottledPartitions);
    None for every partition ('*')."""
    value = value.strip()
    if value == ALL_REPLICAS:
        return None
    out: set[int] = set()
    for item in value.split(","):
        p, _, b = item.strip().partition(":")
        if b and int(b) == broker_id:
            out.add(int(p))
    return out


def parse_rate(key: str, value: str | None) -> int:
    """A throttled rate as Kafka's DynamicConfig (LONG, at least 0); absent: unthrottled."""
    if value is None:
        return QUOTA_BYTES_PER_SECOND_DEFAULT
    try:
        rate = int(str(value).strip())
    except ValueError:
        raise ValueError(f"Invalid value {value} for configuration {key}: "
                         "Not a number of type LONG") from None
    if not 0 <= rate <= QUOTA_BYTES_PER_SECOND_DEFAULT:
        raise ValueError(f"Invalid value {value} for configuration {key}: "
                         "Value must be at least 0")
    return rate


class _Sample:
    """One window of Kafka's SampledStat.Sample (a WindowedSum's value)."""

    __slots__ = ("last_event_ms", "start_ms", "value")

    def __init__(self, now_ms: int) -> None:
        self.reset(now_ms)

    def reset(self, now_ms: int) -> None:
        self.start_ms = now_ms
        self.last_event_ms = now_ms
        self.value = 0


class ReplicationQuotaManager:
    def __init__(self, num_windows: int = 11, window_size_ms: int = 1000,
                 bound: int = QUOTA_BYTES_PER_SECOND_DEFAULT) -> None:
        if num_windows < 1 or window_size_ms < 1:
            raise ValueError("a quota needs at least one window of at least 1 ms")
        self.num_windows = num_windows
        self.window_size_ms = window_size_ms
        self.bound = bound
        # Kafka keeps one sample more than the windows, reused in a ring (SampledStat.advance).
        self._samples: list[_Sample] = []
        self._current = 0
        self.last_now_ms = 0  # the time of the last measure or record
        # topic -> throttled partitions (None: all of them)
        self._throttled: dict[str, set[int] | None] = {}

    # -- which partitions -------------------------------------------------------------------
    def mark_throttled(self, topic: str, partitions: Iterable[int] | None) -> None:
        self._throttled[topic] = None if partitions is None else set(partitions)

    def remove_throttle(self, topic: str) -> None:
        self._throttled.pop(topic, None)

    def update_topic(self, topic: str, config: Mapping[str, str], key: str,
                     broker_id: int) -> None:
        """The topic's overrides changed: its throttled partitions on this broker from `key`."""
        try:
            parts = throttled_partitions(
                validate_throttled_replicas(key, str(config.get(key, ""))), broker_id)
        except ValueError:
            parts = set()  # refused when written; an unreadable value throttles nothing
        if parts is None or parts:
            self.mark_throttled(topic, parts)
        else:
            self.remove_throttle(topic)

    @property
    def throttles_any(self) -> bool:
        """Some partition is throttled (a replica fetcher then looks at every partition)."""
        return bool(self._throttled)

    def is_throttled(self, tp: TopicPartition) -> bool:
        if tp.topic not in self._throttled:
            return False
        parts = self._throttled[tp.topic]
        return parts is None or tp.partition in parts

    # -- how fast --------------------------------------------------------------------------
    def update_quota(self, bound: int) -> None:
        self.bound = bound

    def record(self, nbytes: int, now_ms: int) -> None:
        """Kafka's SampledStat.record: into the current sample, or the next one once the
        current has lasted a window."""
        self.last_now_ms = max(self.last_now_ms, now_ms)
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        sample = self._samples[self._current]
        if now_ms - sample.start_ms >= self.window_size_ms:
            self._current = (self._current + 1) % (self.num_windows + 1)
            if self._current >= len(self._samples):
                self._samples.append(_Sample(now_ms))
            else:
                self._samples[self._current].reset(now_ms)
            sample = self._samples[self._current]
        sample.value += nbytes
        sample.last_event_ms = now_ms

    def rate(self, now_ms: int) -> float:
        """Bytes per second (Kafka's Rate.measure and Rate.windowSize)."""
        self.last_now_ms = max(self.last_now_ms, now_ms)
        self._purge(now_ms)
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        total = sum(s.value for s in self._samples)
        elapsed = now_ms - min(s.start_ms for s in self._samples)
        full = elapsed // self.window_size_ms
        if full < self.num_windows - 1:
            elapsed += (self.num_windows - 1 - full) * self.window_size_ms
        return total * 1000.0 / max(elapsed, 1)

    def is_quota_exceeded(self, now_ms: int) -> bool:
        return self.bound < QUOTA_BYTES_PER_SECOND_DEFAULT and self.rate(now_ms) > self.bound

    def _purge(self, now_ms: int) -> None:
        """Kafka's purgeObsoleteSamples: a sample with no event in the last `num_windows`
        windows starts over, empty, now."""
        expire_age = self.num_windows * self.window_size_ms
        for sample in self._samples:
            if now_ms - sample.last_event_ms >= expire_age:
                sample.reset(now_ms)


def should_throttle(quota: ReplicationQuotaManager | None, tp: TopicPartition, in_sync: bool,
                    now_ms: int | None) -> bool:
    """Kafka's shouldLeaderThrottle / shouldFollowerThrottle; `now_ms` None: as of the quota's
    last measure (a check that has no clock, as a held fetch's; the rate only falls with time,
    so it errs on holding the replica back)."""
    if quota is None or in_sync or not quota.is_throttled(tp):
        return False
    return quota.is_quota_exceeded(quota.last_now_ms if now_ms is None else now_ms)


class ReplicationQuotas:
    """A broker's three quotas (Kafka's QuotaManagers leader, follower and alterLogDirs), kept
    up to date from its dynamic broker configs and its topics' overrides (Kafka's
    BrokerConfigHandler / TopicConfigHandler for the throttle keys)."""

    def __init__(self, broker_id: int, num_windows: int = 11, window_size_ms: int = 1000,
                 alter_log_dirs_num_windows: int = 11,
                 alter_log_dirs_window_size_ms: int = 1000) -> None:
        """`num_windows`, `window_size_ms`: `replication.quota.window.num` and
        `replication.quota.window.size.seconds` (in ms); the `alter_log_dirs_` ones:
        `alter.log.dirs.replication.quota.window.num` / `.window.size.seconds`; static as in
        Kafka."""
        self.broker_id = broker_id
        self.leader = ReplicationQuotaManager(num_windows, window_size_ms)
        self.follower = ReplicationQuotaManager(num_windows, window_size_ms)
        self.alter_log_dirs = ReplicationQuotaManager(alter_log_dirs_num_windows,
                                                      alter_log_dirs_window_size_ms)

    def update_rates(self, cluster_default: Mapping[str, str],
                     per_broker: Mapping[str, str]) -> None:
        """A per-broker value, else the cluster-wide default, else unthrottled."""
        for quota, key in zip((self.leader, self.follower, self.alter_log_dirs), BROKER_RATES,
                              strict=True):
            value = per_broker.get(key, cluster_default.get(key))
            try:
                quota.update_quota(parse_rate(key, value))
            except ValueError:
                quota.update_quota(QUOTA_BYTES_PER_SECOND_DEFAULT)  # refused when written

    def update_topic(self, topic: str, overrides: Mapping[str, str]) -> None:
        self.leader.update_topic(topic, overrides, LEADER_REPLICAS, self.broker_id)
        self.follower.update_topic(topic, overrides, FOLLOWER_REPLICAS, self.broker_id)
