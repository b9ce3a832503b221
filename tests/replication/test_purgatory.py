"""The purgatory's bookkeeping: watch per key, complete once, expire by deadline."""

from __future__ import annotations

from tidelog.replication import DelayedOperationPurgatory, DelayedProduce, Errors, TopicPartition
from tidelog.replication.purgatory import ProducePartitionStatus
from tidelog.replication.types import ProducePartitionResult

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def produce_op(key: str, deadline: int, hw: dict[TopicPartition, int]) -> DelayedProduce:
    statuses = {tp: ProducePartitionStatus(5, ProducePartitionResult(Errors.NONE, 4)) for tp in (A, B)}
    return DelayedProduce(key, deadline, statuses, lambda tp, required: (hw[tp] >= required, Errors.NONE))


def test_an_operation_on_two_partitions_completes_once_when_both_are_done() -> None:
    hw = {A: 0, B: 0}
    purgatory = DelayedOperationPurgatory("Produce")
    assert purgatory.try_complete_else_watch(produce_op("r", 1_000, hw), 0) is None
    assert len(purgatory) == 1 and set(purgatory.watched_keys()) == {A, B}
    hw[A] = 5
    assert purgatory.check_and_complete(A, 10) == []
    hw[B] = 5
    [done] = purgatory.check_and_complete(B, 20)
    assert done.request_key == "r" and done.results[A].base_offset == 4
    assert len(purgatory) == 0
    assert purgatory.check_and_complete(A, 30) == []  # the stale watch under A is dropped
    assert purgatory.expire(5_000) == []
    assert purgatory.next_deadline_ms() is None


def test_expiry_answers_the_unfinished_partitions_with_a_timeout() -> None:
    hw = {A: 5, B: 0}
    purgatory = DelayedOperationPurgatory("Produce")
    purgatory.try_complete_else_watch(produce_op("late", 1_000, hw), 0)
    purgatory.try_complete_else_watch(produce_op("later", 2_000, hw), 0)
    assert purgatory.next_deadline_ms() == 1_000
    assert purgatory.expire(999) == []
    [done] = purgatory.expire(1_000)
    assert done.request_key == "late"
    assert (done.results[A].error, done.results[B].error) == (Errors.NONE, Errors.REQUEST_TIMED_OUT)
    assert purgatory.next_deadline_ms() == 2_000


def test_an_operation_that_can_complete_at_once_is_not_watched() -> None:
    purgatory = DelayedOperationPurgatory("Produce")
    done = purgatory.try_complete_else_watch(produce_op("now", 1_000, {A: 9, B: 9}), 0)
    assert done is not None and done.results[B].error == Errors.NONE and len(purgatory) == 0


def test_an_idle_key_keeps_only_live_watches_however_many_operations_expired_on_it() -> None:
    hw = {A: 0, B: 0}
    purgatory = DelayedOperationPurgatory("Produce")
    for i in range(100):  # as idle follower fetches: each waits, expires, the next one watches
        purgatory.try_complete_else_watch(produce_op(f"r{i}", i * 10 + 5, hw), i * 10)
        assert len(purgatory.expire(i * 10 + 5)) == 1
    purgatory.try_complete_else_watch(produce_op("live", 2_000, hw), 1_000)
    assert [op.request_key for op in purgatory._watchers[A]] == ["live"]
    assert [op.request_key for op in purgatory._watchers[B]] == ["live"]


def test_a_hw_advance_tries_only_the_requests_it_can_complete_and_a_lower_retried_one() -> None:
    """Pipelined acks=all requests on one partition: once one waits for an offset the HW has
    not reached, those watched after it for as much or more are not tried; a retried batch
    answered with its original, lower offset (watched later) still completes."""
    hw = {A: 0}
    checked: list[int] = []

    def check(tp: TopicPartition, required: int) -> tuple[bool, Errors]:
        checked.append(required)
        return hw[tp] >= required, Errors.NONE

    def op(key: str, required: int) -> DelayedProduce:
        status = ProducePartitionStatus(required, ProducePartitionResult(Errors.NONE, required - 1))
        return DelayedProduce(key, 1_000, {A: status}, check)

    purgatory = DelayedOperationPurgatory("Produce")
    for i in range(1, 101):
        purgatory.try_complete_else_watch(op(f"r{i}", i), 0)
    purgatory.try_complete_else_watch(op("retried", 3), 0)
    hw[A] = 3
    checked.clear()
    done = purgatory.check_and_complete(A, 10)
    assert [d.request_key for d in done] == ["r1", "r2", "r3", "retried"]
    assert checked == [1, 2, 3, 4, 3]  # r5..r100 not tried
    assert len(purgatory) == 97
    hw[A] = 100
    assert len(purgatory.check_and_complete(A, 20)) == 97
