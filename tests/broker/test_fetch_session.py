"""Fetch sessions (KIP-227) on the broker: Kafka's FetchManager and FetchSessionCache — session
creation, incremental updates, forgotten partitions, the epoch checks, the errors and the
eviction rules (privileged followers, stale sessions, the newer bigger session)."""

from __future__ import annotations

import random
from uuid import UUID

from tidelog.broker.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    FetchManager,
    FetchSessionCache,
    FullFetchContext,
    IncrementalFetchContext,
    PartitionResponse,
    SessionErrorContext,
    SessionlessFetchContext,
    TopicIdPartition,
    next_epoch,
)
from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import TopicPartition

A, B, C = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)
EVICTION_MS = 120_000


def req(offset: int, max_bytes: int = 1000) -> tuple[int, int, int, int, int]:
    return (offset, 0, 0, max_bytes, -1)


def resp(hw: int, records: int = 0, error: int = 0, log_start: int = 0) -> PartitionResponse:
    return PartitionResponse(error, hw, log_start, records)


def manager(slots: int = 10) -> FetchManager:
    return FetchManager(FetchSessionCache(slots, EVICTION_MS, random.Random(7)))


def open_session(fm: FetchManager, parts: dict, now: int = 0, follower: bool = True,
                 hw: int = 5) -> int:
    ctx = fm.new_context(0, INITIAL_EPOCH, parts, [], follower, now)
    assert isinstance(ctx, FullFetchContext)
    error, sid, answered = ctx.update_and_generate_response({tp: resp(hw) for tp in parts}, now)
    assert error == 0 and answered == list(parts)
    return sid


def read_order(fm: FetchManager, sid: int) -> list[TopicPartition]:
    session = fm.cache.get(sid)
    assert session is not None
    return sorted(session.partitions, key=lambda tp: session.partitions[tp].seq)


def test_next_epoch_wraps_to_one_and_stays_final() -> None:
    assert next_epoch(0) == 1 and next_epoch(41) == 42
    assert next_epoch(2**31 - 1) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH


def test_a_full_fetch_creates_a_session_and_incremental_ones_answer_only_changes() -> None:
    fm = manager()
    sid = open_session(fm, {A: req(0), B: req(0)})
    assert sid != INVALID_SESSION_ID and fm.cache.size == 1 and fm.cache.num_partitions == 2
    # Epoch 1, nothing listed: a new session reads every partition once; nothing changed.
    ctx = fm.new_context(sid, 1, {}, [], True, 10)
    assert isinstance(ctx, IncrementalFetchContext)
    assert ctx.partitions() == {A: req(0), B: req(0)}
    assert ctx.update_and_generate_response({A: resp(5), B: resp(5)}, 10) == (0, sid, [])
    # Epoch 2: both changed; B has records, answered, and goes to the back.
    fm.mark_changed(A)
    fm.mark_changed(B)
    ctx = fm.new_context(sid, 2, {}, [], True, 20)
    assert ctx.partitions() == {A: req(0), B: req(0)}
    assert ctx.update_and_generate_response({A: resp(5), B: resp(5, records=100)}, 20) == (
        0, sid, [B])
    # Records were read: everything read is read again (max_bytes may have cut one short).
    ctx = fm.new_context(sid, 3, {}, [], True, 30)
    assert ctx.partitions() == {A: req(0), B: req(0)}
    assert ctx.update_and_generate_response({A: resp(6), B: resp(5)}, 30) == (0, sid, [A])
    assert read_order(fm, sid) == [B, A]
    # A listed partition updates the cached request parameters; a new one joins the session.
    ctx = fm.new_context(sid, 4, {B: req(9), C: req(3)}, [], True, 40)
    assert ctx.partitions() == {B: req(9), A: req(0), C: req(3)}
    # C is new (no cached HW): answered once, then only on change.
    assert ctx.update_and_generate_response({B: resp(5), A: resp(6), C: resp(3)}, 40) == (
        0, sid, [C])


