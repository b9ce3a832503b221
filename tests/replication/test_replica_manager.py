"""ReplicaManager: controller requests with epoch fencing, acks=all, delayed fetch, consumers
below the HW, ISR change propagation (seeds 000 and 004)."""

from __future__ import annotations

from typing import Any

import pytest
from replication_helpers import TP, MiniCluster, records, state

from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import build_values
from tidelog.replication import (
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    AddFetcher,
    CompleteFetch,
    CompleteProduce,
    Errors,
    RemoveFetcher,
    ReplicaManager,
    ReplicationConfig,
    TopicPartition,
)
from tidelog.replication.replica_manager import FetchOutcome
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.errors import KafkaStorageError
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager


def manager(broker: int = 1, config: ReplicationConfig | None = None, **kw) -> ReplicaManager:
    lm = LogManager([f"/broker-{broker}"], LogConfig(), MemoryFileIO())
    return ReplicaManager(broker, lm, config or ReplicationConfig(), **kw)


# ---------------------------------------------------------------- LeaderAndIsr


def test_a_stale_controller_epoch_is_refused_as_a_whole() -> None:
    rm = manager()
    assert rm.become_leader_or_follower(0, 5, [state(1, 0, (1, 2, 3), controller_epoch=5)], {1, 2, 3}, 0).error == Errors.NONE
    result = rm.become_leader_or_follower(0, 4, [state(2, 1, (2, 3), controller_epoch=4)], {1, 2, 3}, 0)
    assert result.error == Errors.STALE_CONTROLLER_EPOCH and result.partition_errors == {}
    assert rm.partition(TP).is_leader and rm.partition(TP).leader_epoch == 0


def test_a_request_for_an_earlier_registration_of_this_broker_is_refused() -> None:
    # KIP-380: the broker bounced (new ZooKeeper registration, broker epoch 7).
    rm = manager(broker_epoch=7)
    result = rm.become_leader_or_follower(0, 1, [state(1, 0, (1, 2, 3))], {1, 2, 3}, 0, broker_epoch=6)
    assert result.error == Errors.STALE_BROKER_EPOCH and rm.partition(TP) is None
    assert rm.stop_replicas(0, 1, {TP: True}, 0, broker_epoch=6).error == Errors.STALE_BROKER_EPOCH
    ok = rm.become_leader_or_follower(0, 1, [state(1, 0, (1, 2, 3))], {1, 2, 3}, 0, broker_epoch=7)
    assert ok.error == Errors.NONE and rm.partition(TP).is_leader


def fail_the_log_of(rm: ReplicaManager, io: MemoryFileIO) -> None:
    """The dir's disk dies and the log finds out at its next write (a follower's append)."""
    io.fail_io("/broker-1")
    p = rm.partition(TP)
    with pytest.raises(KafkaStorageError):
        p.log.append_as_follower(records(1), 0)  # the log is empty: offset 0


def test_a_storage_error_in_make_leader_changes_nothing_in_the_partition() -> None:
    # The new leader epoch goes to the log's epoch cache first; when the log refuses it (it
    # failed an I/O), neither the zk version nor the leader may move, or the partition would
    # act in the old epoch with the new zk version (the simulator's seed 9207).
    io = MemoryFileIO()
    rm = ReplicaManager(1, LogManager(["/broker-1"], LogConfig(), io), ReplicationConfig())
    rm.become_leader_or_follower(0, 1, [state(2, 0, (1, 2, 3), zk_version=0)], {1, 2, 3}, 0)
    p = rm.partition(TP)
    fail_the_log_of(rm, io)
    with pytest.raises(KafkaStorageError):
        p.make_leader(state(1, 1, (1, 3), zk_version=1), 0)
    assert (p.leader_id, p.leader_epoch, p.zk_version, p.isr) == (2, 0, 0, frozenset({1, 2, 3}))


