"""Dynamic broker configs (Kafka's `DynamicBrokerConfig`, ZooKeeper mode): the log defaults an
operator may change without a restart, per broker (`/config/brokers/<id>`) or for the whole
cluster (`/config/brokers/<default>`), and where each value shown by DescribeConfigs comes from.

The dynamic keys are those of Kafka 3.9's `DynamicBrokerConfig.AllDynamicConfigs` that tidelog
defines: the `DynamicLogConfig` ones (the broker keys that give the topics their defaults:
`log.retention.ms`, `log.segment.bytes`, `min.insync.replicas`, `compression.type`, ...), the log
cleaner's (`log.cleaner.threads`, `.dedupe.buffer.size`, `.io.buffer.load.factor`,
`.io.max.bytes.per.second`, `.backoff.ms`: the cleaner restarts with them, as Kafka's
`LogCleaner.reconfigure`), the connection limits (`max.connections`, `max.connections.per.ip`:
the next accept obeys them), `producer.id.expiration.ms` (every log's producer state),
`transaction.partition.verification.enable` (read by the next transactional produce),
`num.replica.fetchers` (the fetchers are re-partitioned, as Kafka's resizeThreadPool), and the
thread counts tidelog accepts but does not use (`num.io.threads`, `num.network.threads`,
`background.threads`, `num.recovery.threads.per.data.dir`). A thread count may change to no less
than half and no more than double its current value, as Kafka's `DynamicThreadPool` and
`LogCleaner.validateReconfiguration` check; otherwise Kafka's "Invalid dynamic configuration".

Refused although Kafka changes them live: the listener keys (`listeners`, `advertised.listeners`,
`listener.security.protocol.map`; at the cluster level with Kafka's own message, since Kafka
takes them per broker only): tidelog cannot apply them without a restart. Also refused: the
dynamic keys of Kafka 3.9 that tidelog does not implement at all (`NOT_IMPLEMENTED`: KIP-390's
compression levels, tiered storage, connection-rate quotas, metric reporters, ...), which its
server.properties refuses as unknown too; a key Kafka does not know either is a custom config.

Precedence: a per-broker dynamic value, then the cluster-wide dynamic default, then
server.properties, then Kafka's default. Other known keys cannot be changed dynamically; keys
tidelog does not know are stored and ignored, as Kafka stores custom configs. The replication
throttles `leader.replication.throttled.rate` / `follower.replication.throttled.rate` and the
bound on copies between log dirs `replica.alter.log.dirs.io.max.bytes.per.second` (Kafka's
DynamicConfig.Broker, bytes/s, at least 0) are validated here and applied by the broker's
`ReplicationQuotas`.

`config_synonyms` is Kafka's `configSynonyms`: every synonym of a key with a value, dynamic
per-broker first, then dynamic default, static and default; then everything before the first
entry named like the key is dropped (so `retention.ms` lists nothing when only
`log.retention.hours` has a value, as Kafka 3.9 shows).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tidelog.broker.config import _LOG_CONFIG_SYNONYMS, CONFIG_DEFS, ConfigError, KafkaConfig
from tidelog.replication.replication_quota import BROKER_RATES, parse_rate

__all__ = ["DYNAMIC_DEFAULT", "DYNAMIC_KEYS", "DynamicBrokerConfig", "TOPIC_TO_BROKER_KEY"]

# The entity name of the cluster-wide default (Kafka's ConfigEntityName.Default).
DYNAMIC_DEFAULT = "<default>"

# DescribeConfigs config_source values.
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# Topic key -> the broker key that gives its default (Kafka's TopicConfigSynonyms).
TOPIC_TO_BROKER_KEY: dict[str, str] = {
    **_LOG_CONFIG_SYNONYMS,
    "retention.ms": "log.retention.ms",
    "segment.ms": "log.roll.ms",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "flush.ms": "log.flush.interval.ms",
}
# Applied live by the broker (server.py `_apply_dynamic_broker_config`).
CLEANER_KEYS = frozenset({
    "log.cleaner.threads", "log.cleaner.dedupe.buffer.size", "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.max.bytes.per.second", "log.cleaner.backoff.ms"})
CONNECTION_KEYS = frozenset({"max.connections", "max.connections.per.ip"})
# Thread pools Kafka resizes live (DynamicThreadPool, the network processors); tidelog runs on
# one event loop and uses none of them (their docs say so).
UNUSED_THREAD_KEYS = frozenset({
    "num.io.threads", "num.network.threads", "background.threads",
    "num.recovery.threads.per.data.dir"})
THREAD_POOL_KEYS = UNUSED_THREAD_KEYS | {"num.replica.fetchers"}
DYNAMIC_KEYS: frozenset[str] = frozenset(TOPIC_TO_BROKER_KEY.values()) | CLEANER_KEYS \
    | CONNECTION_KEYS | THREAD_POOL_KEYS | {"producer.id.expiration.ms",
                                            "transaction.partition.verification.enable"}
# Kafka: per broker only (DynamicBrokerConfig.PerBrokerConfigs).
PER_BROKER_KEYS = frozenset({"listeners", "advertised.listeners",
                             "listener.security.protocol.map"})
# Dynamic in Kafka, but tidelog cannot apply them without a restart.
NOT_LIVE_KEYS = PER_BROKER_KEYS
# Dynamic in Kafka 3.9 (DynamicBrokerConfig.AllDynamicConfigs and DynamicConfig.Broker, the
# security keys aside), not implemented by tidelog.
NOT_IMPLEMENTED = frozenset({
    "compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
    "log.cleaner.io.buffer.size", "log.local.retention.bytes", "log.local.retention.ms",
    "log.message.timestamp.after.max.ms", "log.message.timestamp.before.max.ms",
    "max.connection.creation.rate", "max.connections.per.ip.overrides", "metric.reporters",
    "remote.fetch.max.wait.ms", "remote.log.index.file.cache.total.size.bytes",
    "remote.log.manager.copy.max.bytes.per.second",
    "remote.log.manager.fetch.max.bytes.per.second"})
# A broker key and the keys Kafka falls back on for it, in order (LogConfig's synonyms).
_BROKER_SYNONYMS: dict[str, tuple[str, ...]] = {
    "log.retention.ms": ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
    "log.roll.ms": ("log.roll.ms", "log.roll.hours"),
    "log.roll.jitter.ms": ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    "log.flush.interval.ms": ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
}


def _str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


class DynamicBrokerConfig:
    """One broker's static config plus the dynamic values in force; `current` is the
    effective KafkaConfig (what the log defaults are built from)."""

    def __init__(self, static: KafkaConfig) -> None:
        self.static = static
        self.cluster_default: dict[str, str] = {}
        self.per_broker: dict[str, str] = {}
        self.current = static

    def update(self, cluster_default: Mapping[str, str], per_broker: Mapping[str, str]) -> None:
        """The stored dynamic configs changed: recompute `current` (raises ConfigError when the
        combination is invalid; nothing changes then)."""
        current = self.effective(cluster_default, per_broker)
        self.cluster_default = dict(cluster_default)
        self.per_broker = dict(per_broker)
        self.current = current

    def effective(self, cluster_default: Mapping[str, str],
                  per_broker: Mapping[str, str]) -> KafkaConfig:
        known = {k: v for k, v in {**cluster_default, **per_broker}.items() if k in DYNAMIC_KEYS}
        return self.static.with_overrides(known) if known else self.static

    def validate(self, props: Mapping[str, str], per_broker: bool) -> None:
        """A new set of dynamic configs for this broker (or the cluster default): ConfigError
        for a key that cannot change dynamically or a value that does not hold (Kafka's
        DynamicBrokerConfig.validate, in its order)."""
        fixed = sorted(k for k in props if k in CONFIG_DEFS and k not in DYNAMIC_KEYS
                       and k not in NOT_LIVE_KEYS)
        if fixed:
            raise ConfigError(None, f"Cannot update these configs dynamically: Set({', '.join(fixed)})")
        if not per_broker:
            only_per_broker = sorted(k for k in props if k in PER_BROKER_KEYS)
            if only_per_broker:
                raise ConfigError(None, "Cannot update these configs at default cluster level, "
                                  f"broker id must be specified: Set({', '.join(only_per_broker)})")
        not_live = sorted(k for k in props if k in NOT_LIVE_KEYS)
        if not_live:
            raise ConfigError(None, "tidelog cannot update these configs without a restart: "
                              f"Set({', '.join(not_live)})")
        missing = sorted(k for k in props if k in NOT_IMPLEMENTED)
        if missing:
            raise ConfigError(None, "tidelog does not implement these configs: "
                              f"Set({', '.join(missing)})")
        for key in BROKER_RATES:
            if key in props:
                try:
                    parse_rate(key, props[key])
                except ValueError as e:
                    raise ConfigError(None, str(e)) from None
        new = (self.effective(self.cluster_default, props) if per_broker
               else self.effective(props, self.per_broker))
        reason = thread_count_refusal(self.current, new)
        if reason is not None:
            # Kafka's processReconfiguration: the client sees only this; the cause is logged.
            raise ConfigError(None, "Invalid dynamic configuration") from ValueError(reason)

    # --- DescribeConfigs ----------------------------------------------------------------------
    def broker_rates(self) -> list[tuple[str, list[tuple[str, str, int]]]]:
        """The replication throttle rates set dynamically for this broker (no KafkaConfig key:
        Kafka lists them from its dynamic configs): (key, synonyms, most specific first)."""
        out: list[tuple[str, list[tuple[str, str, int]]]] = []
        for key in BROKER_RATES:
            synonyms = [(key, layer[key], source) for layer, source in (
                (self.per_broker, DYNAMIC_BROKER_CONFIG),
                (self.cluster_default, DYNAMIC_DEFAULT_BROKER_CONFIG)) if key in layer]
            if synonyms:
                out.append((key, synonyms))
        return out

    def source_of(self, key: str) -> int:
        if key in self.per_broker and key in DYNAMIC_KEYS:
            return DYNAMIC_BROKER_CONFIG
        if key in self.cluster_default and key in DYNAMIC_KEYS:
            return DYNAMIC_DEFAULT_BROKER_CONFIG
        if self.static.is_set(key):
            return STATIC_BROKER_CONFIG
        return DEFAULT_CONFIG

    def config_synonyms(self, key: str) -> list[tuple[str, str | None, int]]:
        """Kafka's configSynonyms(key): (name, value, source), most specific first."""
        names = _BROKER_SYNONYMS.get(key, (key,))
        out: list[tuple[str, str | None, int]] = []
        layers: list[tuple[Mapping[str, Any], int]] = [
            ({k: v for k, v in self.per_broker.items() if k in DYNAMIC_KEYS},
             DYNAMIC_BROKER_CONFIG),
            ({k: v for k, v in self.cluster_default.items() if k in DYNAMIC_KEYS},
             DYNAMIC_DEFAULT_BROKER_CONFIG),
            ({k: self.static.get(k) for k in names if self.static.is_set(k)},
             STATIC_BROKER_CONFIG),
            ({k: CONFIG_DEFS[k].default for k in names if CONFIG_DEFS[k].default is not None},
             DEFAULT_CONFIG),
        ]
        for values, source in layers:
            for name in names:
                if name in values and values[name] is not None:
                    out.append((name, _str(values[name]), source))
        while out and out[0][0] != key:
            out.pop(0)
        return out


def thread_count_refusal(old: KafkaConfig, new: KafkaConfig) -> str | None:
    """Kafka's checks of a thread count changed live: DynamicThreadPool (and the network
    processors) and LogCleaner.validateReconfiguration (halving as Scala's Int division)."""
    for key in sorted(THREAD_POOL_KEYS):
        before, after = int(old.get(key)), int(new.get(key))
        if after == before:
            continue
        error = f"Dynamic thread count update validation failed for {key}={after}"
        if after <= 0:
            return f"{error}, value should be at least 1"
        if after < before // 2:
            return f"{error}, value should be at least half the current value {before}"
        if after > before * 2:
            return f"{error}, value should not be greater than double the current value {before}"
    if any(old.get(k) != new.get(k) for k in CLEANER_KEYS):
        before, after = int(old.get("log.cleaner.threads")), int(new.get("log.cleaner.threads"))
        if after < 1:
            return "Log cleaner threads should be at least 1"
        if after < before // 2:
            return ("Log cleaner threads cannot be reduced to less than half the current value "
                    f"{before}")
        if after > before * 2:
            return ("Log cleaner threads cannot be increased to more than double the current "
                    f"value {before}")
    return None
