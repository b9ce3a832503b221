"""Truncation on fetch (KIP-595, Kafka's replica fetcher since IBP 2.7): a follower with leader
epochs fetches from its LEO with its last fetched epoch and truncates on the leader's diverging
epoch by the KIP-279 rule, without OffsetsForLeaderEpoch; the leader here is a real
ReplicaManager answering the follower's requests, the clock the test's."""

from __future__ import annotations

from replication_helpers import TP, MiniCluster, records, state

from tidelog.replication import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    Errors,
    FetchPartitionData,
    FetchRequest,
    OffsetsForLeaderEpochRequest,
    ReplicaFetcher,
    ReplicaManager,
    ReplicaState,
    ReplicationConfig,
)
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

CONFIG = ReplicationConfig(replica_fetch_backoff_ms=100, replica_fetch_wait_max_ms=0)


def leader_with_epochs(batches: list[tuple[int, int]], current_epoch: int) -> ReplicaManager:
    """Broker 1 leading TP (replicas 1, 2): for each (epoch, n), n records written in that
    epoch, then led in ``current_epoch``."""
    rm = ReplicaManager(1, LogManager(["/b1"], LogConfig(), MemoryFileIO()), CONFIG)
    version = 0
    for epoch, n in batches:
        rm.become_leader_or_follower(
            0, 1, [state(1, epoch, (1,), replicas=(1, 2), zk_version=version)], {1, 2}, 0)
        version += 1
        assert rm.append_records(1, {TP: records(n)}, 1000, 0).results[TP].error == Errors.NONE
    rm.become_leader_or_follower(
        0, 1, [state(1, current_epoch, (1,), replicas=(1, 2), zk_version=version)], {1, 2}, 0)
    return rm


def follower_log(batches: list[tuple[int, int]]) -> Log:
    """Broker 2's log of TP holding, for each (epoch, n), n records written in that epoch."""
    source = ReplicaManager(9, LogManager(["/b9"], LogConfig(), MemoryFileIO()), CONFIG)
    for version, (epoch, n) in enumerate(batches):
        source.become_leader_or_follower(
            0, 1, [state(9, epoch, (9,), replicas=(9,), zk_version=version)], {9}, 0)
        source.append_records(1, {TP: records(n, "x")}, 1000, 0)
    log = Log("/b2/orders-0", LogConfig(), MemoryFileIO())
    log.append_as_follower(bytes(source.partition(TP).log.read(0, 1 << 20).records), 0)
    return log


def batches(log: Log) -> list[tuple[int, int, int]]:
    return [(b.base_offset, b.last_offset, b.partition_leader_epoch) for b in log.batches()]


def exchange(f: ReplicaFetcher, leader: ReplicaManager, now: int = 0,
             rounds: int = 6) -> list[tuple[int, int, tuple[int, int] | None]]:
    """Serve the follower's requests from the leader until it has nothing to send; returns
    each fetch's (fetch offset, last fetched epoch, the answer's diverging epoch)."""
    seen = []
    for _ in range(rounds):
        now += 1
        requests = f.poll_requests(now)
        assert not any(isinstance(r, OffsetsForLeaderEpochRequest) for r in requests)
        fetches = [r for r in requests if isinstance(r, FetchRequest)]
        if not fetches:
            break
        answer = leader.fetch(fetches[0], now).results
        sent = fetches[0].partitions[TP]
        seen.append((sent.fetch_offset, sent.last_fetched_epoch, answer[TP].diverging_epoch))
        f.handle_response(fetches[0], answer, now)
        if answer[TP].diverging_epoch is None and not answer[TP].records:
            break  # caught up
    return seen


def test_a_follower_with_epochs_fetches_from_its_leo_with_its_latest_epoch() -> None:
    # The HW (2) is only the fetch offset without epochs: offsets 2..4 are kept when the
    # leader has them, with no OffsetsForLeaderEpoch round first.
    log = follower_log([(0, 2), (0, 3)])
    log.update_high_watermark(2)
    f = ReplicaFetcher(2, 1, {TP: log}.get, CONFIG)
    f.add_partitions({TP: (2, 1)}, 0)
    st = f.partition_states.state_value(TP)
    assert (st.state, st.fetch_offset, st.last_fetched_epoch) == (ReplicaState.FETCHING, 5, 0)
    req = f.poll_requests(0)
    assert [type(r) for r in req] == [FetchRequest]
    assert req[0].partitions[TP].last_fetched_epoch == 0
    assert req[0].fetch_args()[TP] == (5, 1, 0, CONFIG.replica_fetch_max_bytes, 0)


