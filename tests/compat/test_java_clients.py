"""Kafka's own Java clients (kafka-clients 3.9.1: Admin, an idempotent acks=all producer, a
group consumer) through interop/src/main/java/tidelog/interop/Harness.java, against Kafka and
against tidelog: every line the harness prints must be the same."""

from __future__ import annotations

import pytest
from differential import Pair, Target

from tidelog.testing.kafka_cluster import kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HARNESS = "tidelog.interop.Harness"


def harness(scenario: str, t: Target) -> list[str]:
    r = kafka_tool(HARNESS, scenario, t.bootstrap, timeout_s=240)
    assert r.returncode == 0, f"{t.name}: {r.stderr[-2000:]}"
    return r.stdout.splitlines()


def test_java_admin_client(pair: Pair) -> None:
    got = pair.same(lambda t: harness("admin", t))
    assert "create: ok" in got and "create again: TopicExistsException" in got


def test_java_producer_and_group_consumer(pair: Pair) -> None:
    got = pair.same(lambda t: harness("clients", t))
    # Every record the producer had acked, with its own CreateTime (ms past the harness's base),
    # read by the group consumer: the same loss on both clusters must fail too.
    consumed = ", ".join(f"{p}@{o}=k{2 * o + p}=v{2 * o + p} t=+{2 * o + p}"
                         for p in (0, 1) for o in range(5))
    assert f"consumed: {{{consumed}}}" in got
    assert "group state after close: Empty" in got
