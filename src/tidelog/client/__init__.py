"""tidelog's own asyncio Kafka client (fetchers, controller channel, CLI, Spark).

- ``connection.BrokerConnection``: one pipelined, version-negotiating connection to a broker.
- ``cluster.KafkaClient``: bootstrap, metadata, pooled connections, typed requests with retries.
- ``producer.Producer``: batching, idempotent producer. ``consumer.Consumer``: assign-based.

Names are importable from here too; each module is loaded on first use, so that importing
``tidelog.client.connection`` (the broker does) does not load the producer or consumer.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BrokerConnection": "connection",
    "KafkaClient": "cluster",
    "NewTopic": "cluster",
    "FetchResult": "cluster",
    "OffsetAndEpoch": "cluster",
    "Producer": "producer",
    "Consumer": "consumer",
    "ConsumerRecord": "consumer",
    "TopicPartition": "metadata",
    "ClusterMetadata": "metadata",
    "KafkaClientError": "errors",
    "KafkaConnectionError": "errors",
    "RequestTimedOutError": "errors",
    "NoBrokersAvailableError": "errors",
    "UnsupportedVersionError": "errors",
    "BrokerResponseError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tidelog.client' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tidelog.client.{module}"), name)
