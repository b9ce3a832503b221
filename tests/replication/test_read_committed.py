"""READ_COMMITTED fetches in the replication core (KIP-98): consumers read up to the last stable
offset and get the aborted transactions overlapping what they read; followers still replicate
to the LEO and rebuild the same transaction state."""

from __future__ import annotations

from replication_helpers import TP, MiniCluster

from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import Record, build_batch, build_end_transaction_marker
from tidelog.replication import ReplicaManager
from tidelog.replication.types import CONSUMER_REPLICA_ID, READ_COMMITTED, READ_UNCOMMITTED
from tidelog.storage.transactions import AppendOrigin


def txn(pid: int, n: int = 1, seq: int = 0) -> bytes:
    return bytes(build_batch([Record(value=b"t%d" % i) for i in range(n)], producer_id=pid,
                             producer_epoch=0, base_sequence=seq, transactional=True))


def marker(pid: int, commit: bool) -> bytes:
    return bytes(build_end_transaction_marker(commit=commit, producer_id=pid, producer_epoch=0,
                                              coordinator_epoch=0))


def append(c: MiniCluster, records: bytes, origin: AppendOrigin = AppendOrigin.CLIENT) -> None:
    if origin is AppendOrigin.CLIENT:
        out = c.rm(1).append_records(1, {TP: records}, 30_000, c.now)
        assert out.results is not None and out.results[TP].error == 0, out
    else:  # the coordinator's WriteTxnMarkers: straight to the leader's log
        p = c.rm(1).partition(TP)
        p.log.append_as_leader(records, p.leader_epoch, c.now, origin)


def consume(rm: ReplicaManager, offset: int, now_ms: int, isolation: int):
    return rm.fetch_messages(CONSUMER_REPLICA_ID, 0, 1, 1 << 20, {TP: (offset, -1, 0, 1 << 20)},
                             now_ms, isolation_level=isolation).results[TP]


def last_offsets(records: bytes) -> list[int]:
    return [b.last_offset for b in iter_batches(records)]


def test_read_committed_stops_at_the_lso_and_read_uncommitted_at_the_hw() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    append(c, txn(7, 2))  # 0-1: open transaction
    c.produce(1, 1)  # 2: plain record
    c.run(3)
    committed = consume(c.rm(1), 0, c.now, READ_COMMITTED)
    uncommitted = consume(c.rm(1), 0, c.now, READ_UNCOMMITTED)
    assert (committed.high_watermark, committed.last_stable_offset) == (3, 0)
    assert committed.records == b"" and committed.aborted_transactions == ()
    assert last_offsets(uncommitted.records) == [1, 2]
    assert uncommitted.aborted_transactions is None and uncommitted.last_stable_offset == 0


def test_an_aborted_transaction_is_listed_for_the_range_read() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    append(c, txn(7, 2))  # 0-1
    append(c, txn(8))  # 2: another producer's transaction
    append(c, marker(8, commit=True), AppendOrigin.COORDINATOR)  # 3
    append(c, marker(7, commit=False), AppendOrigin.COORDINATOR)  # 4
    c.produce(1, 1)  # 5
    c.run(3)
    result = consume(c.rm(1), 0, c.now, READ_COMMITTED)
    assert result.last_stable_offset == 6
    assert last_offsets(result.records) == [1, 2, 3, 4, 5]
    assert result.aborted_transactions == ((7, 0),)
    # A read starting after the abort's marker needs no aborted list.
    assert consume(c.rm(1), 5, c.now, READ_COMMITTED).aborted_transactions == ()


def test_a_held_read_committed_fetch_waits_for_the_lso_not_the_hw() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    append(c, txn(7))  # 0
    c.run(3)
    rm = c.rm(1)
    held = rm.fetch_messages(CONSUMER_REPLICA_ID, 500, 1, 1 << 20, {TP: (0, -1, 0, 1 << 20)},
                             c.now, request_key="rc", isolation_level=READ_COMMITTED)
    assert held.delayed  # the HW is 1 but nothing is stable
    append(c, marker(7, commit=True), AppendOrigin.COORDINATOR)
    c.run(3)
    done = [x for x in rm.poll_completed(c.now) if getattr(x, "request_key", None) == "rc"]
    assert done and last_offsets(done[0].results[TP].records) == [0, 1]


def test_followers_rebuild_the_transaction_state_and_a_new_leader_keeps_the_lso() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    append(c, txn(7))  # 0
    append(c, txn(8))  # 1
    append(c, marker(7, commit=False), AppendOrigin.COORDINATOR)  # 2
    c.run(3)
    c.elect(2, (2, 3))
    c.run(3)
    result = consume(c.rm(2), 0, c.now, READ_COMMITTED)
    assert result.last_stable_offset == 1  # producer 8 is still open on the new leader
    assert result.aborted_transactions == ((7, 0),)
