"""Idempotent producers: Kafka's sequence rules per producer id and epoch, checked in the pure
`ProducerStateManager` and end to end through a real broker, including after a restart (the
state is rebuilt from the log's batch headers)."""

from __future__ import annotations

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

from tidelog.broker.producer_state import (
    NUM_BATCHES_TO_RETAIN,
    ProducerStateManager,
    SequenceCheck,
    batch_producer_info,
)
from tidelog.cluster.zookeeper import ZooKeeperServer
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import build_values

PID = 4242


def batch(seq: int, n: int = 1, epoch: int = 0, pid: int = PID, tag: bytes = b"v") -> bytearray:
    return build_values([tag + str(seq + i).encode() for i in range(n)], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq)


# ---------------------------------------------------------------- the pure state


def test_sequence_rules() -> None:
    st = ProducerStateManager()
    info = batch_producer_info(batch(0, 3))
    assert info is not None and (info.first_seq, info.last_seq) == (0, 2)
    assert st.check_batch(info) == (SequenceCheck.OK, None)  # unknown producer: accepted
    st.update(info, first_offset=10)
    check, dup = st.check_batch(info)
    assert check == SequenceCheck.DUPLICATE and dup is not None
    assert (dup.first_offset, dup.last_offset) == (10, 12)
    assert st.check_batch(batch_producer_info(batch(3)))[0] == SequenceCheck.OK
    assert st.check_batch(batch_producer_info(batch(4)))[0] == SequenceCheck.OUT_OF_ORDER
    assert st.check_batch(batch_producer_info(batch(1)))[0] == SequenceCheck.OUT_OF_ORDER
    # A new epoch must start at 0; an older epoch is fenced.
    assert st.check_batch(batch_producer_info(batch(5, epoch=1)))[0] == SequenceCheck.OUT_OF_ORDER
    st.update(batch_producer_info(batch(0, epoch=1)), first_offset=13)
    assert st.check_batch(batch_producer_info(batch(3, epoch=0)))[0] == SequenceCheck.INVALID_EPOCH
    assert batch_producer_info(build_values([b"no producer"])) is None


def test_only_the_last_five_batches_are_remembered() -> None:
    st = ProducerStateManager()
    for i in range(NUM_BATCHES_TO_RETAIN + 2):
        st.update(batch_producer_info(batch(i)), first_offset=i)
    assert st.check_batch(batch_producer_info(batch(0)))[0] == SequenceCheck.OUT_OF_ORDER
    assert st.check_batch(batch_producer_info(batch(2)))[0] == SequenceCheck.DUPLICATE


def test_sequence_wraps_at_int_max() -> None:
    st = ProducerStateManager()
    top = batch_producer_info(batch(2**31 - 2, n=2))
    assert top is not None and top.last_seq == 2**31 - 1
    st.update(top, first_offset=0)
    assert st.check_batch(batch_producer_info(batch(0)))[0] == SequenceCheck.OK


def test_rebuild_from_log_batches() -> None:
    log = bytearray()
    for offset, b in ((0, batch(0, 2)), (2, batch(2, 1)), (3, build_values([b"plain"]))):
        b[0:8] = offset.to_bytes(8, "big")
        log += b
    st = ProducerStateManager()
    assert st.rebuild_from_log(iter_batches(bytes(log))) == 3
    check, dup = st.check_batch(batch_producer_info(batch(2, 1)))
    assert check == SequenceCheck.DUPLICATE and dup is not None and dup.first_offset == 2
    assert st.check_batch(batch_producer_info(batch(3)))[0] == SequenceCheck.OK


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
    # Restart on the same log dir: the state comes back from the log's batch headers.
    b = BrokerThread(props).start()
    ctl = ActingController(zk, [b])
    try:
        ctl.states[("idem", 0)] = {"leader": 1, "leader_epoch": 0, "isr": [1], "zk_version": 0, "replicas": [1]}
        ctl.topic_ids["idem"] = __import__("uuid").uuid4()
        ctl.send_leader_and_isr("idem", [0])
        ctl.send_update_metadata()
        assert produce(b.port, "idem", 0, batch(0, epoch=1)) == (0, 5)
        assert produce(b.port, "idem", 0, batch(1, epoch=1)) == (0, 7)
        assert produce(b.port, "idem", 0, batch(3, 2)) [0] == ErrorCode.INVALID_PRODUCER_EPOCH
        data = fetch(b.port, "idem", 0, 0)
        assert values_of(data.records) == [b"v0", b"v1", b"v2", b"v3", b"v4", b"v0", b"v7", b"v1"]
    finally:
        b.stop()
        ctl.close()


def test_follower_updates_and_truncation() -> None:
    st = ProducerStateManager()
    buf = bytearray()
    for offset, b in ((0, batch(0, 2)), (2, batch(2, 2)), (4, batch(4, 1))):
        b[0:8] = offset.to_bytes(8, "big")
        buf += b
    # Only the batches the append covered are recorded.
    st.update_from_batches(iter_batches(bytes(buf)), first_offset=2, last_offset=3)
    assert [(m.first_seq, m.first_offset) for m in st.producers[PID].batches] == [(2, 2)]
    st.update_from_batches(iter_batches(bytes(buf)), first_offset=4, last_offset=4)
    assert st.check_batch(batch_producer_info(batch(4)))[0] == SequenceCheck.DUPLICATE
    st.truncate(4)  # the batch at offset 4 is gone: its retry is new again
    assert st.check_batch(batch_producer_info(batch(4)))[0] == SequenceCheck.OK
    st.truncate(0)
    assert len(st) == 0