def test_log_start_offset_changes_and_errors_are_always_answered() -> None:
    fm = manager()
    sid = open_session(fm, {A: req(0)})
    ctx = fm.new_context(sid, 1, {}, [], True, 1)
    assert ctx.update_and_generate_response({A: resp(5, log_start=2)}, 1)[2] == [A]
    ctx = fm.new_context(sid, 2, {}, [], True, 2)
    assert ctx.update_and_generate_response({A: resp(-1, error=6, log_start=2)}, 2)[2] == [A]
    ctx = fm.new_context(sid, 3, {}, [], True, 3)
    assert ctx.update_and_generate_response({A: resp(-1, error=6, log_start=2)}, 3)[2] == [A]
    # The error gone, the partition is sent again (its cached HW was invalidated).
    ctx = fm.new_context(sid, 4, {}, [], True, 4)
    assert ctx.update_and_generate_response({A: resp(5, log_start=2)}, 4)[2] == [A]


def test_forgotten_partitions_leave_the_session_and_the_last_one_closes_it() -> None:
    fm = manager()
    sid = open_session(fm, {A: req(0), B: req(0)})
    ctx = fm.new_context(sid, 1, {}, [A], True, 1)
    assert ctx.partitions() == {B: req(0)} and fm.cache.num_partitions == 1
    ctx.update_and_generate_response({B: resp(5)}, 1)
    ctx = fm.new_context(sid, 2, {}, [B], True, 2)
    assert isinstance(ctx, SessionlessFetchContext) and ctx.partitions() == {}
    assert fm.cache.get(sid) is None and fm.cache.num_partitions == 0


def test_session_errors_are_kafkas() -> None:
    fm = manager()
    sid = open_session(fm, {A: req(0)})
    unknown = fm.new_context(sid + 1, 1, {A: req(0)}, [], True, 1)
    assert isinstance(unknown, SessionErrorContext) and unknown.partitions() == {}
    assert unknown.update_and_generate_response({}, 1) == (
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND, INVALID_SESSION_ID, [])
    wrong = fm.new_context(sid, 2, {}, [], True, 1)
    assert wrong.update_and_generate_response({}, 1) == (
        ErrorCode.INVALID_FETCH_SESSION_EPOCH, INVALID_SESSION_ID, [])
    # A duplicate slipping past the first check: the session's epoch moved on meanwhile.
    first = fm.new_context(sid, 1, {}, [], True, 2)
    assert fm.cache.get(sid).epoch == 2
    fm.cache.get(sid).epoch = 3  # another request of the session went through
    assert first.update_and_generate_response({A: resp(5)}, 2) == (
        ErrorCode.INVALID_FETCH_SESSION_EPOCH, sid, [])
    # Epoch > 0 without a session id is an unknown session too.
    assert fm.new_context(0, 1, {A: req(0)}, [], False, 3).error == (
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND)


def test_a_full_fetch_closes_the_session_it_names_and_epoch_minus_one_is_sessionless() -> None:
    fm = manager()
    sid = open_session(fm, {A: req(0)})
    ctx = fm.new_context(sid, FINAL_EPOCH, {A: req(0)}, [], True, 1)
    assert isinstance(ctx, SessionlessFetchContext) and fm.cache.get(sid) is None
    assert ctx.update_and_generate_response({A: resp(5)}, 1) == (0, INVALID_SESSION_ID, [A])
    sid = open_session(fm, {A: req(0)})
    ctx = fm.new_context(sid, INITIAL_EPOCH, {A: req(0)}, [], True, 2)
    assert fm.cache.get(sid) is None  # closed; the full fetch opens a new one
    _, new_sid, _ = ctx.update_and_generate_response({A: resp(5)}, 2)
    assert new_sid not in (sid, INVALID_SESSION_ID) and fm.cache.size == 1


def test_zero_slots_means_no_sessions() -> None:
    fm = manager(slots=0)
    ctx = fm.new_context(0, INITIAL_EPOCH, {A: req(0)}, [], True, 0)
    assert ctx.update_and_generate_response({A: resp(5)}, 0) == (0, INVALID_SESSION_ID, [A])
    assert fm.cache.size == 0


