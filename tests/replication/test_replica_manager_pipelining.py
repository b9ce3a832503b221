"""ReplicaManager under pipelined acks=all requests: many requests wait on one partition at
once (a client pipelining small produce requests on one connection), they complete as the HW
passes each of them, and a leader's append that does not move the HW does not re-check them
(Kafka checks its produce purgatory only when the HW moves or the ISR / leadership changes)."""

from __future__ import annotations

from typing import Any

import pytest
from replication_helpers import TP, MiniCluster

from tidelog.replication import CompleteProduce, Errors, ReplicationConfig
from tidelog.replication.partition import Partition
from tidelog.storage.log_config import LogConfig


def _cluster(n: int = 3) -> MiniCluster:
    c = MiniCluster(n=n, config=ReplicationConfig(replica_fetch_wait_max_ms=0),
                    log_config=LogConfig(min_insync_replicas=2))
    c.elect(1, tuple(range(1, n + 1)))
    return c


def _completed_produces(c: MiniCluster) -> list[CompleteProduce]:
    return [d for d in c.rm(1).poll_completed(c.now) if isinstance(d, CompleteProduce)]


def test_pipelined_acks_all_requests_complete_as_the_hw_passes_each() -> None:
    c = _cluster()
    for i in range(10):
        assert c.produce(1, 1, acks=-1, key=i).delayed
    c.step_broker(2)  # fetches offsets 0..9
    c.step_broker(2)  # reports LEO 10: with the leader, 2 of 3 have them, but 3 is in the ISR
    assert _completed_produces(c) == []
    for i in range(10, 15):
        assert c.produce(1, 1, acks=-1, key=i).delayed
    c.step_broker(3)  # fetches 0..14
    c.step_broker(3)  # reports LEO 15: HW = min(10, 15) = 10
    done = _completed_produces(c)
    assert sorted(d.request_key for d in done) == list(range(10))
    assert all(d.results[TP].error == Errors.NONE for d in done)
    assert sorted(d.results[TP].base_offset for d in done) == list(range(10))
    c.step_broker(2)
    c.step_broker(2)  # 2 reports 15: HW 15
    assert sorted(d.request_key for d in _completed_produces(c)) == list(range(10, 15))
    assert c.rm(1).produce_purgatory.watched_keys() == []


def test_waiting_requests_fail_together_when_the_isr_falls_below_min_insync() -> None:
    c = MiniCluster(n=2, config=ReplicationConfig(replica_fetch_wait_max_ms=0,
                                                  replica_lag_time_max_ms=1_000),
                    log_config=LogConfig(min_insync_replicas=2))
    c.elect(1, (1, 2))
    for i in range(5):
        assert c.produce(1, 1, acks=-1, key=i).delayed
    c.stop(2)
    c.run(steps=11, dt=100)  # 2 is shrunk out: ISR [1] < 2, and the HW does not move
    assert c.zk[TP].isr == (1,)
    done = _completed_produces(c)
    assert sorted(d.request_key for d in done) == list(range(5))
    assert {d.results[TP].error for d in done} == {Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND}


def test_an_append_that_does_not_move_the_hw_does_not_recheck_waiting_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = _cluster()
    checks = 0
    check = Partition.check_enough_replicas_reach_offset

    def counting(self: Partition, required_offset: int) -> Any:
        nonlocal checks
        checks += 1
        return check(self, required_offset)

    monkeypatch.setattr(Partition, "check_enough_replicas_reach_offset", counting)
    n = 200
    for i in range(n):
        assert c.produce(1, 1, acks=-1, key=i).delayed
    # Each request is tried once when it arrives; re-checking all waiting ones on every
    # append would be n * (n + 1) / 2 = 20,100 checks.
    assert checks <= 2 * n
    for b in (2, 3, 2, 3):
        c.step_broker(b)
    assert len(_completed_produces(c)) == n
