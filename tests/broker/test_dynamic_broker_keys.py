"""The dynamic broker keys of Kafka 3.9 beyond the log defaults (issue 11 leftover): applied
live (connection limits, the log cleaner's keys, producer.id.expiration.ms,
num.replica.fetchers), accepted with Kafka's thread-count checks (the thread pools tidelog does
not have), or refused (the listener keys: per-broker only in Kafka, not live in tidelog)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from harness import ActingController, BrokerThread, send, wait_until

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import describe_configs as m_dc
from tidelog.protocol.messages import incremental_alter_configs as m_iac

pytestmark = pytest.mark.integration

SET, DELETE = 0, 1


def alter(broker: BrokerThread, name: str, configs: list[tuple[str, int, str | None]],
          validate_only: bool = False) -> Any:
    req = m_iac.IncrementalAlterConfigsRequest(validate_only=validate_only, resources=[
        m_iac.AlterConfigsResource(4, name, [m_iac.AlterableConfig(k, op, v)
                                             for k, op, v in configs])])
    return send(broker.port, req).responses[0]


def described(broker: BrokerThread, key: str) -> tuple[str | None, int, bool]:
    req = m_dc.DescribeConfigsRequest(resources=[m_dc.DescribeConfigsResource(4, "1", [key])])
    [entry] = send(broker.port, req).results[0].configs
    return entry.value, entry.config_source, entry.read_only


@pytest.fixture
def dynamic(one_broker: BrokerThread) -> Iterator[list[tuple[str, str]]]:
    """(entity, key) pairs the test set; removed again at the end (the broker is shared)."""
    made: list[tuple[str, str]] = []
    yield made
    for entity, key in made:
        assert alter(one_broker, entity, [(key, DELETE, None)]).error_code == 0


def test_thread_counts_change_within_half_and_double_as_kafka_checks(
        one_broker: BrokerThread, dynamic: list[tuple[str, str]]) -> None:
    assert described(one_broker, "num.io.threads") == ("8", 5, False)  # DEFAULT, not read-only
    too_many = alter(one_broker, "1", [("num.io.threads", SET, "17")])
    assert (too_many.error_code, too_many.error_message) == (
        ErrorCode.INVALID_REQUEST,
        "Invalid value org.apache.kafka.common.config.ConfigException: Dynamic thread count "
        "update validation failed for num.io.threads=17, value should not be greater than "
        "double the current value 8 for configuration Invalid dynamic configuration")
    assert alter(one_broker, "", [("background.threads", SET, "4")]).error_code == \
        ErrorCode.INVALID_REQUEST  # 10 -> less than half
    dynamic.append(("1", "num.io.threads"))
    assert alter(one_broker, "1", [("num.io.threads", SET, "16")]).error_code == 0
    wait_until(lambda: described(one_broker, "num.io.threads") == ("16", 2, False),
               what="DYNAMIC_BROKER_CONFIG 16")


def test_the_listener_keys_are_refused(
        one_broker: BrokerThread) -> None:
    cluster = alter(one_broker, "", [("listeners", SET, "PLAINTEXT://127.0.0.1:0")])
    assert cluster.error_code == ErrorCode.INVALID_REQUEST
    assert cluster.error_message == (  # Kafka's own refusal at the cluster level
        "Cannot update these configs at default cluster level, broker id must be specified: "
        "Set(listeners)")
    r = alter(one_broker, "1", [("advertised.listeners", SET, "PLAINTEXT://127.0.0.1:1")])
    assert r.error_code == ErrorCode.INVALID_REQUEST and "advertised.listeners" in r.error_message


def test_kafkas_dynamic_keys_tidelog_does_not_implement_are_refused_custom_ones_stored(
        one_broker: BrokerThread, controller: ActingController,
        dynamic: list[tuple[str, str]]) -> None:
    for key, value in (("compression.gzip.level", "5"), ("metric.reporters", "")):
        r = alter(one_broker, "", [(key, SET, value)])
        assert (r.error_code, r.error_message) == (
            ErrorCode.INVALID_REQUEST, f"tidelog does not implement these configs: Set({key})")
    dynamic.append(("", "my.own.setting"))
    assert alter(one_broker, "", [("my.own.setting", SET, "x")]).error_code == 0
    assert controller.zk.get_broker_config("<default>") == {"my.own.setting": "x"}


def test_num_replica_fetchers_resizes_the_fetcher_pool(
        one_broker: BrokerThread, dynamic: list[tuple[str, str]]) -> None:
    fetchers = one_broker.server.replica_manager.fetcher_manager
    assert fetchers.num_fetchers == 1
    assert alter(one_broker, "", [("num.replica.fetchers", SET, "3")]).error_code == \
        ErrorCode.INVALID_REQUEST  # more than double
    dynamic.append(("", "num.replica.fetchers"))
    assert alter(one_broker, "", [("num.replica.fetchers", SET, "2")]).error_code == 0
    wait_until(lambda: fetchers.num_fetchers == 2, what="two fetchers per source broker")


def test_connection_limits_apply_to_the_next_accept(
        one_broker: BrokerThread, dynamic: list[tuple[str, str]]) -> None:
    servers = list(one_broker.server.socket_servers.values())
    dynamic.append(("1", "max.connections.per.ip"))
    assert alter(one_broker, "1", [("max.connections.per.ip", SET, "1")]).error_code == 0
    wait_until(lambda: all(s.max_connections_per_ip == 1 for s in servers),
               what="the limit applied")
    first = socket.create_connection(("127.0.0.1", one_broker.port), timeout=10)
    second = socket.create_connection(("127.0.0.1", one_broker.port), timeout=10)
    try:
        second.settimeout(10)
        assert second.recv(1) == b""  # closed by the broker: one connection per IP
    finally:
        first.close()
        second.close()


def test_the_log_cleaner_restarts_with_its_new_keys(
        one_broker: BrokerThread, dynamic: list[tuple[str, str]]) -> None:
    def cleaner() -> Any:
        return one_broker.server.log_cleaner

    assert cleaner().config.num_threads == 1
    assert alter(one_broker, "", [("log.cleaner.threads", SET, "3")]).error_code == \
        ErrorCode.INVALID_REQUEST  # more than double
    dynamic.append(("", "log.cleaner.threads"))
    dynamic.append(("", "log.cleaner.backoff.ms"))
    assert alter(one_broker, "", [("log.cleaner.threads", SET, "2"),
                                  ("log.cleaner.backoff.ms", SET, "500")]).error_code == 0
    wait_until(lambda: cleaner().config.num_threads == 2 and cleaner().config.backoff_ms == 500
               and len(one_broker.call(lambda: list(cleaner()._tasks))) == 2,
               what="two cleaner loops with the new backoff")


def test_producer_id_expiration_reaches_every_logs_producer_state(
        one_broker: BrokerThread, controller: ActingController,
        dynamic: list[tuple[str, str]]) -> None:
    controller.create_topic("pid-exp", {0: [1]})
    wait_until(lambda: one_broker.server.log_manager.get_log("pid-exp", 0) is not None,
               what="the log")
    dynamic.append(("1", "producer.id.expiration.ms"))
    assert alter(one_broker, "1", [("producer.id.expiration.ms", SET, "60000")]).error_code == 0

    def expirations() -> tuple[int, int]:
        log = one_broker.server.log_manager.get_log("pid-exp", 0)
        return (log.producer_state_manager.producer_id_expiration_ms,
                one_broker.server.log_manager.producer_id_expiration_ms)

    wait_until(lambda: one_broker.call(expirations) == (60000, 60000), what="applied")


def test_the_alter_log_dirs_throttle_bounds_the_broker_s_copies_between_log_dirs(
        one_broker: BrokerThread, dynamic: list[tuple[str, str]]) -> None:
    key = "replica.alter.log.dirs.io.max.bytes.per.second"
    quota = one_broker.server.replica_manager.shell.alter_log_dirs_manager.quota
    assert quota is one_broker.server.replication_quotas.alter_log_dirs
    r = alter(one_broker, "1", [(key, SET, "-1")])
    assert (r.error_code, r.error_message) == (
        ErrorCode.INVALID_REQUEST, f"Invalid value -1 for configuration {key}: "
        "Value must be at least 0")
    dynamic.append(("1", key))
    assert alter(one_broker, "1", [(key, SET, "5000")]).error_code == 0
    wait_until(lambda: quota.bound == 5000, what="the copies bounded to 5000 B/s")
    # Described as Kafka lists it: DYNAMIC_BROKER_CONFIG, not read-only.
    assert described(one_broker, key) == ("5000", 2, False)