def test_a_full_cache_creates_nothing_while_every_session_is_new_and_as_valuable() -> None:
    fm = manager(slots=1)
    first = open_session(fm, {A: req(0), B: req(0)}, now=0, follower=False)
    assert open_session(fm, {A: req(0)}, now=1, follower=False) == INVALID_SESSION_ID
    # Same size, same privilege: not more valuable, even once the old one may be evicted.
    assert open_session(fm, {A: req(0), B: req(0)}, now=EVICTION_MS, follower=False) == (
        INVALID_SESSION_ID)
    assert fm.cache.get(first) is not None and fm.cache.evictions == 0


def test_a_stale_session_is_evicted_by_anyone() -> None:
    fm = manager(slots=1)
    big = open_session(fm, {A: req(0), B: req(0), C: req(0)}, now=0, follower=True)
    small = open_session(fm, {A: req(0)}, now=EVICTION_MS + 1, follower=False)
    assert small != INVALID_SESSION_ID and fm.cache.get(big) is None
    assert fm.cache.evictions == 1


def test_a_follower_evicts_a_consumer_session_at_once() -> None:
    fm = manager(slots=1)
    consumer = open_session(fm, {A: req(0), B: req(0), C: req(0)}, now=0, follower=False)
    follower = open_session(fm, {A: req(0)}, now=1, follower=True)
    assert follower != INVALID_SESSION_ID and fm.cache.get(consumer) is None
    # A consumer cannot evict the new follower session.
    assert open_session(fm, {A: req(0), B: req(0), C: req(0)}, now=2, follower=False) == (
        INVALID_SESSION_ID)


def test_a_consumer_evicts_only_a_smaller_session_that_is_not_new() -> None:
    fm = manager(slots=1)
    small = open_session(fm, {A: req(0)}, now=0, follower=False)
    # Newer and bigger, but the small one is still recent (created < eviction_ms ago).
    fm.new_context(small, 1, {}, [], False, 10).update_and_generate_response({A: resp(5)}, 10)
    assert open_session(fm, {A: req(0), B: req(0)}, now=10, follower=False) == INVALID_SESSION_ID
    # Once the small session is older than eviction_ms (and used since), a bigger one wins.
    now = EVICTION_MS + 10
    fm.new_context(small, 2, {}, [], False, now).update_and_generate_response({A: resp(5)}, now)
    bigger = open_session(fm, {A: req(0), B: req(0)}, now=now + 1, follower=False)
    assert bigger != INVALID_SESSION_ID and fm.cache.get(small) is None


def test_a_follower_session_is_evicted_by_a_bigger_follower_only_when_not_new() -> None:
    fm = manager(slots=1)
    old = open_session(fm, {A: req(0)}, now=0, follower=True)
    assert open_session(fm, {A: req(0), B: req(0)}, now=5, follower=True) == INVALID_SESSION_ID
    now = EVICTION_MS + 5
    fm.new_context(old, 1, {}, [], True, now).update_and_generate_response({A: resp(5)}, now)
    # A consumer, however big, never evicts a privileged session that is in use.
    assert open_session(fm, {A: req(0), B: req(0), C: req(0)}, now=now + 1, follower=False) == (
        INVALID_SESSION_ID)
    assert open_session(fm, {A: req(0), B: req(0)}, now=now + 1, follower=True) != (
        INVALID_SESSION_ID)
    assert fm.cache.get(old) is None


# ---------------------------------------------------------------- change tracking


def settled_session(fm: FetchManager, parts: dict) -> int:
    """A session whose first incremental fetch read every partition and found nothing new."""
    sid = open_session(fm, parts)
    ctx = fm.new_context(sid, 1, {}, [], True, 1)
    assert ctx.partitions() == parts
    assert ctx.update_and_generate_response({tp: resp(5) for tp in parts}, 1) == (0, sid, [])
    return sid


