"""Fetch v12+ with a last fetched epoch (KIP-320/595, Kafka's Partition.readRecords): a fetcher
whose history diverges from the leader's log gets the leader's (epoch, end offset) there and no
records, at once; an epoch the log cannot place is OFFSET_OUT_OF_RANGE; a follower's diverging
fetch is not recorded (its log is to be truncated first)."""

from __future__ import annotations

from replication_helpers import TP, records, state

from tidelog.replication import CONSUMER_REPLICA_ID, Errors, ReplicaManager, ReplicationConfig
from tidelog.replication.types import FetchPartitionData
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager


def two_epochs() -> ReplicaManager:
    """Offsets 0-2 written in epoch 0, 3-4 in epoch 2 (epoch 1 never wrote here)."""
    rm = ReplicaManager(1, LogManager(["/b1"], LogConfig(), MemoryFileIO()), ReplicationConfig())
    rm.become_leader_or_follower(0, 1, [state(1, 0, (1,), replicas=(1, 2))], {1, 2}, 0)
    assert rm.append_records(1, {TP: records(3)}, 1000, 0).results[TP].error == Errors.NONE
    rm.become_leader_or_follower(0, 1, [state(1, 2, (1,), replicas=(1, 2), zk_version=1)],
                                 {1, 2}, 0)
    assert rm.append_records(1, {TP: records(2)}, 1000, 0).results[TP].error == Errors.NONE
    assert rm.partition(TP).high_watermark == 5
    return rm


def fetch(rm: ReplicaManager, offset: int, last_fetched_epoch: int,
          replica_id: int = CONSUMER_REPLICA_ID, max_wait_ms: int = 0) -> FetchPartitionData:
    outcome = rm.fetch_messages(replica_id, max_wait_ms, 1, 1 << 20,
                                {TP: (offset, 2, 0, 1 << 20, last_fetched_epoch)}, 0,
                                request_key="f")
    assert not outcome.delayed and outcome.results is not None
    return outcome.results[TP]


def test_an_epoch_this_log_never_wrote_diverges_at_the_end_of_the_epoch_before_it() -> None:
    got = fetch(two_epochs(), 4, 1)
    assert (got.error, got.diverging_epoch, bytes(got.records)) == (Errors.NONE, (0, 3), b"")
    assert (got.high_watermark, got.log_start_offset) == (5, 0)


def test_a_fetch_offset_past_the_end_of_its_epoch_diverges() -> None:
    got = fetch(two_epochs(), 4, 0)
    assert (got.diverging_epoch, bytes(got.records)) == ((0, 3), b"")


def test_a_history_the_log_shares_is_read_as_usual() -> None:
    rm = two_epochs()
    at_the_epoch_end = fetch(rm, 3, 0)
    assert at_the_epoch_end.diverging_epoch is None and len(at_the_epoch_end.records) > 0
    in_the_epoch = fetch(rm, 1, 0)
    assert in_the_epoch.diverging_epoch is None and len(in_the_epoch.records) > 0
    at_the_end = fetch(rm, 5, 2)
    assert (at_the_end.error, at_the_end.diverging_epoch) == (Errors.NONE, None)
    no_epoch = fetch(rm, 4, -1)
    assert no_epoch.diverging_epoch is None and len(no_epoch.records) > 0


def test_an_epoch_newer_than_the_log_knows_is_out_of_range() -> None:
    assert fetch(two_epochs(), 5, 3).error == Errors.OFFSET_OUT_OF_RANGE


def test_a_diverging_follower_fetch_is_answered_at_once_and_not_recorded() -> None:
    rm = two_epochs()
    got = fetch(rm, 4, 1, replica_id=2, max_wait_ms=500)  # a held fetch: min_bytes 1
    assert (got.diverging_epoch, bytes(got.records)) == ((0, 3), b"")
    # Its log end (4) is not the follower's: the leader learns it after the truncation.
    assert rm.partition(TP).remote_replicas[2].log_end_offset != 4
    agreed = fetch(rm, 3, 0, replica_id=2, max_wait_ms=500)
    assert agreed.diverging_epoch is None and len(agreed.records) > 0
    assert rm.partition(TP).remote_replicas[2].log_end_offset == 3