def test_a_log_without_epochs_truncates_to_its_hw_without_asking_the_leader() -> None:
    f = ReplicaFetcher(2, 1, {TP: Log("/b2/orders-0", LogConfig(), MemoryFileIO())}.get, CONFIG)
    f.add_partitions({TP: (0, 1)}, 0)
    assert f.partition_states.state_value(TP).state is ReplicaState.TRUNCATING
    [req] = f.poll_requests(0)
    assert isinstance(req, FetchRequest) and req.partitions[TP].last_fetched_epoch == -1


def test_diverging_answers_truncate_to_the_fork_found_by_the_kip_279_rule() -> None:
    # Leader: epoch 0 at 0-2, 1 at 3-4, 3 at 5-6, led in 4. Follower: epoch 0 at 0-2, then
    # epoch 2 at 3-7 (a leader of epoch 2 that never replicated). Its fetch (8, last epoch 2)
    # is answered (1, 5): it has no epoch 1, so it cuts to the end of its epoch 0 (3) and
    # fetches (3, 0) — which agrees, and the leader's records from 3 follow.
    leader = leader_with_epochs([(0, 3), (1, 2), (3, 2)], 4)
    log = follower_log([(0, 3), (2, 5)])
    f = ReplicaFetcher(2, 1, {TP: log}.get, CONFIG)
    f.add_partitions({TP: (0, 4)}, 0)
    seen = exchange(f, leader)
    assert seen[:2] == [(8, 2, (1, 5)), (3, 0, None)]
    assert batches(log) == batches(leader.partition(TP).log)
    assert f.partition_states.state_value(TP).last_fetched_epoch == 3


def fetching_a_forked_tail() -> tuple[Log, ReplicaFetcher, FetchRequest]:
    """A follower with epoch 0 at 0-2 and epoch 2 at 3-7, its fetch (8, last epoch 2) sent."""
    log = follower_log([(0, 3), (2, 5)])
    f = ReplicaFetcher(2, 1, {TP: log}.get, CONFIG)
    f.add_partitions({TP: (0, 4)}, 0)
    [req] = f.poll_requests(0)
    assert isinstance(req, FetchRequest)
    return log, f, req


def test_a_diverging_answer_appends_nothing_and_takes_no_hw_from_it() -> None:
    log, f, req = fetching_a_forked_tail()
    f.handle_response(req, {TP: FetchPartitionData(Errors.NONE, 7, 1, b"",
                                                   diverging_epoch=(0, 3))}, 1)
    assert (log.log_end_offset, log.high_watermark, log.log_start_offset) == (3, 0, 0)
    st = f.partition_states.state_value(TP)
    assert (st.state, st.fetch_offset, st.last_fetched_epoch) == (ReplicaState.FETCHING, 3, 0)


def test_a_diverging_answer_to_a_request_no_longer_current_is_ignored() -> None:
    log, f, req = fetching_a_forked_tail()
    f.add_partitions({TP: (0, 5)}, 1)  # a new leader epoch meanwhile
    result = f.handle_response(req, {TP: FetchPartitionData(Errors.NONE, 7, 0, b"",
                                                            diverging_epoch=(0, 3))}, 2)
    assert result.ignored == {TP} and log.log_end_offset == 8


def leader_change_with_an_unreplicated_tail(config: ReplicationConfig) -> MiniCluster:
    """Offsets 0-2 on all three brokers; 3-4 (acks=1) on leader 1 alone when broker 2 is
    elected (epoch 1) and writes 3-6."""
    c = MiniCluster(3, config)
    c.elect(1, (1, 2, 3))
    c.produce(1, 3)
    c.run(10)
    assert c.log(2).log_end_offset == c.log(3).log_end_offset == 3
    c.produce(1, 2)
    c.elect(2, (2, 3))
    c.produce(2, 4)
    return c


def test_a_leader_change_with_unreplicated_records_truncates_without_offsets_for_leader_epoch(
) -> None:
    c = leader_change_with_an_unreplicated_tail(CONFIG)
    sent = []
    for _ in range(20):
        c.now += 10
        c.clock.run_due()
        for b in sorted(c.live):
            sent += [(b, type(r)) for r in c.step_broker(b)]
    assert not [s for s in sent if s[1] is OffsetsForLeaderEpochRequest]
    assert c.batches(1) == c.batches(2) == c.batches(3)
    assert c.log(1).log_end_offset == 7 and c.batches(1)[-1][2] == 1


