"""The replica fetcher (seed 002): fetch states, truncation through OffsetsForLeaderEpoch
(KIP-101/279, a leader before IBP 2.7: ``truncation_on_fetch=False``) and the error table.
Truncation on a fetch answer's diverging epoch: test_truncation_on_fetch.py."""

from __future__ import annotations

from replication_helpers import TP, new_log, records, state

from tidelog.replication import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    EpochEndOffset,
    Errors,
    FetchPartitionData,
    FetchRequest,
    ListOffsetsPartitionResult,
    ListOffsetsRequest,
    OffsetsForLeaderEpochRequest,
    Partition,
    PartitionFetchState,
    PartitionStates,
    ReplicaFetcher,
    ReplicaState,
    ReplicationConfig,
    TopicPartition,
)
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log import Log

TP2 = TopicPartition("orders", 1)
BACKOFF = 100
CONFIG = ReplicationConfig(replica_fetch_backoff_ms=BACKOFF, replica_socket_timeout_ms=5_000)
BEFORE_2_7 = CONFIG.with_(truncation_on_fetch=False)  # the KIP-279 OffsetsForLeaderEpoch exchange


def leader_log(io: MemoryFileIO, sizes_by_epoch: list[tuple[int, int]], tp: TopicPartition = TP) -> Log:
    """A leader's log: for each (epoch, n), one batch of n records written in that epoch."""
    log = new_log(io, 1, tp)
    for epoch, n in sizes_by_epoch:
        log.assign_epoch_start_offset(epoch, log.log_end_offset)
        log.append_as_leader(records(n), epoch, 0)
    return log


def data(log: Log, start: int, hw: int | None = None) -> FetchPartitionData:
    """What a leader answers for a fetch at `start`."""
    return FetchPartitionData(
        Errors.NONE, log.high_watermark if hw is None else hw, log.log_start_offset,
        bytes(log.read(start, 1 << 20).records),
    )


def follower(io: MemoryFileIO, tps=(TP,), config: ReplicationConfig = CONFIG) -> tuple[ReplicaFetcher, dict]:
    logs = {tp: new_log(io, 2, tp) for tp in tps}
    return ReplicaFetcher(2, 1, logs.get, config), logs


def only(requests, kind):
    found = [r for r in requests if isinstance(r, kind)]
    assert len(found) == 1, requests
    return found[0]


def test_partition_states_move_to_end_gives_round_robin_order() -> None:
    s = PartitionStates()
    a, b, c = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)
    for tp in (a, b, c):
        s.update_and_move_to_end(tp, PartitionFetchState(0, 0))
    s.update_and_move_to_end(a, PartitionFetchState(5, 0))
    s.update(b, PartitionFetchState(7, 0))  # in place: keeps its turn
    assert list(s) == [b, c, a]
    assert s.state_value(a).fetch_offset == 5 and len(s) == 3 and a in s
    s.remove(c)
    assert list(s) == [b, a]


def test_fetched_data_is_appended_and_the_follower_hw_is_min_of_leo_and_leader_hw() -> None:
    io = MemoryFileIO()
    leader = leader_log(io, [(0, 3)])
    f, logs = follower(io)
    f.add_partitions({TP: (0, 0)}, now_ms=0)
    # An empty log has no epoch: truncation falls back to the HW (0) at once, no request.
    req = only(f.poll_requests(0), FetchRequest)
    assert req.partitions[TP].fetch_offset == 0 and req.partitions[TP].current_leader_epoch == 0
    result = f.handle_response(req, {TP: data(leader, 0, hw=2)}, 1)
    assert TP in result.appended
    assert (logs[TP].log_end_offset, logs[TP].high_watermark) == (3, 2)  # HW = leader's 2 < LEO 3
    req = only(f.poll_requests(2), FetchRequest)
    assert req.partitions[TP].fetch_offset == 3
    leader.append_as_leader(records(4), 0, 0)
    f.handle_response(req, {TP: data(leader, 3, hw=20)}, 3)
    assert (logs[TP].log_end_offset, logs[TP].high_watermark) == (7, 7)  # HW = own LEO 7 < 20


