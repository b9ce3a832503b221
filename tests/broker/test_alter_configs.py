"""Live topic config changes (issue 11 item 2): AlterConfigs and IncrementalAlterConfigs from
confluent-kafka's AdminClient, written to ZooKeeper with a /config/changes notification and
applied by the broker without a restart; validate_only, Kafka's error codes, nothing applied
partially; broker keys are read-only."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)
from harness import ActingController, BrokerThread, produce, send, wait_until

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import incremental_alter_configs as m_iac
from tidelog.protocol.records.builder import build_values

pytestmark = pytest.mark.integration


def _admin(broker: BrokerThread) -> AdminClient:
    return AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.port}"})


def _incremental(broker: BrokerThread, topic: str, ops: list[tuple[str, str | None, Any]],
                 validate_only: bool = False) -> None:
    entries = [ConfigEntry(name, value, incremental_operation=op) for name, value, op in ops]
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    admin = _admin(broker)  # kept alive until the answer is in
    admin.incremental_alter_configs([res], validate_only=validate_only)[res].result(30)


def _error_of(call: Any) -> KafkaError:
    with pytest.raises(KafkaException) as e:
        call()
    return e.value.args[0]


def _acks_all(broker: BrokerThread, topic: str) -> int:
    return produce(broker.port, topic, 0, build_values([b"x"]), acks=-1)[0]


def _log_config(broker: BrokerThread, topic: str) -> Any:
    return broker.call(lambda: broker.server.log_manager.get_log(topic, 0).config)


def test_incremental_alter_configs_applies_min_insync_replicas_without_a_restart(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("live", {0: [1, 2]})  # broker 2 absent: ISR [1] of 2 replicas
    assert _acks_all(one_broker, "live") == 0
    _incremental(one_broker, "live", [("min.insync.replicas", "2", AlterConfigOpType.SET),
                                      ("retention.ms", "60000", AlterConfigOpType.SET)])
    assert controller.zk.get_topic_config("live") == {"min.insync.replicas": "2",
                                                      "retention.ms": "60000"}
    wait_until(lambda: _log_config(one_broker, "live").min_insync_replicas == 2,
               what="the change applied to the log")
    assert _log_config(one_broker, "live").retention_ms == 60000
    assert _acks_all(one_broker, "live") == ErrorCode.NOT_ENOUGH_REPLICAS
    admin = _admin(one_broker)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "live")])
    entry = next(iter(described.values())).result(30)["min.insync.replicas"]
    assert (entry.value, entry.source) == ("2", 1)  # DYNAMIC_TOPIC_CONFIG

    _incremental(one_broker, "live", [("min.insync.replicas", None, AlterConfigOpType.DELETE)])
    wait_until(lambda: _log_config(one_broker, "live").min_insync_replicas == 1,
               what="the override removed")
    assert _acks_all(one_broker, "live") == 0
    assert controller.zk.get_topic_config("live") == {"retention.ms": "60000"}


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")  # the API under test
def test_alter_configs_replaces_every_override(one_broker: BrokerThread,
                                               controller: ActingController) -> None:
    controller.create_topic("whole", {0: [1]}, config={"retention.ms": "60000"})
    res = ConfigResource(ConfigResource.Type.TOPIC, "whole", set_config={"segment.bytes": "100000"})
    admin = _admin(one_broker)
    admin.alter_configs([res])[res].result(30)
    assert controller.zk.get_topic_config("whole") == {"segment.bytes": "100000"}
    wait_until(lambda: _log_config(one_broker, "whole").segment_bytes == 100000,
               what="the new segment.bytes")
    assert _log_config(one_broker, "whole").retention_ms == 7 * 24 * 3600 * 1000


def test_validate_only_changes_nothing(one_broker: BrokerThread,
                                       controller: ActingController) -> None:
    controller.create_topic("dry", {0: [1]})
    _incremental(one_broker, "dry", [("min.insync.replicas", "2", AlterConfigOpType.SET)],
                 validate_only=True)
    assert controller.zk.get_topic_config("dry") == {}
    assert _acks_all(one_broker, "dry") == 0


@pytest.mark.parametrize(("ops", "code", "text"), [
    ([("no.such.key", "1", AlterConfigOpType.SET)], KafkaError.INVALID_CONFIG, "no.such.key"),
    ([("retention.ms", "soon", AlterConfigOpType.SET)], KafkaError.INVALID_CONFIG,
     "Invalid config value for resource"),
    ([("preallocate", "true", AlterConfigOpType.SET)], KafkaError.INVALID_CONFIG,
     "preallocate"),
    ([("retention.ms", "1", AlterConfigOpType.APPEND)], KafkaError.INVALID_CONFIG,
     "append is not allowed for config key: retention.ms"),
    # A valid change next to a bad one: neither is applied.
    ([("retention.ms", "1000", AlterConfigOpType.SET),
      ("min.insync.replicas", "0", AlterConfigOpType.SET)], KafkaError.INVALID_CONFIG,
     "min.insync.replicas"),
])
def test_bad_changes_are_refused_with_kafkas_codes_and_nothing_applied(
        one_broker: BrokerThread, controller: ActingController,
        ops: list[tuple[str, str | None, Any]], code: int, text: str) -> None:
    topic = f"bad{abs(hash(str(ops))) % 10**6}"
    controller.create_topic(topic, {0: [1]}, config={"segment.bytes": "100000"})
    err = _error_of(lambda: _incremental(one_broker, topic, ops))
    assert err.code() == code and text in err.str(), err
    assert controller.zk.get_topic_config(topic) == {"segment.bytes": "100000"}


def test_unknown_topics_duplicates_and_broker_keys_are_refused(one_broker: BrokerThread) -> None:
    def alter(resource_type: int, name: str, configs: list[tuple[str, int, str | None]]) -> Any:
        req = m_iac.IncrementalAlterConfigsRequest(resources=[m_iac.AlterConfigsResource(
            resource_type, name, [m_iac.AlterableConfig(k, op, v) for k, op, v in configs])])
        return send(one_broker.port, req).responses[0]

    missing = alter(2, "never-created", [("retention.ms", 0, "1000")])
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    dup = alter(2, "never-created", [("retention.ms", 0, "1"), ("retention.ms", 1, None)])
    assert dup.error_code == ErrorCode.INVALID_REQUEST and "duplicate" in dup.error_message
    fixed = alter(4, "1", [("log.dirs", 0, "/elsewhere")])
    assert fixed.error_code == ErrorCode.INVALID_REQUEST
    assert "Cannot update these configs dynamically: Set(log.dirs)" in fixed.error_message
    bad = alter(4, "1", [("log.retention.ms", 0, "soon")])
    assert bad.error_code == ErrorCode.INVALID_REQUEST and "log.retention.ms" in bad.error_message
    policy = alter(4, "", [("log.cleanup.policy", 0, "shred")])
    assert policy.error_code == ErrorCode.INVALID_REQUEST
    other = alter(4, "7", [("log.retention.ms", 0, "1000")])
    assert other.error_code == ErrorCode.INVALID_REQUEST and "Unexpected broker id" in other.error_message


def test_dynamic_broker_defaults_apply_to_topics_without_overrides(
        one_broker: BrokerThread, controller: ActingController) -> None:
    def alter(name: str, configs: list[tuple[str, int, str | None]]) -> int:
        req = m_iac.IncrementalAlterConfigsRequest(resources=[m_iac.AlterConfigsResource(
            4, name, [m_iac.AlterableConfig(k, op, v) for k, op, v in configs])])
        return send(one_broker.port, req).responses[0].error_code

    controller.create_topic("dyn", {0: [1, 2]})  # broker 2 absent: ISR [1] of 2 replicas
    controller.create_topic("dyn-own", {0: [1, 2]}, config={"min.insync.replicas": "1"})
    assert _acks_all(one_broker, "dyn") == 0
    try:
        assert alter("", [("min.insync.replicas", 0, "2")]) == 0  # the cluster-wide default
        assert controller.zk.get_broker_config("<default>") == {"min.insync.replicas": "2"}
        wait_until(lambda: _log_config(one_broker, "dyn").min_insync_replicas == 2,
                   what="the new default applied")
        assert _acks_all(one_broker, "dyn") == ErrorCode.NOT_ENOUGH_REPLICAS
        assert _acks_all(one_broker, "dyn-own") == 0  # the topic's own value wins
        assert alter("1", [("log.retention.ms", 0, "3600000")]) == 0  # this broker only
        wait_until(lambda: _log_config(one_broker, "dyn").retention_ms == 3_600_000,
                   what="the per-broker value applied")
    finally:
        assert alter("", [("min.insync.replicas", 1, None)]) == 0
        assert alter("1", [("log.retention.ms", 1, None)]) == 0
    wait_until(lambda: (c := _log_config(one_broker, "dyn")).min_insync_replicas == 1
               and c.retention_ms == 7 * 24 * 3600 * 1000, what="both dynamic values removed")
    assert _acks_all(one_broker, "dyn") == 0


def test_each_config_change_notification_is_handed_out_once_in_order() -> None:
    from tidelog.broker.config_apis import ConfigChangeNotifications

    seen = ConfigChangeNotifications()
    assert seen.new(["config_change_0000000003", "config_change_0000000001"]) == []  # at start
    assert seen.new(["config_change_0000000003", "config_change_0000000005",
                     "config_change_0000000004"]) == ["config_change_0000000004",
                                                      "config_change_0000000005"]
    assert seen.new(["config_change_0000000005"]) == []
    assert seen.new([]) == []
    assert seen.new(["config_change_0000000006"]) == ["config_change_0000000006"]


def test_tidelog_configs_cli_on_broker_defaults(one_broker: BrokerThread) -> None:
    from click.testing import CliRunner

    from tidelog.cli.configs_cmd import configs

    bs = ("--bootstrap-server", f"127.0.0.1:{one_broker.port}")
    runner = CliRunner()
    out = runner.invoke(configs, ["alter", *bs, "--broker-defaults",
                                  "--add-config", "log.segment.bytes=2000000"])
    assert (out.exit_code, out.output) == (0, "Completed updating config for default brokers.\n")
    try:
        expected = ("Default configs for brokers in the cluster are:\n"
                    "  log.segment.bytes=2000000 sensitive=false "
                    "synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.segment.bytes=2000000}\n")
        # The broker describes what it has applied: the notification arrives first.
        wait_until(lambda: runner.invoke(configs, ["describe", *bs, "--broker-defaults"]).output
                   == expected, what="the default described")
        refused = runner.invoke(configs, ["alter", *bs, "--broker", "1",
                                          "--add-config", "log.dirs=/x"])
        assert refused.exit_code == 1 and "INVALID_REQUEST" in refused.output
    finally:
        runner.invoke(configs, ["alter", *bs, "--broker-defaults",
                                "--delete-config", "log.segment.bytes"])


def test_the_broker_purges_expired_config_change_notifications(
        one_broker: BrokerThread, controller: ActingController) -> None:
    """Kafka's ZkNodeChangeNotificationListener: after processing, notifications older than
    changeExpirationMs (15 min) are deleted. With the expiration at 0 every processed one is."""
    assert one_broker.server._config_changes.expiration_ms == 15 * 60 * 1000
    controller.create_topic("purged", {0: [1]})
    one_broker.server._config_changes.expiration_ms = 0
    _incremental(one_broker, "purged", [("retention.ms", "60000", AlterConfigOpType.SET)])
    wait_until(lambda: _log_config(one_broker, "purged").retention_ms == 60000,
               what="the change applied")
    wait_until(lambda: controller.zk.kazoo.get_children("/config/changes") == [],
               what="the notification purged")
    assert controller.zk.get_topic_config("purged") == {"retention.ms": "60000"}
