"""The transactional id state machine (Kafka's TransactionMetadata): prepared transitions
applied only when completed, Kafka's valid previous states, KIP-360 epoch bumps, fencing."""

from __future__ import annotations

import pytest

from tidelog.coordinator.transaction.metadata import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    IllegalTransitionError,
    TransactionMetadata,
    TransactionState,
    is_epoch_exhausted,
)
from tidelog.replication.types import TopicPartition

S = TransactionState
TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)


def new_id() -> TransactionMetadata:
    return TransactionMetadata("t", 7, NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_PRODUCER_EPOCH,
                               60_000, S.EMPTY)


def initialized() -> TransactionMetadata:
    md = new_id()
    t = md.prepare_increment_producer_epoch(60_000, None, 100)
    assert not isinstance(t, str)
    md.complete_transition_to(t)
    return md


def ongoing(*tps: TopicPartition) -> TransactionMetadata:
    md = initialized()
    md.complete_transition_to(md.prepare_add_partitions(set(tps or (TP0,)), 200))
    return md


def test_a_new_producer_gets_epoch_0_once_the_write_completes() -> None:
    md = new_id()
    t = md.prepare_increment_producer_epoch(60_000, None, 100)
    assert not isinstance(t, str)
    assert (t.producer_epoch, t.txn_state) == (0, S.EMPTY)
    assert md.producer_epoch == NO_PRODUCER_EPOCH and md.pending_state == S.EMPTY
    md.complete_transition_to(t)
    assert (md.producer_epoch, md.pending_state, md.txn_last_update_timestamp) == (0, None, 100)


def test_a_whole_commit_goes_through_kafkas_states() -> None:
    md = initialized()
    md.complete_transition_to(md.prepare_add_partitions({TP0}, 200))
    assert (md.state, md.topic_partitions, md.txn_start_timestamp) == (S.ONGOING, {TP0}, 200)
    md.complete_transition_to(md.prepare_add_partitions({TP1}, 300))
    assert md.topic_partitions == {TP0, TP1} and md.txn_start_timestamp == 200
    md.complete_transition_to(md.prepare_abort_or_commit(S.PREPARE_COMMIT, 400))
    assert md.state == S.PREPARE_COMMIT and md.topic_partitions == {TP0, TP1}
    complete = md.prepare_complete(500)
    assert complete.txn_state == S.COMPLETE_COMMIT and not complete.topic_partitions
    md.complete_transition_to(complete)
    assert md.state == S.COMPLETE_COMMIT and not md.topic_partitions
    # The next transaction starts from Complete with a new start time.
    md.complete_transition_to(md.prepare_add_partitions({TP1}, 600))
    assert md.state == S.ONGOING and md.txn_start_timestamp == 600


def test_a_failed_write_leaves_the_state_as_it_was() -> None:
    md = initialized()
    md.prepare_add_partitions({TP0}, 200)
    md.abort_pending()
    assert md.state == S.EMPTY and not md.topic_partitions and md.pending_state is None


def test_only_one_transition_is_pending_at_a_time() -> None:
    md = initialized()
    md.prepare_add_partitions({TP0}, 200)
    with pytest.raises(IllegalTransitionError):
        md.prepare_add_partitions({TP1}, 201)


@pytest.mark.parametrize("prepare", [
    lambda md: md.prepare_abort_or_commit(S.PREPARE_COMMIT, 1),  # EndTxn with no transaction
    lambda md: md.prepare_complete(1),
    lambda md: md.prepare_fence_producer_epoch(),
])
def test_transitions_kafka_does_not_allow_from_empty_are_refused(prepare) -> None:  # type: ignore[no-untyped-def]
    md = initialized()
    with pytest.raises(IllegalTransitionError):
        prepare(md)
    assert md.pending_state is None


def test_kip_360_bump_with_the_current_epoch_records_the_last_one() -> None:
    md = initialized()
    t = md.prepare_increment_producer_epoch(60_000, 0, 300)
    assert not isinstance(t, str) and (t.producer_epoch, t.last_producer_epoch) == (1, 0)
    md.complete_transition_to(t)
    # A retry of that bump (its answer was lost) gets the same epoch again.
    retry = md.prepare_increment_producer_epoch(60_000, 0, 400)
    assert not isinstance(retry, str) and (retry.producer_epoch, retry.last_producer_epoch) == (1, 0)
    md.abort_pending()
    # Any other epoch is a zombie.
    assert md.prepare_increment_producer_epoch(60_000, 5, 500) == "PRODUCER_FENCED"


def test_fencing_an_ongoing_transaction_bumps_the_epoch_once() -> None:
    md = ongoing()
    fence = md.prepare_fence_producer_epoch()
    assert (fence.txn_state, fence.producer_epoch, fence.last_producer_epoch) == (
        S.PREPARE_EPOCH_FENCE, 1, NO_PRODUCER_EPOCH)
    md.abort_pending()
    md.has_failed_epoch_fence = True  # the abort under epoch 1 was never written
    assert md.prepare_fence_producer_epoch().producer_epoch == 0  # epoch 1 is not handed out twice


def test_the_last_epochs_are_kept_for_fencing() -> None:
    assert not is_epoch_exhausted(32_765)
    assert is_epoch_exhausted(32_766)


def test_producer_id_rotation_starts_again_at_epoch_0() -> None:
    md = initialized()
    t = md.prepare_producer_id_rotation(8, 60_000, 900, record_last_epoch=True)
    md.complete_transition_to(t)
    assert (md.producer_id, md.producer_epoch, md.last_producer_id, md.last_producer_epoch) == (
        8, 0, 7, 0)