def test_an_idle_incremental_fetch_reads_only_listed_and_changed_partitions() -> None:
    fm = manager()
    sid = settled_session(fm, {A: req(0), B: req(0), C: req(0)})
    ctx = fm.new_context(sid, 2, {}, [], True, 2)
    assert ctx.partitions() == {}  # nothing changed: nothing read
    ctx.update_and_generate_response({}, 2)
    fm.mark_changed(B)
    ctx = fm.new_context(sid, 3, {A: req(4)}, [], True, 3)
    assert ctx.partitions() == {A: req(4), B: req(0)}
    assert ctx.update_and_generate_response({A: resp(5), B: resp(6)}, 3)[2] == [B]
    # B was answered: read once more; then the session is quiet again.
    ctx = fm.new_context(sid, 4, {}, [], True, 4)
    assert ctx.partitions() == {B: req(0)}
    ctx.update_and_generate_response({B: resp(6)}, 4)
    assert fm.new_context(sid, 5, {}, [], True, 5).partitions() == {}


def test_a_change_wakes_only_the_sessions_holding_the_partition() -> None:
    fm = manager()
    one = settled_session(fm, {A: req(0), B: req(0)})
    other = settled_session(fm, {C: req(0)})
    woken: list[tuple[int, tuple[object, ...]]] = []
    for sid in (one, other):
        session = fm.cache.get(sid)
        assert session is not None
        session.waker = lambda keys, sid=sid: woken.append((sid, keys))
    fm.mark_changed(A)
    # Already dirty, woken again: a held follower fetch waits out a change of the HW alone
    # and must hear of the records that come next (its waker decides, told which partition).
    fm.mark_changed(A)
    assert woken == [(one, (A,)), (one, (A,))]
    # A forgotten partition, or a closed session, is no longer marked.
    fm.new_context(one, 2, {}, [B], True, 2).update_and_generate_response({}, 2)
    fm.mark_changed(B)
    assert len(woken) == 2 and B not in fm.cache.holders
    fm.new_context(other, INITIAL_EPOCH, {C: req(0)}, [], True, 3)  # a full fetch closes it
    fm.mark_changed(C)
    assert len(woken) == 2 and C not in fm.cache.holders


def test_unsettled_partitions_and_a_duplicate_fetch_keep_what_was_to_be_read() -> None:
    fm = manager()
    sid = settled_session(fm, {A: req(0), B: req(0)})
    fm.mark_changed(A)
    fm.mark_changed(B)
    ctx = fm.new_context(sid, 2, {}, [], True, 2)
    assert isinstance(ctx, IncrementalFetchContext) and ctx.partitions() == {A: req(0), B: req(0)}
    ctx.unsettled = [B]  # e.g. not led here: read again even though nothing changed
    assert ctx.update_and_generate_response({A: resp(5), B: resp(5)}, 2)[2] == []
    ctx = fm.new_context(sid, 3, {}, [], True, 3)
    assert ctx.partitions() == {B: req(0)}
    # Another fetch of the session went through meanwhile: this one's reads are kept dirty.
    session = fm.cache.get(sid)
    assert session is not None
    session.epoch = next_epoch(session.epoch)
    assert ctx.update_and_generate_response({B: resp(5)}, 3)[0] == (
        ErrorCode.INVALID_FETCH_SESSION_EPOCH)
    assert B in session.dirty


# ---------------------------------------------------------------- sessions by topic id (v13+)

OLD_ID, NEW_ID, OTHER_ID = (UUID(int=n) for n in (1, 2, 3))
NAMES = {OLD_ID: "t"}


def by_id(topic_id: UUID, partition: int) -> TopicIdPartition:
    return TopicIdPartition(topic_id, partition)


def open_id_session(fm: FetchManager, parts: dict, names: dict) -> int:
    ctx = fm.new_context(0, INITIAL_EPOCH, parts, [], True, 0, 2, True, names)
    assert isinstance(ctx, FullFetchContext)
    error, sid, _ = ctx.update_and_generate_response(
        {key: resp(5) if ctx.topic_partition(key) else resp(-1, error=100) for key in parts}, 0)
    assert error == 0 and sid != INVALID_SESSION_ID
    return sid


