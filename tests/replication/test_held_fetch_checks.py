"""A follower's fetch that the leader holds is tried once when it arrives, after what its own
read changed has been re-checked (Kafka's fetchMessages: readFromLocalLog, whose follower fetch
state updates complete other delayed requests, then tryCompleteElseWatch of the new one).

A follower that restarted fetches every partition it follows; its first fetch moves each
partition's low watermark (its log start was unknown), which re-checks what waits on those
partitions. Watched before that re-check, the new fetch itself was tried again once per
partition, each try reading all its partitions: quadratic, 1.3 s of a leader's event loop for
500 partitions."""

from __future__ import annotations

from typing import Any

import pytest
from replication_helpers import records, state

from tidelog.replication import Errors, ReplicationConfig
from tidelog.replication.purgatory import DelayedFetch
from tidelog.replication.replica_manager import ReplicaManager
from tidelog.replication.types import TopicPartition
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

N = 50
TPS = [TopicPartition("orders", p) for p in range(N)]


def _leader() -> ReplicaManager:
    """Broker 1 leading N partitions, replicas (1, 2), ISR (1): broker 2 restarted."""
    lm = LogManager(["/broker-1"], LogConfig(), MemoryFileIO(), now_ms=0)
    rm = ReplicaManager(1, lm, ReplicationConfig())
    rm.become_leader_or_follower(
        0, 1, [state(1, 1, (1,), replicas=(1, 2), tp=tp) for tp in TPS], {1, 2}, 0)
    return rm


def _count_tries(rm: ReplicaManager, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    tries: list[int] = []
    readable = rm._readable_bytes

    def counting(params: Any) -> tuple[int, bool]:
        tries.append(len(params.partitions))
        return readable(params)

    monkeypatch.setattr(rm, "_readable_bytes", counting)
    return tries


def test_a_restarted_followers_first_fetch_is_tried_once_not_once_per_partition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rm = _leader()
    tries = _count_tries(rm, monkeypatch)
    outcome = rm.fetch_messages(2, 500, 1, 1 << 20, {tp: (0, 1, 0, 1 << 20) for tp in TPS},
                                now_ms=10, request_key="first")
    assert outcome.delayed  # nothing to read: held for replica.fetch.wait.max.ms
    assert tries == [N]
    # its follower state was recorded: 2 is caught up and proposed for the ISR of each
    assert sorted(p.tp for p in outcome.isr_proposals) == TPS
    assert all(p.new_isr == (1, 2) for p in outcome.isr_proposals)


def test_the_held_fetch_still_completes_when_one_of_its_partitions_gets_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rm = _leader()
    rm.fetch_messages(2, 500, 1, 1 << 20, {tp: (0, 1, 0, 1 << 20) for tp in TPS},
                      now_ms=10, request_key="held")
    assert rm.poll_completed(10) == []
    rm.append_records(1, {TPS[7]: records(3)}, 1000, 20, request_key="produce")
    done = [c for c in rm.poll_completed(20) if getattr(c, "request_key", None) == "held"]
    assert len(done) == 1
    assert done[0].results[TPS[7]].error == Errors.NONE
    assert len(done[0].results[TPS[7]].records) > 0


def test_its_isr_additions_being_written_do_not_try_the_held_fetch_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rm = _leader()
    outcome = rm.fetch_messages(2, 500, 1, 1 << 20, {tp: (0, 1, 0, 1 << 20) for tp in TPS},
                                now_ms=10, request_key="held")
    tries: list[int] = []
    try_complete = DelayedFetch.try_complete

    def counting(self: DelayedFetch, now_ms: int) -> bool:
        tries.append(len(self.params.partitions))
        return try_complete(self, now_ms)

    monkeypatch.setattr(DelayedFetch, "try_complete", counting)
    for prop in outcome.isr_proposals:  # the ZooKeeper writes came back
        rm.on_isr_update_result(prop.tp, True, prop.zk_version + 1, prop.new_isr, 20,
                                prop.leader_epoch)
    assert all(rm.partition(tp).isr == frozenset({1, 2}) for tp in TPS)
    assert tries == []  # the HW did not move: nothing it waits for changed
    assert rm.poll_completed(20) == []
    rm.append_records(1, {TPS[3]: records(2)}, 1000, 30, request_key="produce")
    assert [c.request_key for c in rm.poll_completed(30)
            if getattr(c, "request_key", None) == "held"] == ["held"]


def test_a_followers_first_fetch_does_not_try_the_other_followers_held_fetch_per_partition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A new topic (ISR 1, 2, 3): follower 2's fetch is held over all N partitions when
    # follower 3's first fetch moves each partition's low watermark (3's log start was
    # unknown). What waits on the low watermark (DeleteRecords) is told; 2's fetch, whose
    # bytes do not depend on it, is not tried again once per partition, each try reading all
    # N (3,333^2 partition checks per first fetch at 10,000 partitions, RF=3).
    lm = LogManager(["/broker-1"], LogConfig(), MemoryFileIO(), now_ms=0)
    rm = ReplicaManager(1, lm, ReplicationConfig())
    rm.become_leader_or_follower(
        0, 1, [state(1, 0, (1, 2, 3), replicas=(1, 2, 3), tp=tp) for tp in TPS], {1, 2, 3}, 0)
    told: list[TopicPartition] = []
    rm.partition_listeners.append(told.append)
    tries = _count_tries(rm, monkeypatch)
    fetch = {tp: (0, 0, 0, 1 << 20) for tp in TPS}
    assert rm.fetch_messages(2, 500, 1, 1 << 20, fetch, now_ms=10, request_key="2").delayed
    assert tries == [N] and sorted(told) == TPS
    told.clear()
    assert rm.fetch_messages(3, 500, 1, 1 << 20, fetch, now_ms=20, request_key="3").delayed
    assert tries == [N, N]  # 3's own try only (the old code: N more tries of 2's, N each)
    assert sorted(told) == TPS  # the low watermark of each moved
    assert all(rm.partition(tp).remote_replicas[3].log_start_offset == 0 for tp in TPS)
    # the held fetches still complete on records
    rm.append_records(1, {TPS[5]: records(1)}, 1000, 30, request_key="produce")
    assert sorted(c.request_key for c in rm.poll_completed(30)
                  if getattr(c, "request_key", None) in ("2", "3")) == ["2", "3"]
