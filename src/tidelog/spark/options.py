"""The connector's options, parsed and validated at planning time, as Spark's Kafka source does.

The names and the semantics are Spark's (``KafkaSourceProvider``), so that moving a job between
``format("kafka")`` and ``format("tidelog")`` changes only the format name. Option names are
case-insensitive (Spark hands data sources a case-insensitive map). Every error is a
:class:`TidelogOptionError` whose message names the option.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from tidelog.client.metadata import TopicPartition
from tidelog.spark.offsets import EARLIEST, LATEST, parse_partition_offsets

__all__ = [
    "OffsetLimit",
    "SinkOptions",
    "SourceOptions",
    "Subscription",
    "TidelogOptionError",
    "parse_sink_options",
    "parse_source_options",
]

BOOTSTRAP = "kafka.bootstrap.servers"
STRATEGY_KEYS = ("subscribe", "subscribePattern", "assign")

# Consumer settings Spark's source rejects too (the source manages offsets and bytes itself).
_REJECTED_KAFKA = {
    "kafka.auto.offset.reset": "set the source option 'startingOffsets' to 'earliest' or "
    "'latest' instead; the query manages its own offsets",
    "kafka.key.deserializer": "keys are read as binary; deserialize them with DataFrame operations",
    "kafka.value.deserializer": "values are read as binary; deserialize them with DataFrame "
    "operations",
    "kafka.enable.auto.commit": "the query commits offsets to its checkpoint, not to Kafka",
    "kafka.interceptor.classes": "interceptors could modify the records",
    "kafka.key.serializer": "keys are written as binary or string",
    "kafka.value.serializer": "values are written as binary or string",
}


class TidelogOptionError(ValueError):
    """A missing, malformed or contradictory connector option (the message names it)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"option '{option}': {message}")
        self.option = option


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which topic-partitions a source reads: exactly one of Spark's three strategies."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    partitions: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        """Whether a topic belongs to the subscription (assign: only its listed topics)."""
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            assert self.pattern is not None
            return re.fullmatch(self.pattern, topic) is not None
        return any(tp.topic == topic for tp in self.partitions)


@dataclass(frozen=True, slots=True)
class OffsetLimit:
    """startingOffsets / endingOffsets: ``earliest``, ``latest`` or per-partition offsets
    (``specific``; -2 = earliest and -1 = latest inside the JSON, as in Spark)."""

    kind: Literal["earliest", "latest", "specific", "timestamp"]
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    # kind "timestamp": one timestamp (ms) for every partition, or ``offsets`` holds one per
    # partition (startingOffsetsByTimestamp); resolved with ListOffsets by timestamp.
    timestamp: int | None = None
    option: str = ""  # the option it came from, for errors


@dataclass(frozen=True, slots=True)
class SourceOptions:
    bootstrap_servers: str
    subscription: Subscription
    starting_offsets: OffsetLimit
    ending_offsets: OffsetLimit | None  # batch only
    # startingOffsetsByTimestampStrategy: no record at/after the timestamp -> "error" / "latest"
    timestamp_no_match: Literal["error", "latest"] = "error"
    fail_on_data_loss: bool = True
    include_headers: bool = False
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    min_partitions: int | None = None
    fetch_offset_num_retries: int = 3
    fetch_offset_retry_interval_ms: int = 10
    poll_timeout_ms: int = 120_000
    fetch_max_bytes: int = 4 * 1024 * 1024
    client_id: str = "tidelog-spark"
    read_committed: bool = False  # kafka.isolation.level=read_committed: up to the LSO


@dataclass(frozen=True, slots=True)
class SinkOptions:
    bootstrap_servers: str
    topic: str | None  # overrides the 'topic' column, as in Spark
    compression: str = "none"
    linger_ms: int = 5
    batch_size: int = 1024 * 1024
    client_id: str = "tidelog-spark-sink"
    allow_auto_create_topics: bool = True  # Kafka's producer default


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _bootstrap(opts: dict[str, str]) -> str:
    servers = opts.get(BOOTSTRAP.lower(), "").strip()
    if not servers:
        raise TidelogOptionError(BOOTSTRAP, "must be specified (host:port[,host:port...])")
    for server in servers.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise TidelogOptionError(BOOTSTRAP, f"'{server.strip()}' is not host:port")
    return servers


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise TidelogOptionError(name, f"expected true or false, got '{raw}'")
    return value == "true"


