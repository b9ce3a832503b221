"""BrokerServer life cycle and `tidelog server`: registration and broker epochs, HW checkpoints
and the clean-shutdown marker across restarts, generated broker ids, the controller hook (with
tidelog's real controller), controlled shutdown, and the command line (config errors, SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness import (
    ActingController,
    BrokerThread,
    broker_props,
    fetch,
    produce,
    send,
    wait_until,
)
from zk_chroot import new_chroot

from tidelog.cluster.zookeeper import ZooKeeperServer, pick_free_port
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import controlled_shutdown as m_cs
from tidelog.protocol.messages import create_topics as m_ct
from tidelog.protocol.records.builder import build_values
from tidelog.storage.checkpoint import OffsetCheckpointFile
from tidelog.storage.file_io import OsFileIO
from tidelog.storage.log_manager import CLEAN_SHUTDOWN_FILE

pytestmark = pytest.mark.integration


def _hw_checkpoint(log_dir: Path) -> dict:
    return OffsetCheckpointFile.in_dir(OsFileIO(), str(log_dir), "replication-offset-checkpoint").read()


def test_registration_checkpoints_and_restart(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    zk = new_chroot(zookeeper)
    log_dir = tmp_path / "b1"
    props = broker_props(1, zk, log_dir, **{"replica.high.watermark.checkpoint.interval.ms": 100})
    b = BrokerThread(props).start()
    ctl = ActingController(zk, [b])
    try:
        info = ctl.zk.get_broker(1)
        assert info is not None
        registration, epoch = info
        assert epoch == b.server.broker_epoch > 0
        assert registration.endpoint("PLAINTEXT").port == b.port  # port 0 -> the bound port
        ctl.create_topic("ck", {0: [1]})
        assert produce(b.port, "ck", 0, build_values([b"1", b"2", b"3"])) == (0, 0)
        # The highwatermark-checkpoint task writes the HW while the broker runs.
        wait_until(lambda: _hw_checkpoint(log_dir).get(("ck", 0)) == 3, timeout_s=5,
                   what="HW checkpoint")
        assert not (log_dir / CLEAN_SHUTDOWN_FILE).exists()
    finally:
        b.stop()
    assert (log_dir / CLEAN_SHUTDOWN_FILE).exists()
    assert ctl.zk.get_broker(1) is None  # deregistered
    b = BrokerThread(props).start()
    try:
        assert b.server.broker_epoch > epoch  # a new registration, a larger epoch
        log = b.call(lambda: b.server.log_manager.get_log("ck", 0))
        assert log.log_end_offset == 3 and log.high_watermark == 3
        ctl.brokers = {1: b}
        ctl.send_leader_and_isr("ck", [0])
        ctl.send_update_metadata()
        assert produce(b.port, "ck", 0, build_values([b"4"])) == (0, 3)
        assert fetch(b.port, "ck", 0, 0).high_watermark == 4
    finally:
        b.stop()
        ctl.close()


def test_registration_says_whether_the_last_shutdown_was_clean(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    """KIP-966: the controller must know a broker that may have lost its unflushed tail."""
    zk = new_chroot(zookeeper)
    log_dir = tmp_path / "b1"
    props = broker_props(1, zk, log_dir)
    b = BrokerThread(props).start()
    ctl = ActingController(zk, [b])
    try:
        assert ctl.zk.get_broker(1)[0].clean_shutdown is True  # empty log dirs: nothing to lose
        ctl.create_topic("cs", {0: [1]})
        assert produce(b.port, "cs", 0, build_values([b"1"])) == (0, 0)
    finally:
        b.stop()
    b = BrokerThread(props).start()  # after a clean shutdown
    try:
        assert ctl.zk.get_broker(1)[0].clean_shutdown is True
    finally:
        b.stop()
    (log_dir / CLEAN_SHUTDOWN_FILE).unlink()  # as after kill -9: no marker
    b = BrokerThread(props).start()
    try:
        assert ctl.zk.get_broker(1)[0].clean_shutdown is False
    finally:
        b.stop()
        ctl.close()


def test_generated_broker_id(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    zk = new_chroot(zookeeper)
    b = BrokerThread(broker_props(-1, zk, tmp_path / "gen")).start()
    try:
        assert b.broker_id > 1000  # reserved.broker.max.id + /brokers/seqid's version
    finally:
        b.stop()


def test_with_the_real_controller(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    """The controller factory hook with tidelog's KafkaController: CreateTopics is answered once
    the controller has elected leaders and sent LeaderAndIsr/UpdateMetadata over the wire;
    ControlledShutdown is routed to it; shutdown runs the controlled shutdown."""
    controller_mod = pytest.importorskip("tidelog.controller.controller")
    zk = new_chroot(zookeeper)
    props = broker_props(1, zk, tmp_path / "c1", **{"controlled.shutdown.enable": "true",
                                                    "controlled.shutdown.retry.backoff.ms": 100})
    b = BrokerThread(props, controller_factory=controller_mod.KafkaController).start()
    try:
        wait_until(lambda: getattr(b.server.controller, "is_active", False), what="controller elected")
        resp = send(b.port, m_ct.CreateTopicsRequest(
            topics=[m_ct.CreatableTopic("via-controller", 2, 1)], timeout_ms=10000))
        assert resp.topics[0].error_code == 0
        for p in (0, 1):
            assert produce(b.port, "via-controller", p, build_values([b"x"]), acks=-1) == (0, 0)
        # Metadata auto-creation goes through ZooKeeper; the controller elects the leader.
        from tidelog.protocol.messages import delete_topics as m_dt
        from tidelog.protocol.messages import metadata as m_md

        def auto_meta() -> bool:
            r = send(b.port, m_md.MetadataRequest(topics=[m_md.MetadataRequestTopic(name="auto")]))
            return r.topics[0].error_code == 0 and r.topics[0].partitions[0].leader_id == 1
        wait_until(auto_meta, what="auto-created topic with a leader")
        assert produce(b.port, "auto", 0, build_values([b"y"]), acks=-1) == (0, 0)
        # Deletion: the controller sends StopReplica(delete) and UpdateMetadata; DeleteTopics
        # answers once this broker's metadata no longer has the topic.
        log_dir = b.call(lambda: b.server.log_manager.get_log("auto", 0).dir)
        resp = send(b.port, m_dt.DeleteTopicsRequest(topic_names=["auto"], timeout_ms=10000), 5)
        assert resp.responses[0].error_code == 0
        wait_until(lambda: not os.path.isdir(log_dir), what="log deleted")
        cs = send(b.port, m_cs.ControlledShutdownRequest(broker_id=1, broker_epoch=b.server.broker_epoch))
        assert cs.error_code == 0 and cs.remaining_partitions == []
        assert b.run(b.server.controlled_shutdown())
    finally:
        b.stop()


# ---------------------------------------------------------------- the command line


def _tidelog(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidelog", *args], capture_output=True, text=True,
                          timeout=60, **kwargs)  # type: ignore[call-overload]


def test_server_command_config_errors_are_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "server.properties"
    cfg.write_text("broker.id=1\nzookeeper.connect=127.0.0.1:1\nlog.dirs=/tmp/x\nno.such.key=1\n")
    r = _tidelog("server", str(cfg))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["error: no.such.key: unknown configuration key"]
    cfg.write_text("broker.id=1\nlog.dirs=/tmp/x\n")
    r = _tidelog("server", str(cfg))
    assert r.returncode == 1 and "zookeeper.connect" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _tidelog("server", str(cfg), "--override", "num.partitions=zero")
    assert r.returncode == 1 and r.stderr.startswith("error: num.partitions:")
    r = _tidelog("server", str(tmp_path / "missing.properties"))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    cfg.write_text(f"broker.id=1\nzookeeper.connect=127.0.0.1:1\nlog.dirs={tmp_path}/d,{tmp_path}/d/\n")
    r = _tidelog("server", str(cfg))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"error: Duplicate log directory found: {tmp_path}/d, {tmp_path}/d"]


def test_server_command_runs_and_stops_on_sigterm(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    zk = new_chroot(zookeeper)
    cfg = tmp_path / "server.properties"
    log_dir = tmp_path / "data"
    cfg.write_text(f"broker.id=5\nzookeeper.connect={zk}\nlog.dirs={log_dir}\n"
                   "listeners=PLAINTEXT://127.0.0.1:0\n")
    proc = subprocess.Popen([sys.executable, "-m", "tidelog", "server", str(cfg),
                             "--override", "controlled.shutdown.enable=false"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    zkc = KafkaZkClient(zk).start()
    try:
        wait_until(lambda: zkc.get_broker(5) is not None, timeout_s=30, what="registration")
        port = zkc.get_broker(5)[0].endpoint("PLAINTEXT").port
        assert port > 0
        from tidelog.protocol.messages.api_versions import ApiVersionsRequest
        assert send(port, ApiVersionsRequest()).error_code == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert (log_dir / CLEAN_SHUTDOWN_FILE).exists()
        assert zkc.get_broker(5) is None
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        zkc.close()
    _, err = proc.communicate(timeout=5)
    assert "started on port" in err


def test_several_listeners_each_advertise_their_own_port(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    from tidelog.protocol.messages import metadata as m_md

    zk = new_chroot(zookeeper)
    props = broker_props(3, zk, tmp_path / "ml", **{
        "listeners": "PLAINTEXT://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
    })
    b = BrokerThread(props).start()
    zkc = KafkaZkClient(zk).start()
    try:
        internal, external = b.server.bound_ports["PLAINTEXT"], b.server.bound_ports["EXTERNAL"]
        assert internal != external and b.port == internal
        registration = zkc.get_broker(3)[0]
        assert registration.endpoint("EXTERNAL").port == external
        assert registration.endpoint("PLAINTEXT").port == internal
        for port in (internal, external):
            resp = send(port, m_md.MetadataRequest(topics=[]))
            assert [(x.node_id, x.port) for x in resp.brokers] == [(3, port)]
    finally:
        zkc.close()
        b.stop()


def test_zookeeper_session_expiry_re_registers_with_a_new_epoch(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    """After its session expires, the broker registers again (Kafka's session-expiration
    handler): a new, larger broker epoch, which requests from the controller must carry."""
    from kazoo.client import KazooClient

    zk = new_chroot(zookeeper)
    b = BrokerThread(broker_props(1, zk, tmp_path / "exp")).start()
    zkc = KafkaZkClient(zk).start()
    try:
        old_epoch = b.server.broker_epoch
        session_id, password = b.server.zk_client.kazoo.client_id
        # The classic way to expire a session: another client joins it and closes it.
        other = KazooClient(hosts=zookeeper.connect_string, client_id=(session_id, password))
        other.start(timeout=15)
        other.stop()
        other.close()
        wait_until(lambda: b.server.broker_epoch > old_epoch, timeout_s=30, what="new broker epoch")
        registered = wait_until(lambda: zkc.get_broker(1), what="re-registration")
        assert registered[1] == b.server.broker_epoch
        ctl = ActingController(zk, [b])
        try:
            # A request carrying the old epoch is now refused; the new one is accepted.
            ctl.states[("exp", 0)] = {"leader": 1, "leader_epoch": 0, "isr": [1], "zk_version": 0, "replicas": [1]}
            ctl.topic_ids["exp"] = __import__("uuid").uuid4()
            assert ctl.send_leader_and_isr("exp", [0], broker_epoch=old_epoch)[1].error_code == ErrorCode.STALE_BROKER_EPOCH
            assert ctl.send_leader_and_isr("exp", [0])[1].error_code == 0
        finally:
            ctl.close()
    finally:
        zkc.close()
        b.stop()


def test_startup_failures_are_clear(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    zk = new_chroot(zookeeper)
    b = BrokerThread(broker_props(1, zk, tmp_path / "one")).start()
    try:
        twin = BrokerThread(broker_props(1, zk, tmp_path / "twin"))
        with pytest.raises(Exception, match="already registered"):
            twin.start()
        twin.stop()
        blocked = tmp_path / "a-file"
        blocked.write_text("not a directory")
        bad = BrokerThread(broker_props(2, zk, blocked))
        with pytest.raises(RuntimeError, match="no usable log directory"):
            bad.start()
        bad.stop()
    finally:
        b.stop()
    cfg = tmp_path / "nozk.properties"
    cfg.write_text(f"broker.id=1\nzookeeper.connect=127.0.0.1:{pick_free_port()}\n"
                   f"zookeeper.connection.timeout.ms=1000\nlog.dirs={tmp_path / 'nozk'}\n"
                   "listeners=PLAINTEXT://127.0.0.1:0\n")
    r = _tidelog("server", str(cfg), "--log-level", "ERROR")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("error: broker startup failed: could not connect to ZooKeeper")


def test_log_retention_task_deletes_old_segments(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    from tidelog.protocol.messages import list_offsets as m_lo
    from tidelog.protocol.records.builder import Record, build_batch

    zk = new_chroot(zookeeper)
    b = BrokerThread(broker_props(1, zk, tmp_path / "ret",
                                  **{"log.retention.check.interval.ms": 100,
                                     "log.initial.task.delay.ms": 0})).start()
    ctl = ActingController(zk, [b])
    try:
        ctl.create_topic("ret", {0: [1]}, config={"segment.bytes": "1000", "retention.ms": "60000"})
        for i in range(4):  # records from 1970: older than any retention; ~700 B rolls a segment
            batch = build_batch([Record(value=b"%d" % i * 700, timestamp=1000 + i)])
            assert produce(b.port, "ret", 0, batch, acks=1) == (0, i)

        def earliest() -> int:
            req = m_lo.ListOffsetsRequest(replica_id=-1, topics=[m_lo.ListOffsetsTopic(
                "ret", [m_lo.ListOffsetsPartition(partition_index=0, timestamp=-2)])])
            return send(b.port, req).topics[0].partitions[0].offset

        # Every segment is older than retention.ms: all go, the active one too (Kafka rolls a
        # new, empty segment first), so the log starts at its end.
        wait_until(lambda: earliest() == 4, timeout_s=10, what="retention")
        assert fetch(b.port, "ret", 0, 0).error_code == 1  # OFFSET_OUT_OF_RANGE
    finally:
        b.stop()
        ctl.close()
