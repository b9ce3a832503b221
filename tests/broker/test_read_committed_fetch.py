"""A real broker answers READ_COMMITTED consumers (KIP-98): Fetch stops at the last stable
offset and lists the aborted transactions of what it returns, ListOffsets' latest offset is the
LSO; READ_UNCOMMITTED consumers still read to the HW."""

from __future__ import annotations

from typing import Any

from harness import ActingController, BrokerThread, fetch, produce, send, values_of

from tidelog.protocol.messages import describe_producers as m_dp
from tidelog.protocol.messages import list_offsets as m_lo
from tidelog.protocol.records.builder import Record, build_batch, build_end_transaction_marker
from tidelog.replication.types import TopicPartition
from tidelog.storage.transactions import AppendOrigin


def txn(pid: int, *values: bytes, seq: int = 0) -> bytearray:
    return build_batch([Record(value=v) for v in values], producer_id=pid, producer_epoch=0,
                       base_sequence=seq, transactional=True)


def write_marker(broker: BrokerThread, topic: str, pid: int, commit: bool,
                 coordinator_epoch: int = 0) -> None:
    """What the transaction coordinator's WriteTxnMarkers has the leader do."""
    def append() -> None:
        p = broker.server.replica_manager.core.partition(TopicPartition(topic, 0))
        marker = build_end_transaction_marker(commit=commit, producer_id=pid, producer_epoch=0,
                                              coordinator_epoch=coordinator_epoch)
        p.log.append_as_leader(marker, p.leader_epoch, 0, AppendOrigin.COORDINATOR)
        p.maybe_increment_leader_hw()  # one replica: committed at once

    broker.call(append)


def latest(port: int, topic: str, isolation_level: int) -> int:
    req = m_lo.ListOffsetsRequest(replica_id=-1, isolation_level=isolation_level, topics=[
        m_lo.ListOffsetsTopic(topic, [m_lo.ListOffsetsPartition(partition_index=0, timestamp=-1)])])
    return int(send(port, req).topics[0].partitions[0].offset)


def read_committed(port: int, topic: str, offset: int) -> Any:
    from harness import fetch_request

    req = fetch_request(topic, 0, offset)
    req.isolation_level = 1
    return send(port, req).responses[0].partitions[0]


def test_read_committed_fetch_and_list_offsets(one_broker: BrokerThread,
                                               controller: ActingController) -> None:
    controller.create_topic("rc", {0: [1]})
    port = one_broker.port
    assert produce(port, "rc", 0, txn(11, b"aborted-1", b"aborted-2"),
                   transactional_id="t11")[0] == 0  # 0-1
    assert produce(port, "rc", 0, txn(12, b"committed"), transactional_id="t12")[0] == 0  # 2
    assert produce(port, "rc", 0, build_batch([Record(value=b"plain")]))[0] == 0  # 3

    open_txns = read_committed(port, "rc", 0)
    assert (open_txns.high_watermark, open_txns.last_stable_offset) == (4, 0)
    assert values_of(open_txns.records) == [] and open_txns.aborted_transactions == []
    assert (latest(port, "rc", 1), latest(port, "rc", 0)) == (0, 4)
    uncommitted = fetch(port, "rc", 0, 0)
    assert len(values_of(uncommitted.records)) == 4 and uncommitted.aborted_transactions is None

    write_marker(one_broker, "rc", 11, commit=False)  # 4
    write_marker(one_broker, "rc", 12, commit=True)  # 5
    done = read_committed(port, "rc", 0)
    assert done.last_stable_offset == 6 and latest(port, "rc", 1) == 6
    assert [(a.producer_id, a.first_offset) for a in done.aborted_transactions] == [(11, 0)]
    # The client drops producer 11's records below its abort marker and the control batches.
    assert values_of(done.records) == [b"aborted-1", b"aborted-2", b"committed", b"plain"]
    assert read_committed(port, "rc", 5).aborted_transactions == []


def test_describe_producers_shows_open_transactions_and_coordinator_epochs(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("dp-txn", {0: [1]})
    port = one_broker.port
    produce(port, "dp-txn", 0, build_batch([Record(value=b"p")]))  # 0
    assert produce(port, "dp-txn", 0, txn(21, b"a", b"b"), transactional_id="t21")[0] == 0  # 1-2

    def describe() -> Any:
        resp = send(port, m_dp.DescribeProducersRequest(
            topics=[m_dp.TopicRequest("dp-txn", [0])]))
        (state,) = resp.topics[0].partitions[0].active_producers
        return (state.producer_id, state.last_sequence, state.coordinator_epoch,
                state.current_txn_start_offset)

    assert describe() == (21, 1, -1, 1)
    write_marker(one_broker, "dp-txn", 21, commit=True, coordinator_epoch=3)
    assert describe() == (21, 1, 3, -1)