def test_a_partition_whose_role_change_fails_on_storage_goes_offline() -> None:
    io = MemoryFileIO()
    rm = ReplicaManager(1, LogManager(["/broker-1"], LogConfig(), io), ReplicationConfig())
    rm.become_leader_or_follower(0, 1, [state(2, 0, (1, 2, 3), zk_version=0)], {1, 2, 3}, 0)
    fail_the_log_of(rm, io)
    result = rm.become_leader_or_follower(0, 1, [state(1, 1, (1, 3), zk_version=1)], {1, 2, 3}, 0)
    assert result.partition_errors == {TP: Errors.KAFKA_STORAGE_ERROR}
    assert RemoveFetcher(TP) in result.fetcher_actions
    assert rm.partition(TP) is None and rm.maybe_shrink_isr(60_000) == []
    io.heal()  # still offline until the broker restarts, as Kafka's offline log dir
    again = rm.become_leader_or_follower(0, 1, [state(1, 2, (1, 3), zk_version=2)], {1, 2, 3}, 0)
    assert again.partition_errors == {TP: Errors.KAFKA_STORAGE_ERROR}
    produced = rm.append_records(1, {TP: records(1)}, 1000, 0)
    assert produced.results[TP].error == Errors.KAFKA_STORAGE_ERROR


def test_partition_states_with_an_old_epoch_or_for_other_brokers_are_refused() -> None:
    rm = manager(1)
    rm.become_leader_or_follower(0, 1, [state(1, 3, (1, 2, 3), zk_version=3)], {1, 2, 3}, 0)
    other = TopicPartition("orders", 7)
    result = rm.become_leader_or_follower(
        0, 1,
        [state(2, 2, (2, 3), zk_version=9), state(2, 0, (2, 3), replicas=(2, 3), tp=other),
         state(1, 3, (1, 2), zk_version=3)],
        {1, 2, 3}, 0,
    )
    assert result.partition_errors == {TP: Errors.STALE_CONTROLLER_EPOCH, other: Errors.UNKNOWN_TOPIC_OR_PARTITION}
    assert rm.partition(other) is None


def test_followers_get_fetchers_from_the_hw_in_their_leaders_epoch() -> None:
    rm = manager(2)
    result = rm.become_leader_or_follower(0, 1, [state(1, 0, (1, 2, 3))], {1, 2, 3}, 0)
    assert result.fetcher_actions == [RemoveFetcher(TP), AddFetcher(TP, 1, 0, 0)]
    # Same epoch, newer zk version (an ISR change): no fetcher restart.
    result = rm.become_leader_or_follower(0, 1, [state(1, 0, (1, 2), zk_version=1)], {1, 2, 3}, 0)
    assert result.fetcher_actions == [] and rm.partition(TP).isr == {1, 2}
    # New epoch, same leader (KAFKA-7164): restart from truncation.
    result = rm.become_leader_or_follower(0, 1, [state(1, 1, (1, 2), zk_version=2)], {1, 2, 3}, 0)
    assert result.fetcher_actions == [RemoveFetcher(TP), AddFetcher(TP, 1, 0, 1)]
    # A leader that is not alive: stop fetching, wait for the next LeaderAndIsr.
    result = rm.become_leader_or_follower(0, 1, [state(3, 2, (3,), zk_version=3)], {1, 2}, 0)
    assert result.fetcher_actions == [RemoveFetcher(TP)]
    # Becoming leader removes the fetcher.
    result = rm.become_leader_or_follower(0, 1, [state(2, 3, (2,), zk_version=4)], {2}, 0)
    assert result.fetcher_actions == [RemoveFetcher(TP)] and rm.partition(TP).is_leader


def test_hw_is_restored_from_the_checkpoint_when_the_partition_is_created() -> None:
    io = MemoryFileIO()
    lm = LogManager(["/b1"], LogConfig(), io)
    log = lm.get_or_create_log(TP.topic, TP.partition)
    log.append_as_leader(records(5), 0, 0)
    log.update_high_watermark(3)
    lm.checkpoint_high_watermarks()  # the highwatermark-checkpoint task's one write path
    log.update_high_watermark(5)  # not checkpointed: a restart goes back to 3
    rm = ReplicaManager(1, LogManager(["/b1"], LogConfig(), io))  # the process restarts
    rm.become_leader_or_follower(0, 1, [state(2, 1, (1, 2))], {1, 2}, 0)
    assert rm.high_watermarks() == {TP: 3}


# ---------------------------------------------------------------- produce