def test_a_partition_that_got_data_goes_to_the_back_of_the_fetch_order() -> None:
    io = MemoryFileIO()
    leader = leader_log(io, [(0, 2)])
    f, _ = follower(io, (TP, TP2))
    f.add_partitions({TP: (0, 0), TP2: (0, 0)}, 0)
    req = only(f.poll_requests(0), FetchRequest)
    f.handle_response(req, {TP: data(leader, 0), TP2: FetchPartitionData(Errors.NONE, 0, 0)}, 1)
    assert list(f.partition_states) == [TP2, TP]


def test_only_one_fetch_in_flight_and_a_lost_response_times_out_into_backoff() -> None:
    io = MemoryFileIO()
    f, _ = follower(io)
    f.add_partitions({TP: (0, 0)}, 0)
    req = only(f.poll_requests(0), FetchRequest)
    assert f.poll_requests(10) == []  # the first is still in flight
    assert f.poll_requests(4_999) == []
    assert f.poll_requests(5_000) == []  # timed out: back off
    assert f.partition_states.state_value(TP).delay_until_ms == 5_000 + BACKOFF
    again = only(f.poll_requests(5_000 + BACKOFF), FetchRequest)
    assert again.request_id != req.request_id
    # the late answer to the first request is ignored
    result = f.handle_response(req, {TP: FetchPartitionData(Errors.NONE, 0, 0)}, 5_200)
    assert result.ignored == {TP}


def test_out_of_range_when_the_leader_is_behind_truncates_to_the_leaders_leo() -> None:
    # seed 002 fetchOffsetAndTruncate, case 1 (after an unclean election).
    io = MemoryFileIO()
    f, logs = follower(io)
    logs[TP].append_as_follower(bytes(leader_log(MemoryFileIO(), [(0, 3), (0, 2)]).read(0, 1 << 20).records), 0)
    f.partition_states.update_and_move_to_end(TP, PartitionFetchState(5, 1))
    req = only(f.poll_requests(0), FetchRequest)
    f.handle_response(req, {TP: FetchPartitionData(Errors.OFFSET_OUT_OF_RANGE, 3, 0)}, 1)
    lo = only(f.poll_requests(1), ListOffsetsRequest)
    assert lo.partitions == {TP: (1, LATEST_TIMESTAMP)}
    f.handle_response(lo, {TP: ListOffsetsPartitionResult(Errors.NONE, 3, 1)}, 2)
    assert logs[TP].log_end_offset == 3
    # Fetching with its latest epoch as the last fetched one (Kafka's fetchOffsetAndTruncate).
    assert f.partition_states.state_value(TP) == PartitionFetchState(
        3, 1, ReplicaState.FETCHING, last_fetched_epoch=0)


def test_out_of_range_below_the_leaders_log_start_restarts_the_log_there() -> None:
    # case 2: the follower was away while the leader deleted old segments.
    io = MemoryFileIO()
    f, logs = follower(io)
    logs[TP].append_as_follower(bytes(leader_log(MemoryFileIO(), [(0, 2)]).read(0, 1 << 20).records), 0)
    f.partition_states.update_and_move_to_end(TP, PartitionFetchState(2, 0))
    req = only(f.poll_requests(0), FetchRequest)
    f.handle_response(req, {TP: FetchPartitionData(Errors.OFFSET_OUT_OF_RANGE, 20, 10)}, 1)
    lo = only(f.poll_requests(1), ListOffsetsRequest)
    f.handle_response(lo, {TP: ListOffsetsPartitionResult(Errors.NONE, 20, 0)}, 2)
    lo = only(f.poll_requests(2), ListOffsetsRequest)
    assert lo.partitions == {TP: (0, EARLIEST_TIMESTAMP)}
    f.handle_response(lo, {TP: ListOffsetsPartitionResult(Errors.NONE, 10, 0)}, 3)
    assert (logs[TP].log_start_offset, logs[TP].log_end_offset) == (10, 10)
    assert only(f.poll_requests(3), FetchRequest).partitions[TP].fetch_offset == 10


