"""Random histories of a 3-broker partition (clean elections only, clean restarts, lost fetch
responses): acks=all writes survive and the replicas converge batch by batch."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from replication_helpers import TP, MiniCluster, records

from tidelog.replication import CompleteProduce, Errors, ReplicationConfig
from tidelog.replication.election import offline_partition_leader_election, remove_replica_from_isr
from tidelog.replication.types import NO_LEADER
from tidelog.storage.log_config import LogConfig

CONFIG = ReplicationConfig(
    replica_fetch_wait_max_ms=0, replica_lag_time_max_ms=500,
    replica_fetch_backoff_ms=50,
)

ACTIONS = ["produce"] * 4 + ["step"] * 3 + ["lose"] * 2 + ["stop", "start"]


def random_history(seed: int, length: int = 150) -> list[tuple]:
    rng = random.Random(seed)
    return [(a, rng.choice((1, 2, 3))) for a in (rng.choice(ACTIONS) for _ in range(length))]


class Controller:
    """The test's controller: on a broker's death it takes it out of the ISR (a new epoch) and,
    if it led, elects the first live ISR member of the assignment."""

    def __init__(self, c: MiniCluster) -> None:
        self.c = c

    def broker_died(self, b: int) -> None:
        st_ = self.c.zk[TP]
        leader, isr = remove_replica_from_isr(st_.leader, st_.isr, b)
        if leader == NO_LEADER:
            result = offline_partition_leader_election(st_.replicas, isr, self.c.live, unclean_enabled=False)
            if result.leader is None:  # leaderless until an ISR member returns
                self.c.zk[TP] = replace(st_, leader=NO_LEADER, leader_epoch=st_.leader_epoch + 1,
                                        isr=isr, zk_version=st_.zk_version + 1)
                return
            leader, isr = result.leader, result.isr
        self.c.elect(leader, isr)


def collect_acks(c: MiniCluster, acked: dict[int, tuple[int, int]]) -> None:
    for b in sorted(c.live):
        for done in c.rm(b).poll_completed(c.now):
            if isinstance(done, CompleteProduce) and done.results[TP].error == Errors.NONE:
                record_ack(c, b, done.request_key, done.results[TP].base_offset, acked)


def record_ack(c: MiniCluster, b: int, key, base_offset: int, acked: dict[int, tuple[int, int]]) -> None:
    batch = next(x for x in c.log(b).batches(base_offset) if x.base_offset == base_offset)
    acked[key] = (base_offset, batch.crc)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32))
def test_acked_writes_survive_and_replicas_converge(seed: int) -> None:
    history = random_history(seed)
    c = MiniCluster(config=CONFIG, log_config=LogConfig(min_insync_replicas=2))
    controller = Controller(c)
    c.elect(1, (1, 2, 3))
    acked: dict[int, tuple[int, int]] = {}
    for i, action in enumerate(history):
        kind = action[0]
        leader = c.zk[TP].leader
        if kind == "produce" and leader in c.live:
            out = c.rm(leader).append_records(-1, {TP: records(1, tag=f"k{i}-")}, 2_000, c.now, request_key=i)
            if out.results is not None and out.results[TP].error == Errors.NONE:
                record_ack(c, leader, i, out.results[TP].base_offset, acked)
        elif kind == "step":
            c.run(steps=3, dt=100)
        elif kind == "lose" and action[1] in c.live:
            c.now += 10
            c.step_broker(action[1], lose_responses=True)
        elif kind == "stop" and action[1] in c.live and len(c.live) > 1:
            c.stop(action[1])
            controller.broker_died(action[1])
        elif kind == "start" and action[1] not in c.live:
            c.start(action[1])
        collect_acks(c, acked)
    for b in (1, 2, 3):
        if b not in c.live:
            c.start(b)
    if c.zk[TP].leader not in c.live or c.zk[TP].leader == NO_LEADER:
        c.elect(c.zk[TP].isr[0], c.zk[TP].isr)
    c.run(steps=40, dt=100)
    collect_acks(c, acked)
    leader = c.zk[TP].leader
    final = {(x.base_offset, x.crc) for x in c.log(leader).batches()}
    for key, entry in acked.items():
        assert entry in final, f"acked write {key} at offset {entry[0]} lost"
    assert c.batches(1) == c.batches(2) == c.batches(3)
    assert c.zk[TP].isr == (1, 2, 3)