def test_acks_all_completes_once_every_isr_member_has_the_data() -> None:
    c = MiniCluster(config=ReplicationConfig(replica_fetch_wait_max_ms=0),
                    log_config=LogConfig(min_insync_replicas=2))
    c.elect(1, (1, 2, 3))
    outcome = c.produce(1, 3, acks=-1, key="req-1")
    assert outcome.delayed and outcome.results is None
    assert c.rm(1).poll_completed(c.now) == []
    c.step_broker(2)  # fetches the data
    c.step_broker(3)
    c.step_broker(2)  # the next fetches report the new LEOs
    assert c.rm(1).poll_completed(c.now) == []
    c.step_broker(3)
    done = c.rm(1).poll_completed(c.now)
    assert done == [CompleteProduce("req-1", {TP: done[0].results[TP]})]
    assert done[0].results[TP].error == Errors.NONE and done[0].results[TP].base_offset == 0


def test_acks_all_times_out_when_followers_do_not_fetch() -> None:
    c = MiniCluster(config=ReplicationConfig(replica_fetch_wait_max_ms=0, replica_lag_time_max_ms=60_000))
    c.elect(1, (1, 2, 3))
    c.rm(1).append_records(-1, {TP: records(1)}, timeout_ms=1_000, now_ms=0, request_key="k")
    assert c.rm(1).next_deadline_ms() == 1_000
    assert c.rm(1).poll_completed(999) == []
    [done] = c.rm(1).poll_completed(1_000)
    assert done.results[TP].error == Errors.REQUEST_TIMED_OUT


def test_acks_all_with_too_small_an_isr_is_refused_and_acks_1_is_not() -> None:
    c = MiniCluster(config=ReplicationConfig(replica_fetch_wait_max_ms=0),
                    log_config=LogConfig(min_insync_replicas=2))
    c.elect(1, (1,))
    assert c.produce(1, 1, acks=-1, key="k").results[TP].error == Errors.NOT_ENOUGH_REPLICAS
    assert c.produce(1, 1, acks=1).results[TP].error == Errors.NONE
    assert c.produce(1, 1, acks=2).results[TP].error == Errors.INVALID_REQUIRED_ACKS


def test_the_topics_min_insync_replicas_overrides_the_brokers_default() -> None:
    # Brokers default to 1; the topic says 2 (CreateTopics --config): the topic's value rules.
    c = MiniCluster(config=ReplicationConfig(replica_fetch_wait_max_ms=0))
    for b in c.replicas:
        c.rm(b).log_manager.topic_configs[TP.topic] = LogConfig(min_insync_replicas=2)
    other = TopicPartition("other", 0)
    c.elect(1, (1,))
    c.elect(1, (1,), tp=other)
    assert c.produce(1, 1, acks=-1, key="k").results[TP].error == Errors.NOT_ENOUGH_REPLICAS
    assert c.rm(1).partition(TP).log_end_offset == 0
    out = c.produce(1, 1, acks=-1, tp=other, key="o")  # the broker default: 1
    assert out.results[other].error == Errors.NONE and not out.delayed


def test_a_topic_config_change_applies_to_its_partitions_at_once() -> None:
    c = MiniCluster(config=ReplicationConfig(replica_fetch_wait_max_ms=0))
    c.elect(1, (1,))
    assert c.produce(1, 1, acks=-1, key="a").results[TP].error == Errors.NONE
    c.rm(1).log_manager.update_topic_config(TP.topic, LogConfig(min_insync_replicas=2))
    assert c.produce(1, 1, acks=-1, key="b").results[TP].error == Errors.NOT_ENOUGH_REPLICAS


def test_pending_acks_all_fails_when_the_isr_falls_below_min_insync() -> None:
    c = MiniCluster(n=2, config=ReplicationConfig(replica_fetch_wait_max_ms=0,
                                                  replica_lag_time_max_ms=1_000),
                    log_config=LogConfig(min_insync_replicas=2))
    c.elect(1, (1, 2))
    assert c.produce(1, 1, acks=-1, key="k").delayed
    c.stop(2)
    c.run(steps=11, dt=100)  # 2 is shrunk out: ISR [1] < 2
    assert c.zk[TP].isr == (1,)
    [done] = c.rm(1).poll_completed(c.now)
    assert done.results[TP].error == Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND


def test_pending_acks_all_fails_when_leadership_moves() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    assert c.produce(1, 1, acks=-1, key="k").delayed
    c.elect(2, (2, 3))
    [done] = c.rm(1).poll_completed(c.now)
    assert done.results[TP].error == Errors.NOT_LEADER_OR_FOLLOWER