def test_out_of_range_with_the_leader_ahead_keeps_the_log_and_fetches_from_its_leo() -> None:
    io = MemoryFileIO()
    f, logs = follower(io)
    logs[TP].append_as_follower(bytes(leader_log(MemoryFileIO(), [(0, 5)]).read(0, 1 << 20).records), 0)
    f.partition_states.update_and_move_to_end(TP, PartitionFetchState(5, 0))
    f.handle_response(only(f.poll_requests(0), FetchRequest),
                      {TP: FetchPartitionData(Errors.OFFSET_OUT_OF_RANGE, 0, 0)}, 1)
    f.handle_response(only(f.poll_requests(1), ListOffsetsRequest),
                      {TP: ListOffsetsPartitionResult(Errors.NONE, 8, 0)}, 2)
    f.handle_response(only(f.poll_requests(2), ListOffsetsRequest),
                      {TP: ListOffsetsPartitionResult(Errors.NONE, 0, 0)}, 3)
    assert logs[TP].log_end_offset == 5
    assert only(f.poll_requests(3), FetchRequest).partitions[TP].fetch_offset == 5


def fetch_once_with_error(error: Errors, epoch: int = 0):
    io = MemoryFileIO()
    f, logs = follower(io)
    f.partition_states.update_and_move_to_end(TP, PartitionFetchState(0, epoch))
    req = only(f.poll_requests(0), FetchRequest)
    result = f.handle_response(req, {TP: FetchPartitionData(error)}, 10)
    return f, result


def test_unknown_leader_epoch_and_not_leader_back_off_then_retry() -> None:
    for error in (Errors.UNKNOWN_LEADER_EPOCH, Errors.NOT_LEADER_OR_FOLLOWER, Errors.KAFKA_STORAGE_ERROR):
        f, result = fetch_once_with_error(error)
        assert result.errors == {TP: error}
        assert f.poll_requests(10 + BACKOFF - 1) == []
        assert only(f.poll_requests(10 + BACKOFF), FetchRequest).partitions[TP].fetch_offset == 0


def test_fenced_leader_epoch_stops_the_partition_until_a_new_epoch_arrives() -> None:
    f, result = fetch_once_with_error(Errors.FENCED_LEADER_EPOCH, epoch=3)
    assert result.failed == {TP} and TP in f.failed_partitions and TP not in f.partition_states
    assert f.poll_requests(10_000) == []
    f.add_partitions({TP: (0, 4)}, 10_000)  # LeaderAndIsr with the new epoch
    assert TP not in f.failed_partitions
    assert only(f.poll_requests(10_000), FetchRequest).partitions[TP].current_leader_epoch == 4


def test_corrupt_records_are_retried_after_the_backoff_without_touching_the_log() -> None:
    io = MemoryFileIO()
    leader = leader_log(io, [(0, 3)])
    f, logs = follower(io)
    f.partition_states.update_and_move_to_end(TP, PartitionFetchState(0, 0))
    good = data(leader, 0)
    bad = bytearray(good.records)
    bad[-1] ^= 0xFF
    req = only(f.poll_requests(0), FetchRequest)
    result = f.handle_response(req, {TP: FetchPartitionData(Errors.NONE, 3, 0, bytes(bad))}, 1)
    assert result.errors == {TP: Errors.CORRUPT_MESSAGE} and logs[TP].log_end_offset == 0
    req = only(f.poll_requests(1 + BACKOFF), FetchRequest)
    f.handle_response(req, {TP: good}, 1 + BACKOFF)
    assert logs[TP].log_end_offset == 3


