"""A real broker's partition-leader side of transactions: WriteTxnMarkers appends the marker
the coordinator asks for (acks=all, as the coordinator's), which completes the transaction for
READ_COMMITTED readers; a marker from an older coordinator epoch is refused
(TRANSACTION_COORDINATOR_FENCED), a partition not hosted here answered
UNKNOWN_TOPIC_OR_PARTITION."""

from __future__ import annotations

from harness import ActingController, BrokerThread, produce, send

from tidelog.protocol.errors import ErrorCode as E
from tidelog.protocol.messages import list_offsets as m_lo
from tidelog.protocol.messages import write_txn_markers as m_wtm
from tidelog.protocol.records.builder import Record, build_batch

PID = 9000


def markers(topic: str, partitions: list[int], commit: bool, coordinator_epoch: int,
            epoch: int = 0) -> m_wtm.WriteTxnMarkersRequest:
    return m_wtm.WriteTxnMarkersRequest(markers=[m_wtm.WritableTxnMarker(
        producer_id=PID, producer_epoch=epoch, transaction_result=commit,
        topics=[m_wtm.WritableTxnMarkerTopic(topic, partitions)],
        coordinator_epoch=coordinator_epoch)])


def errors(r: m_wtm.WriteTxnMarkersResponse) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): p.error_code
            for m in r.markers for t in m.topics for p in t.partitions}


def latest(port: int, topic: str, isolation_level: int) -> int:
    req = m_lo.ListOffsetsRequest(replica_id=-1, isolation_level=isolation_level, topics=[
        m_lo.ListOffsetsTopic(topic, [m_lo.ListOffsetsPartition(partition_index=0, timestamp=-1)])])
    return int(send(port, req).topics[0].partitions[0].offset)


def test_write_txn_markers_completes_a_transaction_on_the_leader(
        one_broker: BrokerThread, controller: ActingController) -> None:
    topic = "wtm"
    controller.create_topic(topic, {0: [1]})
    port = one_broker.port
    batch = build_batch([Record(value=b"a"), Record(value=b"b")], producer_id=PID,
                        producer_epoch=0, base_sequence=0, transactional=True)
    assert produce(port, topic, 0, batch, transactional_id="wtm") == (0, 0)
    assert (latest(port, topic, 1), latest(port, topic, 0)) == (0, 2)  # LSO, HW

    r = send(port, markers(topic, [0, 5], True, coordinator_epoch=3), 1)
    assert errors(r) == {(topic, 0): 0, (topic, 5): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert (latest(port, topic, 1), latest(port, topic, 0)) == (3, 3)  # the marker at 2

    # A deposed coordinator's marker (a lower coordinator epoch) is refused, nothing written.
    stale = send(port, markers(topic, [0], False, coordinator_epoch=2), 0)
    assert errors(stale) == {(topic, 0): E.TRANSACTION_COORDINATOR_FENCED}
    assert latest(port, topic, 0) == 3

