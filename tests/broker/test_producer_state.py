"""Idempotent producers end to end through a real broker: duplicates answered with their
original offsets, gaps and fenced epochs refused, and the same after a restart, where the state
comes back from the log's producer snapshots (storage/producer_state_manager.py, whose rules
tests/storage/test_producer_state_manager.py checks in detail)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from harness import (
    ActingController,
    BrokerThread,
    broker_props,
    fetch,
    produce,
    values_of,
)
from zk_chroot import new_chroot

from tidelog.cluster.zookeeper import ZooKeeperServer
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records.builder import build_values

PID = 4242


def batch(seq: int, n: int = 1, epoch: int = 0, pid: int = PID, tag: bytes = b"v") -> bytearray:
    # Timestamps of now: a producer idle for producer.id.expiration.ms (by its batches' max
    # timestamp, as Kafka) is not reloaded.
    return build_values([tag + str(seq + i).encode() for i in range(n)], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq, now_ms=int(time.time() * 1000))


# ---------------------------------------------------------------- through a broker


@pytest.mark.integration
def test_duplicates_gaps_and_fencing_over_the_wire_and_after_restart(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    zk = new_chroot(zookeeper)
    props = broker_props(1, zk, tmp_path / "b1")
    b = BrokerThread(props).start()
    ctl = ActingController(zk, [b])
    try:
        ctl.create_topic("idem", {0: [1]})
        port = b.port
        assert produce(port, "idem", 0, batch(0, 3)) == (0, 0)
        # A retry of the same batch is answered with its original offset, not written again.
        assert produce(port, "idem", 0, batch(0, 3)) == (0, 0)
        assert produce(port, "idem", 0, batch(3, 2), acks=1) == (0, 3)
        assert produce(port, "idem", 0, batch(9))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert b.partition("idem", 0).log_end_offset == 5
        assert produce(port, "idem", 0, batch(0, epoch=1)) == (0, 5)
        assert produce(port, "idem", 0, batch(5, epoch=0))[0] == ErrorCode.INVALID_PRODUCER_EPOCH
        # Another producer is independent.
        assert produce(port, "idem", 0, batch(7, pid=77)) == (0, 6)
    finally:
        b.stop()
        ctl.close()
    # Restart on the same log dir: the clean shutdown left a producer snapshot at the log end,
    # and the state comes back from it without reading the log.
    log_dir = Path(props["log.dirs"]) / "idem-0"
    assert (log_dir / "00000000000000000007.snapshot").exists()
    b = BrokerThread(props).start()
    ctl = ActingController(zk, [b])
    try:
        ctl.states[("idem", 0)] = {"leader": 1, "leader_epoch": 0, "isr": [1], "zk_version": 0, "replicas": [1]}
        ctl.topic_ids["idem"] = __import__("uuid").uuid4()
        ctl.send_leader_and_isr("idem", [0])
        ctl.send_update_metadata()
        assert b.partition("idem", 0).log.producer_state_manager.batches_loaded == 0
        assert produce(b.port, "idem", 0, batch(0, epoch=1)) == (0, 5)
        assert produce(b.port, "idem", 0, batch(1, epoch=1)) == (0, 7)
        assert produce(b.port, "idem", 0, batch(3, 2)) [0] == ErrorCode.INVALID_PRODUCER_EPOCH
        data = fetch(b.port, "idem", 0, 0)
        assert values_of(data.records) == [b"v0", b"v1", b"v2", b"v3", b"v4", b"v0", b"v7", b"v1"]
    finally:
        b.stop()
        ctl.close()
