"""The replica fetcher's fetch sessions (KIP-227, Kafka's clients FetchSessionHandler): a full
fetch first, then incremental fetches listing only what changed, and a full fetch again after
a session error, an inconsistent response or a lost request."""

from __future__ import annotations

import pytest
from replication_helpers import TP
from test_fetcher import CONFIG, follower, leader_log, only

from tidelog.replication import Errors, FetchPartitionData, FetchRequest, TopicPartition
from tidelog.replication.fetcher import FetchPartition, FetchResponseData, FetchSessionHandler
from tidelog.replication.replication_quota import ReplicationQuotaManager
from tidelog.sim.disk import MemoryFileIO

TP2 = TopicPartition("orders", 1)
SID = 42


def idle(hw: int = 0) -> FetchPartitionData:
    return FetchPartitionData(Errors.NONE, hw, 0, b"")


def answer(session_id: int = SID, error: Errors = Errors.NONE, **parts: FetchPartitionData) -> (
        FetchResponseData):
    by_name = {"a": TP, "b": TP2}
    return FetchResponseData(error, session_id, {by_name[k]: v for k, v in parts.items()})


def started(n: int = 2):
    io = MemoryFileIO()
    tps = (TP, TP2)[:n]
    f, logs = follower(io, tps)
    f.add_partitions({tp: (0, 0) for tp in tps}, 0)
    return io, f, logs


def test_a_full_fetch_opens_the_session_and_the_next_ones_list_only_changes() -> None:
    io, f, logs = started()
    leader = leader_log(io, [(0, 3)])
    full = only(f.poll_requests(0), FetchRequest)
    assert (full.session_id, full.session_epoch, full.to_forget) == (0, 0, ())
    assert set(full.listed) == {TP, TP2}
    f.handle_response(full, answer(a=idle(), b=idle()), 1)
    # Nothing changed: the incremental fetch lists nothing, the session holds both.
    inc = only(f.poll_requests(1), FetchRequest)
    assert (inc.session_id, inc.session_epoch) == (SID, 1)
    assert dict(inc.listed) == {} and set(inc.partitions) == {TP, TP2}
    # Only TP gets data: only TP is answered and only TP's new offset is listed next.
    data = bytes(leader.read(0, 1 << 20).records)
    result = f.handle_response(inc, answer(a=FetchPartitionData(Errors.NONE, 3, 0, data)), 2)
    assert TP in result.appended and logs[TP].log_end_offset == 3
    nxt = only(f.poll_requests(2), FetchRequest)
    assert nxt.session_epoch == 2
    # (with the epoch of the records fetched as its last fetched epoch: truncation on fetch)
    assert dict(nxt.listed) == {TP: FetchPartition(3, 0, 0, CONFIG.replica_fetch_max_bytes, 0)}
    assert nxt.to_forget == ()
    # An answer naming only the HW change moves the follower's HW.
    f.handle_response(nxt, answer(a=idle(hw=3)), 3)
    assert logs[TP].high_watermark == 3
    assert only(f.poll_requests(3), FetchRequest).session_epoch == 3


def test_a_partition_dropped_from_the_fetch_is_forgotten_and_comes_back_in_full() -> None:
    _, f, _ = started()
    full = only(f.poll_requests(0), FetchRequest)
    f.handle_response(full, answer(a=idle(), b=idle()), 1)
    inc = only(f.poll_requests(1), FetchRequest)
    # TP2 errors: it backs off, so the next fetch leaves it out of the session.
    f.handle_response(inc, answer(b=FetchPartitionData(Errors.NOT_LEADER_OR_FOLLOWER)), 2)
    without = only(f.poll_requests(2), FetchRequest)
    assert without.to_forget == (TP2,) and dict(without.listed) == {}
    f.handle_response(without, answer(), 3)
    back = only(f.poll_requests(2 + CONFIG.replica_fetch_backoff_ms), FetchRequest)
    assert set(back.listed) == {TP2} and back.to_forget == ()


def test_session_id_not_found_restarts_with_a_new_full_fetch() -> None:
    _, f, _ = started()
    f.handle_response(only(f.poll_requests(0), FetchRequest), answer(a=idle(), b=idle()), 1)
    inc = only(f.poll_requests(1), FetchRequest)
    result = f.handle_response(inc, answer(0, Errors.FETCH_SESSION_ID_NOT_FOUND), 2)
    assert result.errors == {} and result.appended == {}
    full = only(f.poll_requests(2), FetchRequest)  # at once, no back-off
    assert (full.session_id, full.session_epoch) == (0, 0) and set(full.listed) == {TP, TP2}


def test_invalid_epoch_closes_the_session_with_a_full_fetch_naming_it() -> None:
    _, f, _ = started()
    f.handle_response(only(f.poll_requests(0), FetchRequest), answer(a=idle(), b=idle()), 1)
    inc = only(f.poll_requests(1), FetchRequest)
    f.handle_response(inc, answer(0, Errors.INVALID_FETCH_SESSION_EPOCH), 2)
    full = only(f.poll_requests(2), FetchRequest)
    assert (full.session_id, full.session_epoch) == (SID, 0) and set(full.listed) == {TP, TP2}
    f.handle_response(full, answer(43, a=idle(), b=idle()), 3)
    assert only(f.poll_requests(3), FetchRequest).session_id == 43