def test_a_storage_error_fails_that_partition_and_the_others_continue() -> None:
    io = MemoryFileIO()
    leader = leader_log(io, [(0, 3)])
    f, logs = follower(io, (TP, TP2))
    f.add_partitions({TP: (0, 0), TP2: (0, 0)}, 0)
    req = only(f.poll_requests(0), FetchRequest)
    io.fail_io(logs[TP2].dir)
    result = f.handle_response(req, {TP: data(leader, 0), TP2: data(leader, 0)}, 1)
    assert result.failed == {TP2} and f.failed_partitions == {TP2}
    assert result.errors[TP2] == Errors.KAFKA_STORAGE_ERROR
    assert logs[TP].log_end_offset == 3
    assert only(f.poll_requests(2), FetchRequest).partitions.keys() == {TP}


def test_a_response_for_a_partition_whose_epoch_changed_meanwhile_is_ignored() -> None:
    # KAFKA-18991: the partition was re-added in a new epoch while the fetch was out.
    io = MemoryFileIO()
    leader = leader_log(io, [(0, 3)])
    f, logs = follower(io)
    f.partition_states.update_and_move_to_end(TP, PartitionFetchState(0, 0))
    req = only(f.poll_requests(0), FetchRequest)
    f.add_partitions({TP: (0, 1)}, 1)
    result = f.handle_response(req, {TP: data(leader, 0)}, 2)
    assert result.ignored == {TP} and logs[TP].log_end_offset == 0
    assert f.partition_states.state_value(TP).state is ReplicaState.TRUNCATING


def test_truncate_to_hw_rule_cuts_to_the_hw_without_asking_the_leader() -> None:
    # pre-KIP-101: the follower truncates to its HW (its initial fetch offset) at once.
    io = MemoryFileIO()
    f, logs = follower(io, config=CONFIG.with_(truncate_to_hw=True))
    logs[TP].append_as_follower(bytes(leader_log(MemoryFileIO(), [(0, 2), (0, 3)]).read(0, 1 << 20).records), 0)
    logs[TP].update_high_watermark(2)
    f.add_partitions({TP: (2, 1)}, 0)
    req = only(f.poll_requests(0), FetchRequest)
    assert logs[TP].log_end_offset == 2 and req.partitions[TP].fetch_offset == 2
    assert req.partitions[TP].last_fetched_epoch == -1  # no truncation on fetch before KIP-101


def test_with_epochs_a_follower_keeps_data_above_its_hw_that_the_leader_has() -> None:
    # KIP-101: the follower asks OffsetsForLeaderEpoch(latest epoch) and keeps offsets 2..4.
    io = MemoryFileIO()
    leader = Partition(TP, 1, leader_log(io, [(0, 2), (0, 3)]), CONFIG)
    leader.make_leader(state(1, 1, (1, 2), replicas=(1, 2)), 0)
    f, logs = follower(io, config=BEFORE_2_7)
    logs[TP].append_as_follower(bytes(leader.log.read(0, 1 << 20).records), 0)
    logs[TP].update_high_watermark(2)
    f.add_partitions({TP: (2, 1)}, 0)
    req = only(f.poll_requests(0), OffsetsForLeaderEpochRequest)
    assert req.partitions == {TP: (1, 0)}
    answer = {TP: leader.last_offset_for_leader_epoch(1, 0)}
    assert answer[TP].end_offset == 5
    f.handle_response(req, answer, 1)
    assert logs[TP].log_end_offset == 5
    assert only(f.poll_requests(1), FetchRequest).partitions[TP].fetch_offset == 5


