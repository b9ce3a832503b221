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
from tidelog.replication.replication_quota import ReplicationQuotaManager

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
        # The copy is held (its replica.alter.log.dirs quota used up) so that the future log
        # is seen whatever the copy's speed; with the broker's own quota back, it finishes.
        moves = b.call(lambda: b.server.replica_manager.shell.alter_log_dirs_manager)
        quota = moves.quota
        held = ReplicationQuotaManager(bound=1)
        b.call(lambda: (held.record(1 << 30, moves.time.milliseconds()),
                        setattr(moves, "quota", held)))
        assert alter(b.port, target, "jbod") == ErrorCode.NONE
        seen_future = wait_until(lambda: [e for e in where(b.port, "jbod") if e[1]],
                                 timeout_s=30, what="the future log")
        assert seen_future[0][0] == target and seen_future[0][2] >= 0
        b.call(lambda: setattr(moves, "quota", quota))
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


def test_a_replica_moved_to_another_broker_is_created_in_the_dir_the_plan_names(
        zookeeper: Any, tmp_path: Path) -> None:
    """A replica moving to another broker with a plan naming that broker's second log dir: the
    broker answers REPLICA_NOT_AVAILABLE until the reassignment creates the replica, which it
    does in that dir (Kafka's preferred log dir), not in the dir it would pick;
    `tidelog reassign execute` and verify report it."""
    from click.testing import CliRunner

    from tidelog.cli.reassign_cmd import reassign

    chroot = new_chroot(zookeeper)
    brokers = []
    for i in (1, 2):
        a, b2 = (tmp_path / f"b{i}a").resolve(), (tmp_path / f"b{i}b").resolve()
        brokers.append(BrokerThread(broker_props(i, chroot, a, **{
            "log.dirs": f"{a},{b2}", "offsets.topic.replication.factor": "1"}),
            controller_factory=KafkaController).start())
    try:
        for b in brokers:
            wait_until(lambda b=b: b.call(lambda: b.server.metadata_cache.controller_id)
                       in (1, 2) and len(b.call(
                           lambda: b.server.metadata_cache.alive_broker_ids())) == 2,
                       timeout_s=30, what="both brokers and the controller known")
        admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
        admin.create_topics([NewTopic("across", 1, 1)], operation_timeout=20)["across"].result(30)
        host = wait_until(lambda: next((b for b in brokers if b.partition("across", 0)
                                        is not None), None), what="the replica")
        other = next(b for b in brokers if b is not host)
        # The other broker holds no log: left alone it would put one in its first dir.
        target = str((tmp_path / f"b{other.broker_id}b").resolve())
        plan = tmp_path / "plan.json"
        plan.write_text('{"version":1,"partitions":[{"topic":"across","partition":0,'
                        f'"replicas":[{other.broker_id}],"log_dirs":["{target}"]}}]}}')
        # Kafka 3.9's tool sends the move after the reassignment, so the replica may be created
        # before it arrives and then moved; asked first (as Kafka's older tool did), the broker
        # remembers the dir and creates the replica there.
        assert alter(other.port, target, "across") == ErrorCode.REPLICA_NOT_AVAILABLE
        run = CliRunner()
        bootstrap = brokers[0].bootstrap
        out = run.invoke(reassign, ["execute", "--bootstrap-server", bootstrap,
                                    "--reassignment-json-file", str(plan)])
        assert out.exit_code == 0, out.output
        assert (f"Successfully started moving log directory to {target} for replica across-0 "
                f"with broker {other.broker_id} ") in out.output
        verified = wait_until(lambda: (v := run.invoke(reassign, [
            "verify", "--bootstrap-server", bootstrap, "--reassignment-json-file", str(plan)]))
            and "Reassignment of partition across-0 is completed." in v.output and v,
            timeout_s=60, what="the move")
        assert (f"Reassignment of replica across-0-{other.broker_id} completed successfully."
                in verified.output)
        assert [e[:2] for e in where(other.port, "across")] == [(target, False)]
        # Created there, not created elsewhere and then moved.
        assert other.call(
            lambda: other.server.replica_manager.shell.alter_log_dirs_manager.swaps) == 0
        assert not any(n.startswith("across-0")
                       for n in os.listdir(tmp_path / f"b{other.broker_id}a"))
    finally:
        for b in brokers:
            b.stop()