def test_a_session_by_topic_id_refuses_a_fetch_by_name_and_the_reverse() -> None:
    fm = manager()
    sid = open_id_session(fm, {by_id(OLD_ID, 0): req(0)}, NAMES)
    by_name = fm.new_context(sid, 1, {A: req(0)}, [], True, 1)
    assert by_name.error == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
    assert by_name.update_and_generate_response({}, 1) == (
        ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR, INVALID_SESSION_ID, [])
    # The refused request did not move the session on: the same epoch by id goes through.
    ctx = fm.new_context(sid, 1, {}, [], True, 2, 2, True, NAMES)
    assert isinstance(ctx, IncrementalFetchContext)
    named = open_session(fm, {A: req(0)})
    assert fm.new_context(named, 1, {by_id(OLD_ID, 0): req(0)}, [], True, 3, 2, True,
                          NAMES).error == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR


def test_an_unknown_topic_id_stays_in_the_session_until_its_name_is_known() -> None:
    fm = manager()
    unknown = by_id(OTHER_ID, 0)
    sid = open_id_session(fm, {by_id(OLD_ID, 0): req(0), unknown: req(0)}, NAMES)
    session = fm.cache.get(sid)
    assert session is not None and set(session.partitions) == {by_id(OLD_ID, 0), unknown}
    ctx = fm.new_context(sid, 1, {}, [], True, 1, 2, True, NAMES)
    assert ctx.topic_partition(unknown) is None and unknown in ctx.partitions()
    # Its error is answered at every fetch (and it is read again each time).
    assert ctx.update_and_generate_response({unknown: resp(-1, error=100)}, 1)[2] == [unknown]
    # The id becomes known: the partition takes its name and follows that partition's changes.
    ctx = fm.new_context(sid, 2, {}, [], True, 2, 2, True, {**NAMES, OTHER_ID: "u"})
    assert ctx.topic_partition(unknown) == C and unknown in ctx.partitions()
    assert ctx.update_and_generate_response({unknown: resp(5)}, 2)[2] == [unknown]
    ctx = fm.new_context(sid, 3, {}, [], True, 3, 2, True, {**NAMES, OTHER_ID: "u"})
    assert ctx.partitions() == {unknown: req(0)}  # answered last time: read once more
    assert ctx.update_and_generate_response({unknown: resp(5)}, 3)[2] == []
    ctx = fm.new_context(sid, 4, {}, [], True, 4, 2, True, NAMES)
    assert ctx.partitions() == {}
    ctx.update_and_generate_response({}, 4)
    fm.mark_changed(C)
    assert fm.new_context(sid, 5, {}, [], True, 5, 2, True, NAMES).partitions() == {
        unknown: req(0)}


def test_a_topic_created_again_is_another_partition_of_the_session() -> None:
    fm = manager()
    old, new = by_id(OLD_ID, 0), by_id(NEW_ID, 0)
    sid = open_id_session(fm, {old: req(7)}, NAMES)
    # The new topic's id joins beside the old one: both name t-0 and both follow its changes.
    names = {NEW_ID: "t"}
    ctx = fm.new_context(sid, 1, {new: req(0)}, [], True, 1, 2, True, names)
    assert ctx.partitions() == {old: req(7), new: req(0)}
    assert ctx.topic_partition(old) == ctx.topic_partition(new) == A
    ctx.update_and_generate_response({old: resp(-1, error=ErrorCode.INCONSISTENT_TOPIC_ID),
                                      new: resp(0)}, 1)
    session = fm.cache.get(sid)
    assert session is not None
    session.dirty.clear()
    fm.mark_changed(A)
    assert set(session.dirty) == {old, new}
    # Forgetting the old id keeps t-0 held for the new one; forgetting both lets it go.
    ctx = fm.new_context(sid, 2, {}, [old], True, 2, 2, True, names)
    assert ctx.partitions() == {new: req(0)} and A in fm.cache.holders
    ctx.update_and_generate_response({new: resp(0)}, 2)
    ctx = fm.new_context(sid, 3, {}, [new], True, 3, 2, True, names)
    assert isinstance(ctx, SessionlessFetchContext) and A not in fm.cache.holders
