"""Topic-level log configuration: Kafka's keys, defaults and validation.

Every key is applied as Kafka applies it, except the settings of features tidelog does not
implement (`UNSUPPORTED`): for those only the value that describes what tidelog does is
accepted; any other is refused (INVALID_CONFIG, the message naming the key and why) rather than
accepted and ignored:

- ``preallocate``: ``false`` (segment files are not preallocated);
- ``compression.lz4.level``: ``9`` (the fast compressor Kafka uses at 9; cramjam's block API
  offers no high-compression mode);

``leader.replication.throttled.replicas`` / ``follower.replication.throttled.replicas`` take
Kafka's values ('*' or `partition:broker` pairs, ThrottledReplicaListValidator) and are enforced
by the brokers' replication quotas (`tidelog.replication.replication_quota`).

``message.downconversion.enable`` takes both values, true by default, as Kafka: Kafka consults it
only for a client's Fetch v0-3 (whose record format is older than the v2 batches on disk: false
answers UNSUPPORTED_VERSION, true down-converts). tidelog serves Fetch v4+ only (ApiVersions),
for which Kafka never down-converts nor looks at the key, so every fetch tidelog answers is
answered as Kafka answers it with either value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


class UnknownConfigError(ValueError):
    """A key that is not a topic config (Kafka: InvalidConfigurationException)."""


class UnsupportedConfigError(ValueError):
    """A value asking for a feature tidelog does not implement (see `UNSUPPORTED`)."""

_CLEANUP_POLICIES = {"delete", "compact"}

# Kafka key -> why only the default value is accepted (see the module docstring).
UNSUPPORTED: dict[str, str] = {
    "preallocate": "segment files are not preallocated",
    "compression.lz4.level": "lz4 batches are written with LZ4's fast compressor, Kafka's level 9",
}
_COMPRESSION_TYPES = {"uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"}
_TIMESTAMP_TYPES = {"CreateTime", "LogAppendTime"}


_THROTTLED_FORMAT = ("must be the literal '*' or a list of replicas in the following format: "
                     "[partitionId]:[brokerId],[partitionId]:[brokerId],...")


def validate_throttled_replicas(key: str, value: Any) -> str:
    """Kafka's ThrottledReplicaListValidator: '*', '' or `partition:broker` pairs; the value
    as stored, ValueError otherwise."""
    if isinstance(value, list | tuple):
        value = ",".join(str(v) for v in value)
    value = str(value)
    items = [s.strip() for s in value.split(",")]
    ok = value.strip() == "*" or all(
        not s or (len(s.split(":")) == 2 and all(x.isdigit() for x in s.split(":")))
        for s in items)
    if not ok:
        raise ValueError(f"Invalid value {value} for configuration {key}: {key} "
                         f"{_THROTTLED_FORMAT}")
    return value


def _parse_int(key: str, value: Any, minimum: int, maximum: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"invalid value {value!r} for configuration {key}: not an integer")
    try:
        number = int(value.strip()) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"invalid value {value!r} for configuration {key}: not an integer"
        ) from None
    if isinstance(value, float) and value != number:
        raise ValueError(f"invalid value {value!r} for configuration {key}: not an integer")
    if not minimum <= number <= maximum:
        raise ValueError(
            f"invalid value {value!r} for configuration {key}: must be in [{minimum}, {maximum}]"
        )
    return number


def _parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"invalid value {value!r} for configuration {key}: expected true or false")


def _parse_float(key: str, value: Any, minimum: float, maximum: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"invalid value {value!r} for configuration {key}: not a number") from None
    if not minimum <= number <= maximum:
        raise ValueError(
            f"invalid value {value!r} for configuration {key}: must be in [{minimum}, {maximum}]"
        )
    return number


def _parse_choice(key: str, value: Any, choices: set[str]) -> str:
    if not isinstance(value, str) or value.strip() not in choices:
        raise ValueError(
            f"invalid value {value!r} for configuration {key}: must be one of {sorted(choices)}"
        )
    return value.strip()


def _parse_policy(key: str, value: Any) -> str:
    items = [v.strip() for v in str(value).split(",") if v.strip()] if isinstance(value, str) else []
    if not items or any(item not in _CLEANUP_POLICIES for item in items):
        raise ValueError(
            f"invalid value {value!r} for configuration {key}: "
            f"must be a list of {sorted(_CLEANUP_POLICIES)}"
        )
    return ",".join(items)


def _parse_str(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"invalid value {value!r} for configuration {key}: expected a string")
    return value


def _parse_gzip_level(key: str, value: Any) -> int:
    """Kafka's GzipCompression.LevelValidator: -1 (the default) or 1-9."""
    level = _parse_int(key, value, -1, 9)
    if level == 0:
        raise ValueError(f"invalid value {value!r} for configuration {key}: "
                         "must be -1 or in [1, 9]")
    return level


def _int(minimum: int, maximum: int = LONG_MAX) -> Callable[[str, Any], int]:
    return lambda key, value: _parse_int(key, value, minimum, maximum)