def test_produce_to_a_follower_or_unknown_partition() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    assert c.produce(2, 1).results[TP].error == Errors.NOT_LEADER_OR_FOLLOWER
    other = TopicPartition("nope", 0)
    assert c.rm(1).append_records(1, {other: records(1)}, 1_000, 0).results[other].error == (
        Errors.UNKNOWN_TOPIC_OR_PARTITION
    )
    bad = bytearray(records(2))
    bad[-1] ^= 1
    assert c.rm(1).append_records(1, {TP: bytes(bad)}, 1_000, 0).results[TP].error == Errors.CORRUPT_MESSAGE
    assert c.rm(1).append_records(1, {TP: b"\x00" * 30}, 1_000, 0).results[TP].error == Errors.CORRUPT_MESSAGE
    empty = c.rm(1).append_records(-1, {TP: b""}, 1_000, 0, request_key="e")
    assert not empty.delayed and empty.results[TP].error == Errors.NONE and empty.results[TP].base_offset == -1
    assert c.log(1).log_end_offset == 0


# ---------------------------------------------------------------- fetch


def consumer_fetch(rm: ReplicaManager, offset: int, now_ms: int, epoch: int = -1,
                   **kw: Any) -> FetchOutcome:
    return rm.fetch_messages(CONSUMER_REPLICA_ID, kw.pop("max_wait", 0), kw.pop("min_bytes", 1),
                             1 << 20, {TP: (offset, epoch, 0, 1 << 20)}, now_ms, **kw)


def test_a_new_leader_makes_consumers_wait_until_its_hw_reaches_its_epoch_start() -> None:
    # DESIGN's MonotonicHighWatermark: the old leader published HW 5, this follower only learnt
    # 2. Elected, it must not show consumers 2 after 5: OFFSET_NOT_AVAILABLE (retriable) until
    # its HW reaches the start offset of its epoch (5), as KIP-207 does for ListOffsets.
    rm = manager(1)
    rm.become_leader_or_follower(0, 1, [state(2, 0, (1, 2, 3))], {1, 2, 3}, 0)
    p = rm.partition(TP)
    p.log.append_as_follower(build_values([b"v"] * 5, base_offset=0, partition_leader_epoch=0), 0)
    p.log.update_high_watermark(2)
    rm.become_leader_or_follower(0, 1, [state(1, 1, (1, 2), zk_version=1)], {1, 2, 3}, 0)
    assert consumer_fetch(rm, 0, 0).results[TP].error == Errors.OFFSET_NOT_AVAILABLE
    follower = rm.fetch_messages(2, 0, 1, 1 << 20, {TP: (5, 1, 0, 1 << 20)}, 10).results[TP]
    assert follower.error == Errors.NONE  # replicas are never held back
    result = consumer_fetch(rm, 0, 10).results[TP]
    assert (result.error, result.high_watermark) == (Errors.NONE, 5)


def test_without_the_guard_a_new_leader_shows_consumers_an_older_hw() -> None:
    # Kafka's Fetch (consumer_hw_guard=False): the HW a consumer sees goes back from 5 to 2.
    rm = manager(1, ReplicationConfig(consumer_hw_guard=False))
    rm.become_leader_or_follower(0, 1, [state(2, 0, (1, 2, 3))], {1, 2, 3}, 0)
    p = rm.partition(TP)
    p.log.append_as_follower(build_values([b"v"] * 5, base_offset=0, partition_leader_epoch=0), 0)
    p.log.update_high_watermark(2)
    rm.become_leader_or_follower(0, 1, [state(1, 1, (1, 2), zk_version=1)], {1, 2, 3}, 0)
    result = consumer_fetch(rm, 0, 0).results[TP]
    assert (result.error, result.high_watermark) == (Errors.NONE, 2)


def test_consumers_read_only_below_the_hw() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    c.produce(1, 2)
    c.run(3)
    c.produce(1, 3)  # not replicated yet: offsets 2..4 are above the HW
    result = consumer_fetch(c.rm(1), 0, c.now).results[TP]
    assert result.high_watermark == 2
    from tidelog.protocol.records.batch import iter_batches

    assert [b.last_offset for b in iter_batches(result.records)] == [1]
    assert consumer_fetch(c.rm(1), 2, c.now).results[TP].records == b""
    assert consumer_fetch(c.rm(1), 6, c.now).results[TP].error == Errors.OFFSET_OUT_OF_RANGE


