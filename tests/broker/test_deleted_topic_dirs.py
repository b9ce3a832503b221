"""A deleted topic's logs, as Kafka's LogManager.asyncDelete handles them: each partition dir is
renamed `<topic>-<partition>.<uuid>-delete` at once and removed log.segment.delete.delay.ms
later (kafka-delete-logs); a restart in between queues it again, removed that long after the
start (Kafka's loadLog puts it in logsToBeDeleted); the topic created again
under the same name meanwhile gets a new, empty log beside the retired one."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from harness import BrokerThread, broker_props, wait_until
from kazoo.client import KazooClient
from zk_chroot import new_chroot

from tidelog.controller.controller import KafkaController

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

pytestmark = pytest.mark.integration


def start(zk: str, log_dir: Path, delete_delay_ms: int) -> BrokerThread:
    broker = BrokerThread(broker_props(
        1, zk, log_dir, **{"log.segment.delete.delay.ms": delete_delay_ms,
                           "log.initial.task.delay.ms": 0,
                           "offsets.topic.replication.factor": 1}),
        controller_factory=KafkaController).start()
    # librdkafka's AdminClient looks the controller up in its first metadata answers only: one
    # naming none (controller -1 until the controller's first UpdateMetadata, which comes
    # after the broker starts, later under load) left create_topics waiting past its 30 s.
    wait_until(lambda: broker.call(lambda: broker.server.metadata_cache.controller_id) == 1,
               timeout_s=60, what="the broker's metadata to name its controller")
    return broker


@pytest.fixture
def zk(zookeeper: Any) -> str:
    return new_chroot(zookeeper)


def entries(log_dir: Path, topic: str) -> list[str]:
    return sorted(n for n in os.listdir(log_dir) if n.startswith(f"{topic}-0"))


def create(admin: AdminClient, topic: str) -> None:
    """Create the topic; TOPIC_ALREADY_EXISTS while its deletion finishes is asked again."""
    def created() -> bool:
        try:
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        except confluent_kafka.KafkaException as e:
            if e.args[0].code() != confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            return False
        return True

    wait_until(created, timeout_s=30, interval_s=0.2, what=f"{topic} created")


def delete(admin: AdminClient, topic: str) -> None:
    admin.delete_topics([topic])[topic].result(30)


def deletion_completed(zk: str, topic: str) -> bool:
    """The controller has finished deleting the topic: its znodes are gone (Kafka's
    TopicDeletionManager.completeDeleteTopic, after every replica's StopReplica answer)."""
    client = KazooClient(hosts=zk, timeout=10.0)
    client.start(timeout=15)
    try:
        return client.exists(f"/brokers/topics/{topic}") is None \
            and client.exists(f"/admin/delete_topics/{topic}") is None
    finally:
        client.stop()
        client.close()


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0


def read_all(bootstrap: str, topic: str, n: int) -> list[bytes]:
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                                  "auto.offset.reset": "earliest"})
    c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    try:
        for _ in range(100):
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
            if len(got) >= n:
                break
    finally:
        c.close()
    return got


def test_a_deleted_topics_dir_is_retired_at_once_and_removed_after_the_delay(
        zk: str, tmp_path: Path) -> None:
    broker = start(zk, tmp_path, delete_delay_ms=3000)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    try:
        create(admin, "gone")
        produce(broker.bootstrap, "gone", [b"old-1", b"old-2"])
        delete(admin, "gone")
        (retired,) = wait_until(lambda: [n for n in entries(tmp_path, "gone")
                                         if n.endswith("-delete")], what="the retired dir")
        assert retired.startswith("gone-0.") and entries(tmp_path, "gone") == [retired]
        # Created again while the retired dir is still there: a new, empty log.
        create(admin, "gone")
        produce(broker.bootstrap, "gone", [b"new-1"])
        assert entries(tmp_path, "gone") == ["gone-0", retired]
        assert read_all(broker.bootstrap, "gone", 1) == [b"new-1"]
        wait_until(lambda: entries(tmp_path, "gone") == ["gone-0"], timeout_s=30,
                   what="the retired dir removed after log.segment.delete.delay.ms")
        assert read_all(broker.bootstrap, "gone", 1) == [b"new-1"]
    finally:
        broker.stop()


def test_a_retired_dir_found_at_a_restart_waits_its_delay_again(zk: str, tmp_path: Path) -> None:
    broker = start(zk, tmp_path, delete_delay_ms=600_000)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        create(admin, "bounced")
        produce(broker.bootstrap, "bounced", [b"x"])
        delete(admin, "bounced")
        wait_until(lambda: [n for n in entries(tmp_path, "bounced") if n.endswith("-delete")],
                   what="the retired dir")
        # The broker retires the dir at StopReplica, before the controller ends the deletion:
        # stopped in between, the next controller resumes it and leads the partition again
        # (a new bounced-0) until its StopReplica comes.
        wait_until(lambda: deletion_completed(zk, "bounced"), timeout_s=30,
                   interval_s=0.2, what="the deletion completed")
    finally:
        broker.stop()
    (retired,) = [n for n in entries(tmp_path, "bounced") if n.endswith("-delete")]
    # Kafka's loadLog: queued for kafka-delete-logs with the start's time, not removed.
    before_ms = int(time.time() * 1000)
    again = start(zk, tmp_path, delete_delay_ms=600_000)
    try:
        after_ms = int(time.time() * 1000)
        queued = again.call(lambda: list(again.server.log_manager.logs_to_be_deleted))
        assert retired in entries(tmp_path, "bounced")
        (due_ms,) = [t for t, p in queued if p.endswith(retired)]
        assert before_ms + 600_000 <= due_ms <= after_ms + 600_000
    finally:
        again.stop()
