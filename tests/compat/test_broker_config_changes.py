"""Dynamic broker configs against Kafka 3.9 (issue 11 item 2): the log defaults Kafka lets an
operator change without a restart, per broker and cluster-wide, stored under /config/brokers;
their sources in DescribeConfigs; keys that are not dynamic refused."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka.admin import AlterConfigOpType
from differential import Pair, Target, create_ready, produce, raw

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import describe_configs as m_dc
from tidelog.protocol.messages import incremental_alter_configs as m_iac

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _broker_1(t: Target) -> str:
    """Broker 1's address (ids 1-3 on both clusters): a per-broker change goes to that broker."""
    admin = t.admin()
    b = admin.list_topics(timeout=10).brokers[1]
    return f"{b.host}:{b.port}"


def _alter_broker(t: Target, name: str, ops: list[tuple[str, str | None, Any]],
                  validate_only: bool = False) -> Any:
    """IncrementalAlterConfigs v0 on a broker resource ("" = the cluster-wide default, which
    confluent-kafka's ConfigResource cannot name): (error name, or None)."""
    req = m_iac.IncrementalAlterConfigsRequest(validate_only=validate_only, resources=[
        m_iac.AlterConfigsResource(4, name, [m_iac.AlterableConfig(k, int(op.value), v)
                                             for k, v, op in ops])])
    r = raw(_broker_1(t), req, 0).responses[0]
    return None if r.error_code == 0 else ErrorCode(r.error_code).name


def _describe(t: Target, rtype: int, name: str, keys: set[str]) -> Any:
    req = m_dc.DescribeConfigsRequest(include_synonyms=True, resources=[
        m_dc.DescribeConfigsResource(rtype, name, sorted(keys))])
    r = raw(_broker_1(t), req, 1).results[0]
    if r.error_code:
        return ErrorCode(r.error_code).name
    def shape(name: str, value: str | None) -> str | None:
        return "a log dir" if name == "log.dirs" and value else value  # differs per cluster

    return {c.name: (shape(c.name, c.value), c.config_source, c.read_only,
                     [(s.name, shape(s.name, s.value), s.source) for s in c.synonyms])
            for c in r.configs}


def test_dynamic_log_defaults_per_broker_and_cluster_wide(pair: Pair) -> None:
    keys = {"log.retention.ms", "min.insync.replicas", "log.dirs", "broker.rack"}

    def scenario(t: Target) -> object:
        steps: list[object] = []
        steps.append(_alter_broker(t, "", [("log.retention.ms", "7200000", AlterConfigOpType.SET)]))
        steps.append(_alter_broker(t, "1", [("log.retention.ms", "3600000", AlterConfigOpType.SET)]))
        steps.append(_alter_broker(t, "1", [("log.dirs", "/elsewhere", AlterConfigOpType.SET)]))
        steps.append(_alter_broker(t, "1", [("log.retention.ms", "soon", AlterConfigOpType.SET)]))
        steps.append(_alter_broker(t, "1", [("no.such.key", "1", AlterConfigOpType.SET)]))
        steps.append(_alter_broker(t, "", [("min.insync.replicas", "2", AlterConfigOpType.SET)],
                                   validate_only=True))
        time.sleep(1)  # the notifications reach every broker
        steps.append(_describe(t, 4, "1", keys))
        steps.append(_describe(t, 4, "", keys))
        create_ready(t, "dyn-topic", replication_factor=1)
        steps.append(_describe(t, 2, "dyn-topic",
                               {"retention.ms", "min.insync.replicas"}))
        steps.append(produce(t, "dyn-topic", [b"x"], acks="all", retries=0))
        steps.append(_alter_broker(t, "1", [("log.retention.ms", None, AlterConfigOpType.DELETE)]))
        steps.append(_alter_broker(t, "", [("log.retention.ms", None, AlterConfigOpType.DELETE)]))
        time.sleep(1)
        steps.append(_describe(t, 4, "1", {"log.retention.ms"}))
        return steps

    steps = pair.same(scenario)
    assert steps[:3] == [None, None, "INVALID_REQUEST"]  # log.dirs is not dynamic
    assert steps[6]["log.retention.ms"][:2] == ("3600000", 2)  # DYNAMIC_BROKER_CONFIG