def test_a_fetch_answer_carries_the_log_read_without_copying_it() -> None:
    # The read returned immutable bytes: the answer is a view of them (a fetch answer under
    # the sendfile size was copied once more here before it was written to the socket).
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    c.produce(1, 3)
    c.run(3)
    records = consumer_fetch(c.rm(1), 0, c.now).results[TP].records
    assert type(records) is memoryview and type(records.obj) is bytes
    assert [b.last_offset for b in iter_batches(records)] == [2]


def test_records_viewing_a_mutable_buffer_are_copied_before_they_leave_the_core() -> None:
    from tidelog.replication.replica_manager import _as_bytes

    buffer = bytearray(b"batch")
    answered = _as_bytes(memoryview(buffer))
    buffer[:] = b"xxxxx"  # the buffer changes after the answer was made
    assert bytes(answered) == b"batch"
    immutable = memoryview(b"batch")
    assert _as_bytes(immutable) is immutable


def test_fetches_are_fenced_by_the_current_leader_epoch() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    c.elect(1, (1, 2, 3))  # epoch 1
    rm = c.rm(1)
    assert consumer_fetch(rm, 0, 0, epoch=0).results[TP].error == Errors.FENCED_LEADER_EPOCH
    assert consumer_fetch(rm, 0, 0, epoch=2).results[TP].error == Errors.UNKNOWN_LEADER_EPOCH
    assert consumer_fetch(rm, 0, 0, epoch=1).results[TP].error == Errors.NONE
    zombie = rm.fetch_messages(2, 0, 1, 1 << 20, {TP: (0, 0, 0, 1 << 20)}, 0)
    assert zombie.results[TP].error == Errors.FENCED_LEADER_EPOCH
    assert c.rm(2).fetch_messages(3, 0, 1, 1 << 20, {TP: (0, 1, 0, 1 << 20)}, 0).results[TP].error == (
        Errors.NOT_LEADER_OR_FOLLOWER
    )
    # pre-KIP-320: nothing checked
    naive = MiniCluster(config=ReplicationConfig(replica_fetch_wait_max_ms=0, fence_leader_epochs=False))
    naive.elect(1, (1, 2, 3))
    naive.elect(1, (1, 2, 3))
    assert naive.rm(1).fetch_messages(2, 0, 1, 1 << 20, {TP: (0, 0, 0, 1 << 20)}, 0).results[TP].error == Errors.NONE


def test_delayed_fetch_waits_for_min_bytes_then_completes_when_the_hw_moves() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2))
    rm = c.rm(1)
    outcome = consumer_fetch(rm, 0, c.now, max_wait=500, min_bytes=1, request_key="f1")
    assert outcome.delayed
    c.produce(1, 2)  # above the HW: a consumer still has nothing
    assert rm.poll_completed(c.now) == []
    c.run(2)  # follower 2 fetches twice: the HW moves to 2
    [done] = rm.poll_completed(c.now)
    assert isinstance(done, CompleteFetch) and done.request_key == "f1"
    assert done.results[TP].high_watermark == 2 and len(done.results[TP].records) > 0


def test_delayed_fetch_answers_empty_at_max_wait() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    assert consumer_fetch(c.rm(1), 0, 100, max_wait=500, request_key="f").delayed
    assert c.rm(1).poll_completed(599) == []
    [done] = c.rm(1).poll_completed(600)
    assert done.results[TP].error == Errors.NONE and done.results[TP].records == b""


@pytest.mark.parametrize("shell_reports_offline", [True, False])
def test_a_fetch_from_a_replica_that_went_offline_does_not_re_add_it(shell_reports_offline: bool) -> None:
    # KIP-841: 3 dies and the controller removes it from the ISR (same leader epoch here, so
    # epoch fencing does not help); a fetch 3 sent before it died arrives after that: the leader
    # must not propose 3 back.
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    rm = c.rm(1)
    removed = state(1, 0, (1, 2), zk_version=1)
    assert rm.become_leader_or_follower(0, 1, [removed], {1, 2}, c.now).partition_errors == {TP: Errors.NONE}
    if shell_reports_offline:
        rm.set_eligible_brokers({1: 10, 2: 11})
    late = rm.fetch_messages(3, 0, 1, 1 << 20, {TP: (0, 0, 0, 1 << 20)}, c.now)
    assert late.results[TP].error == Errors.NONE
    if shell_reports_offline:
        assert late.isr_proposals == () and rm.partition(TP).pending_isr is None
    else:  # the bug KIP-841 fixed
        assert [p.new_isr for p in late.isr_proposals] == [(1, 2, 3)]


