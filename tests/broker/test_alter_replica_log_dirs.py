"""AlterReplicaLogDirs on a real broker with two log dirs (JBOD): a replica moves to the other
dir while an acks=all producer writes to it, DescribeLogDirs shows the future log while it
copies, every acknowledged record is read back afterwards (also after a restart), and bad
requests get Kafka's error codes."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from harness import BrokerThread, broker_props, send, wait_until
from zk_chroot import new_chroot

from tidelog.controller.controller import KafkaController
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import alter_replica_log_dirs as m_arld
from tidelog.protocol.messages import describe_log_dirs as m_dld

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

pytestmark = pytest.mark.integration


def alter(port: int, path: str, topic: str, partition: int = 0,
          version: int | None = None) -> int:
    resp = send(port, m_arld.AlterReplicaLogDirsRequest(dirs=[m_arld.AlterReplicaLogDir(
        path=path, topics=[m_arld.AlterReplicaLogDirTopic(topic, [partition])])]), version)
    ((result,),) = [t.partitions for t in resp.results]
    return int(result.error_code)


def where(port: int, topic: str) -> list[tuple[str, bool, int]]:
    """(log dir, is future, offset lag) of each log of the topic's partition 0."""
    resp = send(port, m_dld.DescribeLogDirsRequest(
        topics=[m_dld.DescribableLogDirTopic(topic, [0])]), 1)
    return sorted((r.log_dir, p.is_future_key, p.offset_lag) for r in resp.results
                  for t in r.topics for p in t.partitions)


def test_a_replica_moves_between_log_dirs_under_an_acks_all_stream(
        zookeeper: Any, tmp_path: Path) -> None:
    d1, d2 = (tmp_path / "d1").resolve(), (tmp_path / "d2").resolve()
    props = broker_props(1, new_chroot(zookeeper), d1, **{
        "log.dirs": f"{d1},{d2}", "offsets.topic.replication.factor": "1",
        "log.segment.bytes": "65536"})
    b = BrokerThread(props, controller_factory=KafkaController).start()
    try:
        # librdkafka asks the controller its first metadata answer names (none before the
        # controller's first UpdateMetadata): a barrier before the AdminClient.
        wait_until(lambda: b.call(lambda: b.server.metadata_cache.controller_id) == 1,
                   timeout_s=30, what="the controller known")
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic("jbod", 1, 1)], operation_timeout=20)["jbod"].result(30)
        wait_until(lambda: b.partition("jbod", 0) is not None, what="the replica")
        ((start_dir, _, _),) = where(b.port, "jbod")
        target = str(d2) if start_dir == str(d1) else str(d1)

        acked: list[bytes] = []
        stop = threading.Event()
        p = confluent_kafka.Producer({"bootstrap.servers": b.bootstrap, "acks": "all",
                                      "linger.ms": 2})

        def stream() -> None:
            for i in range(20_000):  # bounded; stopped once the move is done
                if stop.is_set():
                    break
                p.produce("jbod", b"r%06d" % i + b"." * 200, partition=0,
                          on_delivery=lambda e, m: acked.append(m.value()) if e is None
                          else None)
                p.poll(0)
                if i % 50 == 0:
                    time.sleep(0.005)
            p.flush(60)

        writer = threading.Thread(target=stream)
        writer.start()
        wait_until(lambda: len(acked) > 2000, timeout_s=60, what="records before the move")
        # The swap is held (as while a cleaner pass holds the log) so that the future log is
        # seen whatever the copy's speed.
        moves = b.call(lambda: b.server.replica_manager.shell.alter_log_dirs_manager)
        may_swap = moves.may_swap
        b.call(lambda: setattr(moves, "may_swap", lambda tp: False))
        assert alter(b.port, target, "jbod") == ErrorCode.NONE
        seen_future = wait_until(lambda: [e for e in where(b.port, "jbod") if e[1]],
                                 timeout_s=30, what="the future log")
        assert seen_future[0][0] == target and seen_future[0][2] >= 0
        b.call(lambda: setattr(moves, "may_swap", may_swap))
        wait_until(lambda: [e[:2] for e in where(b.port, "jbod")] == [(target, False)],
                   timeout_s=120, what="the move to finish")
        stop.set()
        writer.join(90)
        assert not writer.is_alive()
        assert "jbod-0" not in os.listdir(start_dir) and "jbod-0" in os.listdir(target)

        def consume_all() -> list[bytes]:
            c = confluent_kafka.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "chk",
                                          "auto.offset.reset": "earliest"})
            c.assign([confluent_kafka.TopicPartition("jbod", 0, 0)])
            out: list[bytes] = []
            deadline = time.monotonic() + 60
            while len(out) < len(acked) and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is not None and m.error() is None:
                    out.append(m.value())
            c.close()
            return out

        assert consume_all() == acked  # every acknowledged record, once, in order
        assert b.call(lambda: moves.swaps) == 1

        # Bad requests: Kafka's codes, nothing changes.
        assert alter(b.port, str(tmp_path / "nowhere"), "jbod") == ErrorCode.LOG_DIR_NOT_FOUND
        assert alter(b.port, target, "no-such-topic") == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert alter(b.port, target, "jbod", 5) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert alter(b.port, start_dir, "jbod", version=0) == ErrorCode.NONE  # v0 too
        b.stop()
        b = BrokerThread(props, controller_factory=KafkaController).start()
        wait_until(lambda: b.partition("jbod", 0) is not None, what="the replica after restart")
        wait_until(lambda: [e[:2] for e in where(b.port, "jbod")] == [(start_dir, False)],
                   timeout_s=60, what="the move back, resumed after the restart if cut short")
        assert consume_all() == acked
    finally:
        b.stop()