def test_before_ibp_2_7_the_same_change_truncates_through_offsets_for_leader_epoch() -> None:
    c = leader_change_with_an_unreplicated_tail(CONFIG.with_(truncation_on_fetch=False))
    sent = []
    for _ in range(20):
        c.now += 10
        c.clock.run_due()
        sent += [type(r) for r in c.step_broker(1)]
    assert OffsetsForLeaderEpochRequest in sent
    assert c.batches(1) == c.batches(2)


def serve(f: ReplicaFetcher, leader: ReplicaManager, rounds: int = 8
          ) -> list[tuple[str, int, int]]:
    """Answer every request of the follower from the leader, ``rounds`` times; returns what it
    asked: ("fetch", offset, last fetched epoch) or ("list_offsets", timestamp, 0)."""
    asked = []
    for now in range(1, rounds + 1):
        for r in f.poll_requests(now):
            assert not isinstance(r, OffsetsForLeaderEpochRequest)
            if isinstance(r, FetchRequest):
                p = r.partitions[TP]
                asked.append(("fetch", p.fetch_offset, p.last_fetched_epoch))
                f.handle_response(r, leader.fetch(r, now).results, now)
            else:
                [(_, timestamp)] = r.partitions.values()
                asked.append(("list_offsets", timestamp, 0))
                f.handle_response(r, leader.list_offsets(r.replica_id, r.partitions), now)
    return asked


def leading_one_epoch(*appends: int) -> ReplicaManager:
    """Broker 1 leading TP: each append a batch written in epoch 0; then led in epoch 2."""
    rm = ReplicaManager(1, LogManager(["/b1"], LogConfig(), MemoryFileIO()), CONFIG)
    rm.become_leader_or_follower(0, 1, [state(1, 0, (1,), replicas=(1, 2))], {1, 2}, 0)
    for n in appends:
        assert rm.append_records(1, {TP: records(n)}, 1000, 0).results[TP].error == Errors.NONE
    rm.become_leader_or_follower(
        0, 1, [state(1, 2, (1,), replicas=(1, 2), zk_version=1)], {1, 2}, 0)
    return rm


def test_a_diverging_epoch_ending_past_the_leo_drops_only_an_epoch_never_written_in() -> None:
    # The follower led epoch 1 from offset 3 and lost the lead before any append; the leader
    # has epoch 0 up to 5. Its answer to (3, last epoch 1) is (0, 5), above the follower's
    # LEO: nothing is cut but the empty epoch 1, and (3, 0) then reads 3-4.
    leader = leading_one_epoch(3, 2)
    log = follower_log([(0, 3)])
    log.assign_epoch_start_offset(1, 3)
    f = ReplicaFetcher(2, 1, {TP: log}.get, CONFIG)
    f.add_partitions({TP: (0, 2)}, 0)
    seen = exchange(f, leader)
    assert seen[:2] == [(3, 1, (0, 5)), (3, 0, None)]
    assert batches(log) == batches(leader.partition(TP).log) == [(0, 2, 0), (3, 4, 0)]


def test_a_fetch_below_the_leaders_log_start_resets_and_fetches_without_an_epoch() -> None:
    # The leader's log starts at 3 (DeleteRecords); the follower has 0-1 in epoch 0. Its
    # fetch (2, 0) is OFFSET_OUT_OF_RANGE; ListOffsets latest, then earliest: its log restarts
    # at 3, with no epoch left, so the next fetch carries none (Kafka's latestEpoch: empty).
    leader = leading_one_epoch(3, 3)
    assert leader.partition(TP).log.maybe_increment_log_start_offset(3)
    log = follower_log([(0, 2)])
    f = ReplicaFetcher(2, 1, {TP: log}.get, CONFIG)
    f.add_partitions({TP: (0, 2)}, 0)
    asked = serve(f, leader)
    assert asked[:4] == [("fetch", 2, 0), ("list_offsets", LATEST_TIMESTAMP, 0),
                         ("list_offsets", EARLIEST_TIMESTAMP, 0), ("fetch", 3, -1)]
    assert batches(log) == [(3, 5, 0)]
    assert f.partition_states.state_value(TP).last_fetched_epoch == 0


def test_a_truncation_on_a_diverging_answer_that_fails_marks_the_partition_failed() -> None:
    log, f, req = fetching_a_forked_tail()
    log.file_io.fail_io("/b2")
    result = f.handle_response(req, {TP: FetchPartitionData(Errors.NONE, 7, 0, b"",
                                                            diverging_epoch=(0, 3))}, 1)
    assert result is not None and TP in f.failed_partitions
    assert TP not in f.partition_states and f.poll_requests(2) == []