def test_a_held_fetch_completing_after_its_replica_left_the_isr_proposes_nothing() -> None:
    # A held fetch records nothing when it completes (Kafka's updateFetchState =
    # !readFromPurgatory), so released by new data it cannot re-add a replica that left.
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    rm = c.rm(1)
    assert rm.fetch_messages(3, 500, 1, 1 << 20, {TP: (0, 0, 0, 1 << 20)}, c.now,
                             request_key="held").delayed
    removed = state(1, 0, (1, 2), zk_version=1)
    assert rm.become_leader_or_follower(0, 1, [removed], {1, 2}, c.now).partition_errors == {TP: Errors.NONE}
    c.produce(1, 1)
    [done] = rm.poll_completed(c.now)
    assert done.request_key == "held" and len(done.results[TP].records) > 0
    assert done.isr_proposals == () and rm.partition(TP).pending_isr is None


# ---------------------------------------------------------------- epochs, offsets, stop


def test_last_offset_for_leader_epoch_and_list_offsets() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    c.produce(1, 3)
    c.elect(1, (1, 2, 3))  # epoch 1 starts at 3
    c.produce(1, 2)
    rm = c.rm(1)
    answer = rm.last_offset_for_leader_epoch(2, {TP: (1, 0)})[TP]
    assert (answer.error, answer.leader_epoch, answer.end_offset) == (Errors.NONE, 0, 3)
    assert rm.last_offset_for_leader_epoch(2, {TP: (0, 0)})[TP].error == Errors.FENCED_LEADER_EPOCH
    assert c.rm(2).last_offset_for_leader_epoch(3, {TP: (1, 0)})[TP].error == Errors.NOT_LEADER_OR_FOLLOWER
    offsets = rm.list_offsets(2, {TP: (1, LATEST_TIMESTAMP)})[TP]
    assert (offsets.offset, offsets.leader_epoch) == (5, 1)
    assert rm.list_offsets(2, {TP: (1, EARLIEST_TIMESTAMP)})[TP].offset == 0
    # KIP-207: the new epoch's HW (0) is below its start offset (3): consumers must wait.
    assert rm.list_offsets(CONSUMER_REPLICA_ID, {TP: (1, LATEST_TIMESTAMP)})[TP].error == Errors.OFFSET_NOT_AVAILABLE
    c.run(3)
    assert rm.list_offsets(CONSUMER_REPLICA_ID, {TP: (1, LATEST_TIMESTAMP)})[TP].offset == 5


def test_list_offsets_by_timestamp_finds_the_first_batch_at_or_after_it() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    for ts in (100, 200, 300):
        c.rm(1).append_records(1, {TP: build_values([b"x"], base_timestamp=ts)}, 1_000, c.now)
    c.run(3)
    c.rm(1).append_records(1, {TP: build_values([b"y"], base_timestamp=400)}, 1_000, c.now)
    rm = c.rm(1)
    found = rm.list_offsets(CONSUMER_REPLICA_ID, {TP: (-1, 150)})[TP]
    assert (found.error, found.offset, found.timestamp) == (Errors.NONE, 1, 200)
    # offset 3 (ts 400) is above the HW: a consumer does not see it, a replica does
    assert rm.list_offsets(CONSUMER_REPLICA_ID, {TP: (-1, 350)})[TP].offset == -1
    assert rm.list_offsets(2, {TP: (-1, 350)})[TP].offset == 3
    assert rm.list_offsets(CONSUMER_REPLICA_ID, {TP: (-1, 999)})[TP].offset == -1
    assert rm.list_offsets(CONSUMER_REPLICA_ID, {TP: (-1, -7)})[TP].error == Errors.INVALID_REQUEST