def test_kip_279_the_exchange_repeats_until_the_fork_is_found() -> None:
    # Leader epochs: 0 at 0, 1 at 3, 3 at 5, current 4. Follower: 0 at 0, then epoch 2 at 3
    # (a leader of epoch 2 that never replicated). The follower asks for 2; the leader answers
    # epoch 1 (largest <= 2) ending at 5; the follower has no epoch 1, so it cuts to the end of
    # its epoch 0 (3) and asks again for 0: answer (0, 3), the fork; truncation is complete.
    io = MemoryFileIO()
    leader = Partition(TP, 1, leader_log(io, [(0, 3), (1, 2), (3, 2)]), CONFIG)
    leader.make_leader(state(1, 4, (1, 2), replicas=(1, 2)), 0)
    f, logs = follower(io, config=BEFORE_2_7)
    diverged = leader_log(MemoryFileIO(), [(0, 3), (2, 5)])
    logs[TP].append_as_follower(bytes(diverged.read(0, 1 << 20).records), 0)
    f.add_partitions({TP: (0, 4)}, 0)
    asked = []
    now = 0
    while True:
        now += 1
        requests = f.poll_requests(now)
        epoch_requests = [r for r in requests if isinstance(r, OffsetsForLeaderEpochRequest)]
        if not epoch_requests:
            break
        req = epoch_requests[0]
        asked.append(req.partitions[TP][1])
        f.handle_response(req, {TP: leader.last_offset_for_leader_epoch(*req.partitions[TP])}, now)
        assert len(asked) < 10
    assert asked == [2, 0]
    assert logs[TP].log_end_offset == 3
    fetch_req = only(requests, FetchRequest)
    assert fetch_req.partitions[TP].fetch_offset == 3
    f.handle_response(fetch_req, {TP: data(leader.log, 3)}, now + 1)
    assert [(b.base_offset, b.partition_leader_epoch, b.crc) for b in logs[TP].batches()] == [
        (b.base_offset, b.partition_leader_epoch, b.crc) for b in leader.log.batches()
    ]


def test_offsets_for_leader_epoch_errors_back_off_and_fenced_stops() -> None:
    io = MemoryFileIO()
    f, logs = follower(io, config=BEFORE_2_7)
    logs[TP].append_as_follower(bytes(leader_log(MemoryFileIO(), [(0, 2)]).read(0, 1 << 20).records), 0)
    f.add_partitions({TP: (0, 1)}, 0)
    req = only(f.poll_requests(0), OffsetsForLeaderEpochRequest)
    f.handle_response(req, {TP: EpochEndOffset(Errors.NOT_LEADER_OR_FOLLOWER)}, 1)
    assert f.poll_requests(1 + BACKOFF - 1) == []
    req = only(f.poll_requests(1 + BACKOFF), OffsetsForLeaderEpochRequest)
    f.handle_response(req, {TP: EpochEndOffset(Errors.FENCED_LEADER_EPOCH)}, 200)
    assert f.failed_partitions == {TP}
    assert logs[TP].log_end_offset == 2  # nothing truncated without an answer (KIP-101)


def test_an_error_within_the_backoff_keeps_the_first_deadline() -> None:
    # Kafka's delayPartitions leaves a partition that is still delayed as it is: a second error
    # within the back-off does not push the retry later.
    io = MemoryFileIO()
    f, logs = follower(io, config=BEFORE_2_7)
    logs[TP].append_as_follower(bytes(leader_log(MemoryFileIO(), [(0, 2)]).read(0, 1 << 20).records), 0)
    f.partition_states.update_and_move_to_end(TP, PartitionFetchState(2, 0))
    fetch = only(f.poll_requests(0), FetchRequest)
    f.add_partitions({TP: (0, 1)}, 1)  # a new leader epoch while the fetch is out
    req = only(f.poll_requests(1), OffsetsForLeaderEpochRequest)
    f.handle_response(req, {TP: EpochEndOffset(Errors.NOT_LEADER_OR_FOLLOWER)}, 2)
    f.on_request_failed(fetch, 50)  # the fetch's connection is lost within the back-off
    assert f.partition_states.state_value(TP).delay_until_ms == 2 + BACKOFF
    assert f.poll_requests(2 + BACKOFF - 1) == []
    assert only(f.poll_requests(2 + BACKOFF), OffsetsForLeaderEpochRequest).partitions.keys() == {TP}