def test_a_lost_request_makes_the_next_fetch_full() -> None:
    _, f, _ = started()
    f.handle_response(only(f.poll_requests(0), FetchRequest), answer(a=idle(), b=idle()), 1)
    inc = only(f.poll_requests(1), FetchRequest)
    f.on_request_failed(inc, 2)
    full = only(f.poll_requests(2 + CONFIG.replica_fetch_backoff_ms), FetchRequest)
    assert (full.session_id, full.session_epoch) == (SID, 0) and set(full.listed) == {TP, TP2}


def test_a_broker_without_a_slot_keeps_answering_full_fetches() -> None:
    _, f, _ = started()
    f.handle_response(only(f.poll_requests(0), FetchRequest), answer(0, a=idle(), b=idle()), 1)
    again = only(f.poll_requests(1), FetchRequest)
    assert (again.session_id, again.session_epoch) == (0, 0) and set(again.listed) == {TP, TP2}


def test_inconsistent_responses_are_not_used() -> None:
    io, f, logs = started(1)
    leader = leader_log(io, [(0, 3)])
    data = FetchPartitionData(Errors.NONE, 3, 0, bytes(leader.read(0, 1 << 20).records))
    full = only(f.poll_requests(0), FetchRequest)
    # A full answer missing a partition it listed... (here: naming one it did not)
    result = f.handle_response(full, answer(a=data, b=idle()), 1)
    assert result.ignored == {TP, TP2} and logs[TP].log_end_offset == 0
    full = only(f.poll_requests(1), FetchRequest)
    assert full.session_epoch == 0
    f.handle_response(full, answer(a=idle()), 2)
    inc = only(f.poll_requests(2), FetchRequest)
    # ...and an incremental answer naming a partition outside the session.
    f.handle_response(inc, answer(b=idle()), 3)
    assert only(f.poll_requests(3), FetchRequest).session_epoch == 0


def test_the_epoch_wraps_from_int_max_to_one() -> None:
    h = FetchSessionHandler()
    parts = {TP: FetchPartition(0, 0, 0, 1)}
    h.build(parts)
    h.handle_response(FetchResponseData(Errors.NONE, 9, {TP: idle()}))
    h.epoch = 2**31 - 1
    assert h.build(parts)[:2] == (9, 2**31 - 1)
    assert h.handle_response(FetchResponseData(Errors.NONE, 9, {}))
    assert h.epoch == 1


def test_a_sessionless_transport_keeps_full_fetches() -> None:
    _, f, _ = started(1)
    full = only(f.poll_requests(0), FetchRequest)
    f.handle_response(full, {TP: idle()}, 1)  # a plain mapping: no session fields
    nxt = only(f.poll_requests(1), FetchRequest)
    assert (nxt.session_id, nxt.session_epoch, set(nxt.listed)) == (0, 0, {TP})


def test_an_unchanged_partition_is_sent_once_and_then_reused_as_is() -> None:
    _, f, _ = started()
    full = only(f.poll_requests(0), FetchRequest)
    f.handle_response(full, answer(a=idle(), b=idle()), 1)
    inc = only(f.poll_requests(1), FetchRequest)
    # The incremental request carries the very objects the session holds: nothing to list.
    assert all(inc.partitions[tp] is full.partitions[tp] for tp in (TP, TP2))
    assert dict(inc.listed) == {}
    assert f.partition_states.truncating == 0
    f.add_partitions({TP: (0, 1)}, 2)  # a new leader epoch: Truncating again
    assert f.partition_states.truncating == 1
    f.remove_partitions([TP])
    assert f.partition_states.truncating == 0


@pytest.mark.parametrize("quota", [None, ReplicationQuotaManager()], ids=["no quota", "unthrottled"])
def test_an_idle_round_trip_looks_only_at_the_partitions_that_changed(
        quota: ReplicationQuotaManager | None) -> None:
    _, f, _ = started()
    f.config = f.config.with_(follower_quota=quota)  # a broker always has one, throttling nothing
    full = only(f.poll_requests(0), FetchRequest)
    f.handle_response(full, answer(a=idle(), b=idle()), 1)
    inc = only(f.poll_requests(1), FetchRequest)
    looked_up: list[TopicPartition] = []
    logs_of = f._logs
    f._logs = lambda tp: (looked_up.append(tp), logs_of(tp))[1]
    # An empty answer, nothing changed: building the next fetch reads no partition's state.
    f.handle_response(inc, answer(), 2)
    nxt = only(f.poll_requests(2), FetchRequest)
    assert dict(nxt.listed) == {} and set(nxt.partitions) == {TP, TP2} and looked_up == []
    # What an answer named is looked at again (its HW or log start may have moved).
    f.handle_response(nxt, answer(a=idle(hw=0)), 3)
    looked_up.clear()  # handling the answer used TP's log
    nxt = only(f.poll_requests(3), FetchRequest)
    assert looked_up == [TP] and nxt.session_epoch == 3
    # A build from every partition still comes now and then (FULL_BUILD_INTERVAL_MS).
    f.handle_response(nxt, answer(), 4)
    looked_up.clear()
    only(f.poll_requests(4 + f.FULL_BUILD_INTERVAL_MS), FetchRequest)
    assert sorted(looked_up) == sorted([TP, TP2])