# Kafka key -> (dataclass field, parser). Ranges are Kafka's (TopicConfig / LogConfig).
_PARSERS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "segment.bytes": ("segment_bytes", _int(14, INT_MAX)),
    "segment.ms": ("segment_ms", _int(1)),
    "segment.jitter.ms": ("segment_jitter_ms", _int(0)),
    "segment.index.bytes": ("segment_index_bytes", _int(8, INT_MAX)),
    "index.interval.bytes": ("index_interval_bytes", _int(0, INT_MAX)),
    "retention.ms": ("retention_ms", _int(-1)),
    "retention.bytes": ("retention_bytes", _int(-1)),
    "flush.messages": ("flush_messages", _int(1)),
    "flush.ms": ("flush_ms", _int(0)),
    "max.message.bytes": ("max_message_bytes", _int(0, INT_MAX)),
    "file.delete.delay.ms": ("file_delete_delay_ms", _int(0)),
    "min.insync.replicas": ("min_insync_replicas", _int(1, INT_MAX)),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", _parse_bool),
    "cleanup.policy": ("cleanup_policy", _parse_policy),
    "compression.type": (
        "compression_type",
        lambda k, v: _parse_choice(k, v, _COMPRESSION_TYPES),
    ),
    "message.timestamp.type": (
        "message_timestamp_type",
        lambda k, v: _parse_choice(k, v, _TIMESTAMP_TYPES),
    ),
    "message.timestamp.difference.max.ms": ("message_timestamp_difference_max_ms", _int(0)),
    "compression.gzip.level": ("compression_gzip_level", lambda k, v: _parse_gzip_level(k, v)),
    "compression.lz4.level": ("compression_lz4_level", _int(1, 17)),
    "compression.zstd.level": ("compression_zstd_level", _int(-131072, 22)),
    "message.timestamp.before.max.ms": ("message_timestamp_before_max_ms", _int(0)),
    "message.timestamp.after.max.ms": ("message_timestamp_after_max_ms", _int(0)),
    "delete.retention.ms": ("delete_retention_ms", _int(0)),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", _int(0)),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", _int(1)),
    "min.cleanable.dirty.ratio": (
        "min_cleanable_dirty_ratio",
        lambda k, v: _parse_float(k, v, 0.0, 1.0),
    ),
    "preallocate": ("preallocate", _parse_bool),
    "message.downconversion.enable": ("message_downconversion_enable", _parse_bool),
    "leader.replication.throttled.replicas": ("leader_replication_throttled_replicas",
                                              validate_throttled_replicas),
    "follower.replication.throttled.replicas": ("follower_replication_throttled_replicas",
                                                validate_throttled_replicas),
}


@dataclass(frozen=True, slots=True)
class LogConfig:
    """One partition log's configuration. Field names are Kafka's keys in snake_case."""

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 60 * 60 * 1000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * 24 * 60 * 60 * 1000
    retention_bytes: int = -1
    flush_messages: int = LONG_MAX  # never: the OS flushes
    flush_ms: int = LONG_MAX
    max_message_bytes: int = 1024 * 1024 + 12  # 1048588, Kafka's default
    file_delete_delay_ms: int = 60_000
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    cleanup_policy: str = "delete"
    compression_type: str = "producer"
    # KIP-390: the level the leader recompresses with when compression.type names the codec.
    compression_gzip_level: int = -1  # zlib's default
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    message_timestamp_type: str = "CreateTime"
    message_timestamp_difference_max_ms: int = LONG_MAX
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = LONG_MAX
    delete_retention_ms: int = 24 * 60 * 60 * 1000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    min_cleanable_dirty_ratio: float = 0.5
    preallocate: bool = False
    # Consulted by Kafka for Fetch v0-3 only, which tidelog does not serve (module docstring).
    message_downconversion_enable: bool = True
    leader_replication_throttled_replicas: str = ""
    follower_replication_throttled_replicas: str = ""

    @property
    def timestamp_bounds_ms(self) -> tuple[int, int]:
        """How far before and after the broker's clock a CreateTime record may be (KIP-937, as
        Kafka 3.9's LogConfig: a bound left at its default falls back to the deprecated
        message.timestamp.difference.max.ms)."""
        before, after = self.message_timestamp_before_max_ms, self.message_timestamp_after_max_ms
        diff = self.message_timestamp_difference_max_ms
        return (before if before != LONG_MAX else diff, after if after != LONG_MAX else diff)

    @classmethod
    def from_dict(cls, props: Mapping[str, Any], base: LogConfig | None = None) -> LogConfig:
        """Build from Kafka keys (`{"segment.bytes": "1048576"}`), over `base` or the defaults.
        An unknown key or a bad value raises ValueError naming the key."""
        changes: dict[str, Any] = {}
        for key, value in props.items():
            entry = _PARSERS.get(key)
            if entry is None:
                raise UnknownConfigError(f"unknown configuration {key}")
            field_name, parse = entry
            parsed = parse(key, value)
            if key in UNSUPPORTED and parsed != getattr(_DEFAULTS, field_name):
                raise UnsupportedConfigError(f"invalid value {value!r} for configuration {key}: "
                                 f"{UNSUPPORTED[key]}; only "
                                 f"{_format(getattr(_DEFAULTS, field_name))!r} is accepted")
            changes[field_name] = parsed
        return replace(base or cls(), **changes)

    def to_dict(self) -> dict[str, Any]:
        """Kafka key -> value, for DescribeConfigs and tools."""
        return {key: getattr(self, name) for key, (name, _) in _PARSERS.items()}

    @staticmethod
    def keys() -> list[str]:
        return list(_PARSERS)



_DEFAULTS = LogConfig()


def _format(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


# Every dataclass field has a Kafka key (keeps from_dict/to_dict complete).
assert {f.name for f in fields(LogConfig)} == {name for name, _ in _PARSERS.values()}