def _positive_int(opts: dict[str, str], name: str) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise TidelogOptionError(name, f"expected a positive integer, got '{raw}'") from None
    if value <= 0:
        raise TidelogOptionError(name, f"must be positive, got {value}")
    return value


_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(opts: dict[str, str], name: str, default_ms: int) -> int:
    raw = opts.get(name.lower())
    if raw is None:
        return default_ms
    match = _DURATION.match(raw)
    if match is None:
        raise TidelogOptionError(
            name, f"expected a duration such as 500ms, 30s or 15m, got '{raw}'"
        )
    unit = (match.group(2) or "ms").lower()
    return int(match.group(1)) * _UNIT_MS[unit]


def _subscription(opts: dict[str, str]) -> Subscription:
    given = [key for key in STRATEGY_KEYS if key.lower() in opts]
    if not given:
        raise TidelogOptionError(
            "subscribe", "one of the options subscribe, subscribePattern, assign must be specified"
        )
    if len(given) > 1:
        raise TidelogOptionError(
            given[1],
            "only one of the options subscribe, subscribePattern, assign can be specified "
            f"(got {', '.join(given)})",
        )
    kind = given[0]
    value = opts[kind.lower()]
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise TidelogOptionError(kind, f"no topics to subscribe to in '{value}'")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribePattern":
        pattern = value.strip()
        if not pattern:
            raise TidelogOptionError(kind, "the pattern is empty")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise TidelogOptionError(kind, f"invalid regular expression: {exc}") from None
        return Subscription("subscribePattern", pattern=pattern)
    return Subscription("assign", partitions=_assign(value))


def _assign(value: str) -> tuple[TopicPartition, ...]:
    if not value.strip().startswith("{"):
        raise TidelogOptionError(
            "assign", f'expected JSON such as {{"topicA":[0,1]}}, got {value!r}'
        )
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise TidelogOptionError("assign", f"invalid JSON: {exc.msg}") from None
    partitions: list[TopicPartition] = []
    if not isinstance(parsed, dict):
        raise TidelogOptionError("assign", 'expected JSON such as {"topicA":[0,1]}')
    for topic, parts in parsed.items():
        if not isinstance(parts, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts
        ):
            raise TidelogOptionError(
                "assign", f"topic '{topic}' needs a list of partition numbers, got {parts!r}"
            )
        partitions.extend(TopicPartition(topic, p) for p in parts)
    if not partitions:
        raise TidelogOptionError("assign", "no topic-partitions to assign")
    return tuple(dict.fromkeys(partitions))


def _range_limit(opts: dict[str, str], which: str, default: str) -> OffsetLimit:
    """Spark's order of preference: ``<which>Timestamp`` (one timestamp for all partitions),
    then ``<which>OffsetsByTimestamp`` (JSON of timestamps), then ``<which>Offsets``."""
    global_name = f"{which}Timestamp"
    raw = opts.get(global_name.lower())
    if raw is not None:
        try:
            ts = int(raw.strip())
        except ValueError:
            raise TidelogOptionError(
                global_name, f"expected a single long value, got '{raw}'"
            ) from None
        if ts < 0:
            raise TidelogOptionError(global_name, f"must be >= 0 (ms since the epoch), got {ts}")
        return OffsetLimit("timestamp", timestamp=ts, option=global_name)
    by_name = f"{which}OffsetsByTimestamp"
    raw = opts.get(by_name.lower())
    if raw is not None:
        try:
            timestamps = parse_partition_offsets(raw)
        except ValueError as exc:
            raise TidelogOptionError(
                by_name, f'expected JSON such as {{"topic":{{"0":1700000000000}}}}: {exc}'
            ) from None
        for tp, ts in timestamps.items():
            if ts < 0:
                raise TidelogOptionError(by_name, f"timestamp {ts} for {tp} must be >= 0")
        return OffsetLimit("timestamp", timestamps, option=by_name)
    return _offset_limit(opts, f"{which}Offsets", default)


