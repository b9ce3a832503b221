"""Two shells on one hand-stepped clock, the follower's requests served by the leader's shell:
a follower joins a partition its leader just came to lead without waiting out the fetch it had
held there (replica.fetch.wait.max.ms), whichever of the two gets its LeaderAndIsr first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from test_shell_replica_manager import Clock, IsrWriter

from tidelog.protocol.records.builder import build_values
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors
from tidelog.replication.fetcher import FetchRequest, OffsetsForLeaderEpochRequest
from tidelog.replication.follower_joins import JOIN_WAIT_SLICES
from tidelog.replication.types import CompleteFetch, LeaderAndIsrPartitionState, TopicPartition
from tidelog.shell.replica_manager import ReplicaManager
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

WAIT = 500
OLD = TopicPartition("old", 0)
NEW = TopicPartition("new", 0)


class Wire:
    """The follower's endpoint to broker 1: each request reaches the leader's shell one clock
    task later and its answer comes back one task later (no time passes on the wire)."""

    def __init__(self, clock: Clock, leader: Callable[[], ReplicaManager]) -> None:
        self.clock, self.leader = clock, leader
        self.fetches: list[FetchRequest] = []
        self.seq = 0

    def send(self, request: Any, on_done: Callable[[Any], None]) -> None:
        self.clock.schedule("to-leader", lambda: self._serve(request, on_done), 0)

    def _answer(self, on_done: Callable[[Any], None], response: Any) -> None:
        self.clock.schedule("to-follower", lambda: on_done(response), 0)

    def _serve(self, request: Any, on_done: Callable[[Any], None]) -> None:
        rm = self.leader()
        if isinstance(request, OffsetsForLeaderEpochRequest):
            self._answer(on_done, rm.core.last_offset_for_leader_epoch(
                request.replica_id, request.partitions))
            return
        assert isinstance(request, FetchRequest)
        self.fetches.append(request)
        self.seq += 1

        def done(c: CompleteFetch) -> None:
            self._answer(on_done, dict(c.results))

        out = rm.fetch_messages(request.replica_id, request.max_wait_ms, request.min_bytes,
                                request.max_bytes, request.fetch_args(), ("f", self.seq), done,
                                broker_epoch=request.broker_epoch)
        if not out.delayed:
            assert out.results is not None
            self._answer(on_done, dict(out.results))

    def close(self) -> None:
        pass


class Pair:
    def __init__(self) -> None:
        self.clock = Clock()
        config = ReplicationConfig(replica_fetch_wait_max_ms=WAIT)
        self.wire = Wire(self.clock, lambda: self.leader)
        self.leader = self._shell(1, config)
        self.follower = self._shell(2, config)

    def _shell(self, broker_id: int, config: ReplicationConfig) -> ReplicaManager:
        lm = LogManager([f"/b{broker_id}"], LogConfig(min_insync_replicas=2), MemoryFileIO())
        rm = ReplicaManager(broker_id, lm, config, time=self.clock, scheduler=self.clock,
                            alter_partition_manager=IsrWriter(),
                            leader_end_point=lambda _source, _fid: self.wire)
        rm.set_broker_epoch(100)
        return rm

    def lead(self, rm: ReplicaManager, tp: TopicPartition) -> None:
        st = LeaderAndIsrPartitionState(tp.topic, tp.partition, 1, 1, 0, (1, 2), 0, (1, 2),
                                        is_new=True)
        rm.become_leader_or_follower(0, 1, 100, [st], {1, 2})

    def acks_all_time(self, tp: TopicPartition, within_ms: int) -> int | None:
        """Produce one record with acks=all to ``tp``: the ms until it is acknowledged."""
        done: list[Any] = []
        start = self.clock.now
        self.leader.append_records(-1, {tp: build_values([b"x"])}, 30_000, ("p", tp),
                                   done.append)
        while not done and self.clock.now - start < within_ms:
            self.clock.advance(1)
        if not done:
            return None
        assert done[0].results[tp].error == Errors.NONE
        return self.clock.now - start


@pytest.mark.parametrize("leader_first", [True, False])
def test_a_follower_joins_a_new_partition_without_waiting_out_its_held_fetch(
        leader_first: bool) -> None:
    pair = Pair()
    for rm in (pair.leader, pair.follower):
        pair.lead(rm, OLD)
    pair.clock.advance(100)
    # Broker 2's fetch of OLD is held at broker 1: nothing to read there.
    assert pair.acks_all_time(OLD, 50) is not None
    pair.clock.advance(100)
    held = len(pair.wire.fetches)
    first, second = (pair.leader, pair.follower) if leader_first else (pair.follower, pair.leader)
    pair.lead(first, NEW)
    # The other broker's LeaderAndIsr comes 3 ms later: with the leader first, the follower's
    # fetch answered at once is followed by one still lacking NEW.
    pair.clock.advance(3)
    pair.lead(second, NEW)
    # Kafka's follower adds NEW to its fetch only when the held one returns (here up to 400 ms
    # later); the leader answers it at once, and a fetch sent before the follower learned of
    # NEW waits only a slice.
    took = pair.acks_all_time(NEW, WAIT)
    assert took is not None and took <= WAIT // JOIN_WAIT_SLICES
    assert NEW in pair.wire.fetches[-1].partitions and len(pair.wire.fetches) > held
