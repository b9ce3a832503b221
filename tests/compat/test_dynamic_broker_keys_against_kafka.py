"""The dynamic broker keys beyond the log defaults against Kafka 3.9 (issue 11 leftover): thread
counts within half and double of the current value, the log cleaner's threads, the connection
limits, num.replica.fetchers and producer.id.expiration.ms accepted; listeners refused at the
cluster level with Kafka's message. Where tidelog differs (the listener keys per broker: Kafka
changes them live, tidelog refuses them) the difference is asserted as documented."""

from __future__ import annotations

from typing import Any

import pytest
from differential import Pair, Target, raw

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import describe_configs as m_dc
from tidelog.protocol.messages import incremental_alter_configs as m_iac

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SET = 0


def _broker_1(t: Target) -> str:
    b = t.admin().list_topics(timeout=10).brokers[1]
    return f"{b.host}:{b.port}"


def _validate(t: Target, name: str, key: str, value: str) -> Any:
    """IncrementalAlterConfigs v0, validate_only (the shared clusters keep their configs):
    None, or (error name, message)."""
    req = m_iac.IncrementalAlterConfigsRequest(validate_only=True, resources=[
        m_iac.AlterConfigsResource(4, name, [m_iac.AlterableConfig(key, SET, value)])])
    r = raw(_broker_1(t), req, 0).responses[0]
    return None if r.error_code == 0 else (ErrorCode(r.error_code).name, r.error_message)


def _described(t: Target, keys: list[str]) -> dict[str, tuple[str | None, bool]]:
    req = m_dc.DescribeConfigsRequest(resources=[m_dc.DescribeConfigsResource(4, "1", keys)])
    return {c.name: (c.value, c.read_only) for c in raw(_broker_1(t), req, 1).results[0].configs}


THREADS = ["num.io.threads", "num.network.threads", "background.threads",
           "num.recovery.threads.per.data.dir", "num.replica.fetchers"]
ACCEPTED = [("", "log.cleaner.backoff.ms", "500"),
            ("", "log.cleaner.io.max.bytes.per.second", "1000000"),
            ("1", "max.connections", "1000"), ("", "max.connections.per.ip", "100"),
            ("", "producer.id.expiration.ms", "60000")]
DIFFERENT = [("1", "advertised.listeners", "PLAINTEXT://127.0.0.1:1"),
             ("1", "listener.security.protocol.map", "PLAINTEXT:PLAINTEXT")]


def test_dynamic_thread_counts_cleaner_and_connection_keys(pair: Pair) -> None:
    """The clusters start with different thread counts (the Kafka harness sets 2), so each
    change is relative to the broker's current value, and the messages name it as N."""
    def scenario(t: Target) -> object:
        now = _described(t, THREADS)
        steps: list[object] = []
        for key in THREADS:
            current = int(now[key][0] or 0)
            for entity, value in (("1", current * 2), ("", current * 2 + 1), ("1", 0)):
                got = _validate(t, entity, key, str(value))
                if got is not None and got[1] is not None:
                    got = (got[0], got[1].replace(f"current value {current}", "current value N")
                           .replace(f"{key}={value}", f"{key}=V"))
                if value == 0 and got is not None:
                    got = got[0]  # the range check's wording is tidelog's own
                steps.append(got)
        steps.append([_validate(t, *step) for step in ACCEPTED])
        steps.append(_validate(t, "", "listeners", "PLAINTEXT://127.0.0.1:0"))
        steps.append({k: ro for k, (_, ro) in _described(
            t, THREADS + [k for _, k, _ in ACCEPTED]).items()})
        return steps

    steps = pair.same(scenario)
    assert steps[0] is None and steps[1][0] == "INVALID_REQUEST"  # double; double + 1
    assert steps[-3] == [None] * len(ACCEPTED)
    assert steps[-2] == ("INVALID_REQUEST", "Cannot update these configs at default cluster "
                         "level, broker id must be specified: Set(listeners)")


def test_the_listener_keys_per_broker_differ_as_documented(pair: Pair) -> None:
    on_kafka, on_tidelog = pair.run(lambda t: [_validate(t, *step) for step in DIFFERENT])
    assert on_kafka == [None, None]  # Kafka changes them live
    assert [r and r[0] for r in on_tidelog] == ["INVALID_REQUEST", "INVALID_REQUEST"]
