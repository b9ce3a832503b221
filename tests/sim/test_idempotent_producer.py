"""The simulated idempotent producer against the real core and storage: a retried batch whose
answer was lost is answered with its original offset and written once, also by a new leader
(which learned the producer's state by replicating); and the end-of-run checks catch the
duplicate a leader without that state writes."""

from __future__ import annotations

from typing import Any

import pytest

from tidelog.sim.cluster import SimCluster, SimConfig
from tidelog.sim.invariants import batch_signatures
from tidelog.sim.messages import ProduceResponse
from tidelog.sim.producer_invariants import check_producers
from tidelog.storage.log import Log
from tidelog.storage.transactions import AppendOrigin


def booted() -> SimCluster:
    c = SimCluster(SimConfig())
    c.start()
    c.run_for(200)
    return c


def lose_next_answer_to(c: SimCluster, client: int) -> list[Any]:
    lost: list[Any] = []

    def rule(src: int, dst: int, msg: Any) -> bool:
        if isinstance(msg, ProduceResponse) and dst == client and not lost:
            lost.append(msg)
            return True
        return False

    c.network.rules.append(rule)
    return lost


def retry_after_a_leader_change(c: SimCluster) -> tuple[Any, list[Any]]:
    """Two acked writes, then a third whose answer is lost; once the followers have it the
    leader is killed, and the producer's retry goes to the new leader."""
    tp = c.tps[0]
    p = c.add_producer(tp, -1)
    p.produce(2)
    c.run_for(300)
    lost = lose_next_answer_to(c, p.node_id)
    p.produce(1)
    c.run_for(500)  # answered (the answer lost), replicated to the followers, HW past it
    old = c.acting_leader(tp)
    assert old is not None
    old.stop("kill")
    c.run_for(6000)
    return p, lost


def test_a_batch_whose_answer_was_lost_is_answered_with_its_original_offset() -> None:
    c = booted()
    tp = c.tps[0]
    p = c.add_producer(tp, -1)
    p.produce(1)
    c.run_for(300)
    lost = lose_next_answer_to(c, p.node_id)
    p.produce(1)
    c.run_for(3000)
    assert lost and lost[0].base_offset == 1
    assert p.stats.retries >= 1 and p.in_flight == 0
    assert sorted(p.acked.values()) == [0, 1]
    assert len(batch_signatures(c.acting_leader(tp).log(tp))) == 2
    assert check_producers(c) == []


def test_a_new_leader_answers_the_retry_of_a_batch_its_predecessor_wrote() -> None:
    c = booted()
    p, lost = retry_after_a_leader_change(c)
    tp = c.tps[0]
    assert lost and lost[0].base_offset == 2 and p.stats.retries >= 1
    assert sorted(p.acked.values()) == [0, 1, 2]
    assert len(batch_signatures(c.acting_leader(tp).log(tp))) == 3
    assert check_producers(c) == []


def test_the_checks_catch_a_leader_that_lost_the_producer_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    analyze = Log._analyze_producer_batches

    def followers_keep_no_state(self: Log, batches: Any, txns: Any, origin: AppendOrigin
                                ) -> Any:
        if origin is AppendOrigin.REPLICATION:
            return [], None
        return analyze(self, batches, txns, origin)

    monkeypatch.setattr(Log, "_analyze_producer_batches", followers_keep_no_state)
    c = booted()
    retry_after_a_leader_change(c)
    assert "NoDuplicates" in {v.invariant for v in check_producers(c)}
