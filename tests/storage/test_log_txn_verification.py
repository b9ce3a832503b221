"""KIP-890's verification guard in the log: with verification required, a transactional batch
of a producer with no transaction open here is appended only with the guard its verification
got; an append by the producer (its transaction began, or a marker ended it) drops the guard,
so a verification that raced with an abort marker is refused; without verification the log
appends as before."""

from __future__ import annotations

import pytest
from test_log_transactions import COORDINATOR, marker, new_log, txn

from tidelog.storage.producer_state_manager import VerificationGuard
from tidelog.storage.transactions import InvalidTxnStateError

SENTINEL = VerificationGuard.SENTINEL


def test_a_transactional_batch_needs_its_verification_guard() -> None:
    log = new_log()
    with pytest.raises(InvalidTxnStateError):
        log.append_as_leader(txn(7), 0, 0, verification_guard=SENTINEL)
    with pytest.raises(InvalidTxnStateError):  # a guard not made here
        log.append_as_leader(txn(7), 0, 0, verification_guard=VerificationGuard())
    assert log.log_end_offset == 0

    guard = log.maybe_start_transaction_verification(7, now_ms=0)
    assert guard is not SENTINEL
    assert log.maybe_start_transaction_verification(7, now_ms=1) is guard  # shared while pending
    assert log.append_as_leader(txn(7, b"a"), 0, 0, verification_guard=guard).first_offset == 0
    # The transaction is open here now: nothing to verify, the next batch goes in unguarded.
    assert log.maybe_start_transaction_verification(7, now_ms=2) is SENTINEL
    assert log.append_as_leader(txn(7, b"b", seq=1), 0, 0,
                                verification_guard=SENTINEL).first_offset == 1


def test_an_abort_marker_written_during_the_verification_voids_its_guard() -> None:
    log = new_log()
    guard = log.maybe_start_transaction_verification(7, now_ms=0)
    # The coordinator aborted meanwhile: its marker reaches this partition first.
    log.append_as_leader(marker(7, commit=False), 0, 0, COORDINATOR)
    with pytest.raises(InvalidTxnStateError):
        log.append_as_leader(txn(7), 0, 0, verification_guard=guard)
    assert log.log_end_offset == 1  # the marker only
    # A new verification makes a new guard (the stale one stays refused).
    fresh = log.maybe_start_transaction_verification(7, now_ms=1)
    assert fresh is not guard
    assert log.append_as_leader(txn(7), 0, 0, verification_guard=fresh).first_offset == 1


def test_without_verification_a_transactional_batch_is_appended_as_before() -> None:
    log = new_log()
    assert log.append_as_leader(txn(7), 0, 0).first_offset == 0


def test_a_verification_not_followed_by_an_append_expires_with_the_producers() -> None:
    log = new_log()
    log.producer_state_manager.producer_id_expiration_ms = 100
    guard = log.maybe_start_transaction_verification(7, now_ms=0)
    log.remove_expired_producers(now_ms=99)
    assert log.producer_state_manager.verification_guard(7) is guard
    log.remove_expired_producers(now_ms=100)
    assert log.producer_state_manager.verification_guard(7) is SENTINEL
