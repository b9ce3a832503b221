"""Live topic config changes against Kafka 3.9 (issue 11 item 2): confluent-kafka's
incremental_alter_configs and Kafka's own kafka-configs tool do the same thing on both clusters,
errors included, and the change shows in DescribeConfigs and in what a producer observes."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from differential import Pair, Target, create_ready, outcome, produce

from tidelog.testing.kafka_cluster import kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIGS = "kafka.admin.ConfigCommand"


def _alter(t: Target, topic: str, ops: list[tuple[str, str | None, Any]],
           validate_only: bool = False) -> Any:
    admin = t.admin()  # kept referenced until the answer is in
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op) for name, value, op in ops])
    return outcome(admin.incremental_alter_configs([res], validate_only=validate_only)[res])


def _overrides(t: Target, topic: str) -> dict[str, str]:
    admin = t.admin()
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    got = outcome(admin.describe_configs([res])[res])
    if isinstance(got, str):
        return {"error": got}
    return {k: e.value for k, e in got.items() if e.source == 1}  # DYNAMIC_TOPIC_CONFIG


def test_incremental_alter_configs_and_its_errors(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        topic = "cfg-live"
        create_ready(t, topic, config={"retention.ms": "3600000"})
        steps: list[object] = []
        steps.append(_alter(t, topic, [("min.insync.replicas", "2", AlterConfigOpType.SET),
                                       ("retention.ms", None, AlterConfigOpType.DELETE)]))
        steps.append(_overrides(t, topic))
        steps.append(_alter(t, topic, [("segment.ms", "100000", AlterConfigOpType.SET)],
                            validate_only=True))
        steps.append(_alter(t, topic, [("no.such.config", "1", AlterConfigOpType.SET)]))
        steps.append(_alter(t, topic, [("retention.ms", "soon", AlterConfigOpType.SET)]))
        steps.append(_alter(t, topic, [("retention.ms", "1", AlterConfigOpType.APPEND)]))
        steps.append(_alter(t, topic, [("segment.ms", "100000", AlterConfigOpType.SET),
                                       ("min.insync.replicas", "0", AlterConfigOpType.SET)]))
        steps.append(_alter(t, "cfg-never-created",
                            [("retention.ms", "1000", AlterConfigOpType.SET)]))
        steps.append(_overrides(t, topic))  # nothing of the refused changes applied
        return steps

    steps = pair.same(scenario)
    assert steps[0] is None and steps[1] == {"min.insync.replicas": "2"}


def test_a_raised_min_insync_replicas_is_enforced_without_a_restart(pair: Pair) -> None:
    """RF 3, one follower stopped (ISR 2): min.insync.replicas raised to 3 refuses acks=all at
    once; on a topic of one replica the same value is capped at 1 (Kafka's effectiveMinIsr)."""
    def scenario(t: Target) -> object:
        topic, single = "cfg-minisr", "cfg-minisr-rf1"
        create_ready(t, topic)
        follower = _a_follower(t, topic)
        t.stop_broker(follower)
        try:
            create_ready(t, single, replication_factor=1)  # on a running broker
            before = produce(t, topic, [b"a"], acks="all", retries=0)
            changed = [_alter(t, name, [("min.insync.replicas", "3", AlterConfigOpType.SET)])
                       for name in (topic, single)]
            deadline = time.monotonic() + 30
            while True:  # each broker applies the notification on its own
                after = produce(t, topic, [b"b"], acks="all", retries=0)
                if after[0][0] is not None or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
            capped = produce(t, single, [b"c"], acks="all", retries=0)
        finally:
            t.start_broker(follower)
        return before, changed, after[0][0], capped

    assert pair.same(scenario)[2] == "NOT_ENOUGH_REPLICAS"


def _a_follower(t: Target, topic: str) -> int:
    admin = t.admin()
    deadline = time.monotonic() + 20
    while True:
        md = admin.list_topics(timeout=10).topics.get(topic)
        if md is not None and md.error is None and 0 in md.partitions:
            p = md.partitions[0]
            return next(r for r in p.replicas if r != p.leader)
        assert time.monotonic() < deadline, f"no metadata for {topic}"
        time.sleep(0.2)


def test_kafka_configs_tool_alters_and_describes(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        topic = "cfg-tool"
        create_ready(t, topic)
        bs = ("--bootstrap-server", t.bootstrap, "--entity-type", "topics",
              "--entity-name", topic)
        altered = kafka_tool(CONFIGS, *bs, "--alter", "--add-config",
                             "retention.ms=7200000,max.message.bytes=2000000")
        described = kafka_tool(CONFIGS, *bs, "--describe")
        deleted = kafka_tool(CONFIGS, *bs, "--alter", "--delete-config", "retention.ms")
        again = kafka_tool(CONFIGS, *bs, "--describe")
        return ((altered.returncode, altered.stdout), (described.returncode, described.stdout),
                (deleted.returncode, deleted.stdout), (again.returncode, again.stdout))

    got = pair.same(scenario)
    assert got[0][0] == 0 and "retention.ms=7200000" in got[1][1]
