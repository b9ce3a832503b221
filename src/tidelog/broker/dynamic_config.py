"""Dynamic broker configs (Kafka's `DynamicBrokerConfig`, ZooKeeper mode): the log defaults an
operator may change without a restart, per broker (`/config/brokers/<id>`) or for the whole
cluster (`/config/brokers/<default>`), and where each value shown by DescribeConfigs comes from.

The dynamic keys are Kafka's `DynamicLogConfig` ones: the broker keys that give the topics their
defaults (`log.retention.ms`, `log.segment.bytes`, `min.insync.replicas`, `compression.type`, ...).
Precedence: a per-broker dynamic value, then the cluster-wide dynamic default, then
server.properties, then Kafka's default. Other known keys cannot be changed dynamically; keys
tidelog does not know are stored and ignored, as Kafka stores custom configs. The replication
throttles `leader.replication.throttled.rate` / `follower.replication.throttled.rate` (Kafka's
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
from tidelog.replication.replication_quota import FOLLOWER_RATE, LEADER_RATE, parse_rate

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
DYNAMIC_KEYS: frozenset[str] = frozenset(TOPIC_TO_BROKER_KEY.values())
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
        for a key that cannot change dynamically or a value that does not hold."""
        fixed = sorted(k for k in props if k in CONFIG_DEFS and k not in DYNAMIC_KEYS)
        if fixed:
            raise ConfigError(None, f"Cannot update these configs dynamically: Set({', '.join(fixed)})")
        for key in (LEADER_RATE, FOLLOWER_RATE):
            if key in props:
                try:
                    parse_rate(key, props[key])
                except ValueError as e:
                    raise ConfigError(None, str(e)) from None
        if per_broker:
            self.effective(self.cluster_default, props)
        else:
            self.effective(props, self.per_broker)

    # --- DescribeConfigs ----------------------------------------------------------------------
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