def test_a_follower_long_poll_at_the_leo_is_answered_when_the_leader_appends() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    rm = c.rm(1)
    held = rm.fetch_messages(2, 500, 1, 1 << 20, {TP: (0, 0, 0, 1 << 20)}, c.now, request_key="f2")
    assert held.delayed
    c.produce(1, 2)
    [done] = rm.poll_completed(c.now)
    assert done.request_key == "f2" and done.results[TP].error == Errors.NONE
    assert len(done.results[TP].records) > 0


def test_stop_replicas_removes_fetchers_and_deletes_when_asked() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    rm2 = c.rm(2)
    assert rm2.stop_replicas(0, 0, {TP: True}, 0).error == Errors.STALE_CONTROLLER_EPOCH
    result = rm2.stop_replicas(0, 1, {TP: False}, 0)
    assert result.fetcher_actions == [RemoveFetcher(TP)] and rm2.partition(TP) is not None
    result = rm2.stop_replicas(0, 1, {TP: True}, 0)
    assert rm2.partition(TP) is None and c.brokers[2][0].get_log(TP.topic, TP.partition) is None


def test_a_debugging_fetch_is_answered_by_any_replica_with_its_own_high_watermark() -> None:
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    c.produce(1, 3)
    for b in (2, 3, 2, 3):
        c.step_broker(b)
    c.produce(1, 2)
    for b in (2, 3, 2, 3):
        c.step_broker(b)
    hws = {b: c.rm(b).partition(TP).high_watermark for b in (1, 2, 3)}
    assert hws[1] == 5 and min(hws[2], hws[3]) < 5  # a follower learns the HW one fetch late
    for b in (1, 2, 3):
        leo = c.rm(b).partition(TP).log_end_offset
        out = c.rm(b).fetch_messages(DEBUGGING_REPLICA_ID, 0, 0, 1 << 20, {TP: (0, -1, -1, 1 << 20)},
                                     c.now)
        data = out.results[TP]
        assert (data.error, data.high_watermark) == (Errors.NONE, hws[b])
        # Read as a consumer's, to the replica's own HW (Kafka's FetchIsolation.of), not its
        # LEO (5 everywhere).
        assert max((b.last_offset + 1 for b in iter_batches(data.records)), default=0) == hws[b]
        assert leo == 5
    consumer = c.rm(2).fetch_messages(CONSUMER_REPLICA_ID, 0, 0, 1 << 20, {TP: (0, -1, -1, 1 << 20)},
                                      c.now)
    assert consumer.results[TP].error == Errors.NOT_LEADER_OR_FOLLOWER


def test_a_held_follower_fetch_is_recorded_once_when_it_arrives_not_again_when_it_completes() -> None:
    # Kafka's DelayedFetch.onComplete reads the log without updateFollowerFetchState: the
    # follower's fetch state is the one its request set when it arrived.
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    rm = c.rm(1)
    assert rm.fetch_messages(2, 500, 1, 1 << 20, {TP: (0, 0, 0, 1 << 20)}, 100,
                             request_key="held").delayed
    [done] = rm.poll_completed(600)
    assert done.request_key == "held" and done.results[TP].error == Errors.NONE
    follower = rm.partition(TP).remote_replicas[2]
    assert (follower.last_fetch_time_ms, follower.last_caught_up_time_ms) == (100, 100)


def test_a_debugging_fetch_is_fenced_by_its_leader_epoch_as_any_fetch() -> None:
    # Kafka's Partition.fetchRecords checks the request's current leader epoch for every
    # fetch (localLogWithEpochOrThrow), the debugging replica id's too.
    c = MiniCluster()
    c.elect(1, (1, 2, 3))
    c.elect(1, (1, 2, 3))  # epoch 1 on every replica
    for b in (1, 2):
        rm = c.rm(b)
        assert rm.partition(TP).leader_epoch == 1

        def fetch(epoch: int, rm: ReplicaManager = rm) -> Errors:
            out = rm.fetch_messages(DEBUGGING_REPLICA_ID, 0, 0, 1 << 20,
                                    {TP: (0, epoch, -1, 1 << 20)}, c.now)
            return out.results[TP].error

        assert (fetch(0), fetch(2)) == (Errors.FENCED_LEADER_EPOCH, Errors.UNKNOWN_LEADER_EPOCH)
        assert fetch(1) == fetch(-1) == Errors.NONE
