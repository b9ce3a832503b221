"""Replication settings (Kafka's broker/topic keys) and the switches for the naive rules.

``ReplicationConfig.from_properties({"replica.lag.time.max.ms": "5000", ...})`` reads Kafka's keys;
unknown keys are ignored, bad values raise ``ValueError`` with a one-line message.
Topic-level keys (``min.insync.replicas``, ...) are not here: a partition reads them from its
log's ``LogConfig`` (the topic's overrides over the broker's defaults, as Kafka's LogConfig).

The three "naive rule" switches exist so the simulator can show each historic bug:
``truncate_to_hw`` (pre-KIP-101 follower truncation), ``fence_leader_epochs=False`` (pre-KIP-320:
fetches and OffsetsForLeaderEpoch are not checked against the current leader epoch) and
``maximal_isr=False`` (the HW is computed over the committed ISR only, ignoring a pending expand).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from tidelog.replication.replication_quota import ReplicationQuotaManager

_KEYS: dict[str, str] = {
    "replica.lag.time.max.ms": "replica_lag_time_max_ms",
    "replica.lag.max.messages": "replica_lag_max_messages",
    "unclean.leader.election.enable": "unclean_leader_election_enable",
    "replica.fetch.backoff.ms": "replica_fetch_backoff_ms",
    "replica.fetch.max.bytes": "replica_fetch_max_bytes",
    "replica.fetch.response.max.bytes": "replica_fetch_response_max_bytes",
    "replica.fetch.wait.max.ms": "replica_fetch_wait_max_ms",
    "replica.fetch.min.bytes": "replica_fetch_min_bytes",
    "replica.socket.timeout.ms": "replica_socket_timeout_ms",
}


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    replica_lag_time_max_ms: int = 10_000
    # None: the time rule only (Kafka >= 0.9). An int: also the pre-0.9 message-count rule (seed 003).
    replica_lag_max_messages: int | None = None
    unclean_leader_election_enable: bool = False
    replica_fetch_backoff_ms: int = 1_000
    replica_fetch_max_bytes: int = 1_048_576
    replica_fetch_response_max_bytes: int = 10_485_760
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_min_bytes: int = 1
    # a fetcher request with no answer after this long counts as failed (lost request/response)
    replica_socket_timeout_ms: int = 30_000
    # KIP-966: the HW does not advance while the ISR is smaller than min.insync.replicas.
    # (min.insync.replicas itself is a topic config: each partition reads its log's LogConfig.)
    hw_requires_min_isr: bool = True
    # DESIGN's MonotonicHighWatermark for consumers: a new leader answers consumer fetches with
    # OFFSET_NOT_AVAILABLE until its HW reaches its epoch's start offset (KIP-207's rule, which
    # Kafka applies to ListOffsets only; False = Kafka's Fetch, where the HW may go back).
    consumer_hw_guard: bool = True
    # Kafka's isTruncationOnFetchSupported (IBP >= 2.7, KIP-595): followers send their last
    # fetched epoch and truncate on the leader's diverging epoch instead of asking
    # OffsetsForLeaderEpoch first. False: a leader before 2.7 (the KIP-279 exchange).
    truncation_on_fetch: bool = True
    # naive-rule switches (see the module docstring)
    truncate_to_hw: bool = False
    fence_leader_epochs: bool = True
    maximal_isr: bool = True
    # The broker's replication throttles (replication_quota.py, Kafka's ReplicationQuotaManager):
    # the leader's reads for followers use the first, its replica fetchers the second; shared
    # objects the broker updates as the rates and throttled replicas change. None: unthrottled.
    leader_quota: ReplicationQuotaManager | None = field(default=None, compare=False, repr=False)
    follower_quota: ReplicationQuotaManager | None = field(default=None, compare=False,
                                                           repr=False)
    # Fetch reads of at least this many bytes are FileSlices the broker sends with sendfile
    # (Log.read_slice); None: always bytes (the simulator, whose disk has no descriptors).
    zero_copy_min_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.replica_lag_time_max_ms <= 0:
            raise ValueError("replica.lag.time.max.ms must be > 0")
        if self.replica_lag_max_messages is not None and self.replica_lag_max_messages < 0:
            raise ValueError("replica.lag.max.messages must be >= 0")
        if self.replica_fetch_backoff_ms < 0 or self.replica_fetch_wait_max_ms < 0:
            raise ValueError("replica.fetch.backoff.ms and replica.fetch.wait.max.ms must be >= 0")
        if self.replica_socket_timeout_ms <= 0:
            raise ValueError("replica.socket.timeout.ms must be > 0")
        if self.replica_fetch_max_bytes <= 0 or self.replica_fetch_response_max_bytes <= 0:
            raise ValueError("replica.fetch.max.bytes and replica.fetch.response.max.bytes must be > 0")

    @classmethod
    def from_properties(cls, props: Mapping[str, object], **overrides: object) -> ReplicationConfig:
        kwargs: dict[str, object] = {}
        types = {f.name: f.type for f in fields(cls)}
        for key, attr in _KEYS.items():
            if key not in props:
                continue
            raw = props[key]
            try:
                if "bool" in str(types[attr]):
                    value: object = raw if isinstance(raw, bool) else str(raw).strip().lower() == "true"
                else:
                    value = int(str(raw))
            except ValueError:
                raise ValueError(f"{key}: not an integer: {raw!r}") from None
            kwargs[attr] = value
        kwargs.update(overrides)
        return cls(**kwargs)  # type: ignore[arg-type]

    def with_(self, **changes: object) -> ReplicationConfig:
        return replace(self, **changes)  # type: ignore[arg-type]