def _offset_limit(opts: dict[str, str], name: str, default: str) -> OffsetLimit:
    raw = opts.get(name.lower(), default).strip()
    if raw.lower() == "earliest":
        return OffsetLimit("earliest", option=name)
    if raw.lower() == "latest":
        return OffsetLimit("latest", option=name)
    try:
        offsets = parse_partition_offsets(raw)
    except ValueError as exc:
        raise TidelogOptionError(
            name, f'expected earliest, latest or JSON such as {{"topic":{{"0":23}}}}: {exc}'
        ) from None
    for tp, off in offsets.items():
        if off < EARLIEST:
            raise TidelogOptionError(
                name, f"offset {off} for {tp} is invalid (-2 = earliest, -1 = latest, or >= 0)"
            )
    return OffsetLimit("specific", offsets, option=name)


def _check_kafka_params(opts: dict[str, str]) -> None:
    for key, why in _REJECTED_KAFKA.items():
        if key in opts:
            raise TidelogOptionError(key, f"is not supported: {why}")
    # tidelog's client speaks PLAINTEXT only: a secured setting would otherwise be ignored and
    # the connection fail (or, worse, go out unencrypted) far from the cause.
    protocol = opts.get("kafka.security.protocol")
    if protocol is not None and protocol.strip().upper() != "PLAINTEXT":
        raise TidelogOptionError(
            "kafka.security.protocol", f"only PLAINTEXT is supported, got '{protocol}'"
        )
    for key in opts:
        if key.startswith(("kafka.ssl.", "kafka.sasl.")):
            raise TidelogOptionError(key, "TLS and SASL are not supported (PLAINTEXT only)")


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Validate the read options of a batch (``streaming=False``) or streaming query.

    Defaults as in Spark: startingOffsets ``earliest`` for batch, ``latest`` for streaming;
    endingOffsets ``latest`` (batch only); failOnDataLoss true; includeHeaders false.
    """
    opts = _lower(options)
    if streaming:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if name.lower() in opts:
                raise TidelogOptionError(name, "is not valid in streaming queries")
    _check_kafka_params(opts)
    starting = _range_limit(opts, "starting", "latest" if streaming else "earliest")
    no_match = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if no_match not in ("error", "latest"):
        raise TidelogOptionError(
            "startingOffsetsByTimestampStrategy", f"expected error or latest, got '{no_match}'"
        )
    ending: OffsetLimit | None = None
    if not streaming:
        if starting.kind == "latest":
            raise TidelogOptionError("startingOffsets", "can't be latest for batch queries")
        for tp, off in starting.offsets.items():
            if off == LATEST:
                raise TidelogOptionError(
                    "startingOffsets", f"{tp} can't be latest (-1) for batch queries"
                )
        ending = _range_limit(opts, "ending", "latest")
        if ending.kind == "earliest":
            raise TidelogOptionError("endingOffsets", "can't be earliest for batch queries")
        for tp, off in ending.offsets.items():
            if off == EARLIEST:
                raise TidelogOptionError(
                    "endingOffsets", f"{tp} can't be earliest (-2) for batch queries"
                )
        if starting.kind == "specific" and ending.kind == "specific":
            if set(starting.offsets) != set(ending.offsets):
                raise TidelogOptionError(
                    "endingOffsets",
                    "must name the same topic-partitions as startingOffsets",
                )
            for tp, start in starting.offsets.items():
                end = ending.offsets[tp]
                if start >= 0 and end >= 0 and start > end:
                    raise TidelogOptionError(
                        "endingOffsets", f"{tp}: ending offset {end} is before starting {start}"
                    )
    subscription = _subscription(opts)
    bootstrap = _bootstrap(opts)
    if subscription.kind == "assign" and starting.kind == "specific":
        extra = set(starting.offsets) - set(subscription.partitions)
        if extra:
            names = ", ".join(sorted(map(str, extra)))
            raise TidelogOptionError("startingOffsets", f"names unassigned partitions: {names}")
    max_per_trigger = _positive_int(opts, "maxOffsetsPerTrigger")
    min_per_trigger = _positive_int(opts, "minOffsetsPerTrigger")
    if max_per_trigger is not None and min_per_trigger is not None:
        if min_per_trigger > max_per_trigger:
            raise TidelogOptionError(
                "minOffsetsPerTrigger",
                f"{min_per_trigger} is higher than maxOffsetsPerTrigger ({max_per_trigger})",
            )
    # Spark's connector defaults to the consumer's read_uncommitted too.
    isolation = opts.get("kafka.isolation.level", "read_uncommitted").strip().lower()
    if isolation not in ("read_committed", "read_uncommitted"):
        raise TidelogOptionError(
            "kafka.isolation.level", f"expected read_committed or read_uncommitted, got "
            f"'{isolation}'")
    retries = opts.get("fetchoffset.numretries", "3")
    if not retries.strip().isdigit():
        raise TidelogOptionError(
            "fetchOffset.numRetries", f"expected an integer >= 0, got '{retries}'"
        )
    return SourceOptions(
        bootstrap_servers=bootstrap,
        subscription=subscription,
        starting_offsets=starting,
        ending_offsets=ending,
        timestamp_no_match=no_match,  # type: ignore[arg-type]
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=_duration_ms(opts, "maxTriggerDelay", 15 * 60 * 1000),
        min_partitions=_positive_int(opts, "minPartitions"),
        fetch_offset_num_retries=int(retries),
        fetch_offset_retry_interval_ms=_positive_int(opts, "fetchOffset.retryIntervalMs") or 10,
        poll_timeout_ms=_positive_int(opts, "kafkaConsumer.pollTimeoutMs") or 120_000,
        fetch_max_bytes=_positive_int(opts, "kafka.max.partition.fetch.bytes") or 4 * 1024 * 1024,
        client_id=opts.get("kafka.client.id", "tidelog-spark"),
        read_committed=isolation == "read_committed",
    )


_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Validate the write options: ``kafka.bootstrap.servers``, optional ``topic`` (overrides the
    topic column), and the producer settings ``kafka.compression.type``, ``kafka.linger.ms``,
    ``kafka.batch.size``, ``kafka.allow.auto.create.topics``. acks is always ``all`` (the
    idempotent producer needs it)."""
    opts = _lower(options)
    if "kafka.isolation.level" in opts:
        raise TidelogOptionError(
            "kafka.isolation.level", "is a consumer setting: the sink does not read")
    bootstrap = _bootstrap(opts)
    _check_kafka_params(opts)
    acks = opts.get("kafka.acks")
    if acks is not None and acks.strip().lower() not in ("all", "-1"):
        raise TidelogOptionError(
            "kafka.acks", f"the sink always writes with acks=all (idempotent), got '{acks}'"
        )
    topic = opts.get("topic")
    if topic is not None:
        topic = topic.strip()
        if not topic:
            raise TidelogOptionError("topic", "is empty")
    compression = opts.get("kafka.compression.type", "none").strip().lower()
    if compression not in _CODECS:
        raise TidelogOptionError(
            "kafka.compression.type", f"expected one of {', '.join(_CODECS)}, got '{compression}'"
        )
    linger = opts.get("kafka.linger.ms", "5").strip()
    if not linger.isdigit():
        raise TidelogOptionError("kafka.linger.ms", f"expected an integer >= 0, got '{linger}'")
    return SinkOptions(
        bootstrap_servers=bootstrap,
        topic=topic,
        compression=compression,
        linger_ms=int(linger),
        batch_size=_positive_int(opts, "kafka.batch.size") or 1024 * 1024,
        client_id=opts.get("kafka.client.id", "tidelog-spark-sink"),
        allow_auto_create_topics=_bool(opts, "kafka.allow.auto.create.topics", True),
    )
