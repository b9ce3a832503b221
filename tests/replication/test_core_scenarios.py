"""The historic bugs of correctness.md at the level of the core (a few brokers driven in lock-step
by the test): each fix holds, and the naive rule it replaced loses data in the same scenario."""

from __future__ import annotations

import pytest
from replication_helpers import TP, MiniCluster

from tidelog.replication import Errors, ReplicationConfig


def base(**kw) -> ReplicationConfig:
    return ReplicationConfig(replica_fetch_wait_max_ms=0, **kw)


@pytest.mark.parametrize("truncate_to_hw", [False, True])
def test_kip_101_a_restarted_follower_with_a_stale_hw(truncate_to_hw: bool) -> None:
    # RF=2, leader B=2, follower A=1, min.isr=1 (correctness.md, KIP-101).
    c = MiniCluster(n=2, config=base(truncate_to_hw=truncate_to_hw))
    c.elect(2, (1, 2))
    c.produce(2, 1, acks=-1, key="m1")
    c.run(3)
    assert c.log(1).high_watermark == 1
    c.produce(2, 1, acks=-1, key="m2")
    c.step_broker(1)  # A fetches m2
    c.step_broker(1, lose_responses=True)  # B advances its HW to 2 and acks m2; the reply is lost
    assert [d.results[TP].error for d in c.rm(2).poll_completed(c.now)] == [Errors.NONE, Errors.NONE]
    assert (c.log(1).log_end_offset, c.log(1).high_watermark) == (2, 1)
    c.stop(1)
    c.start(1)  # A restarts as follower (HW 1 from its checkpoint)
    c.stop(2)  # B dies before A could fetch again
    c.now += 10
    c.step_broker(1)
    c.elect(1, (1,))
    lost = c.log(1).log_end_offset < 2
    assert lost is truncate_to_hw  # the naive rule cut the acknowledged m2


@pytest.mark.parametrize("truncate_to_hw", [False, True])
def test_kip_101_divergence_after_the_leader_loses_its_unflushed_tail(truncate_to_hw: bool) -> None:
    c = MiniCluster(n=2, config=base(truncate_to_hw=truncate_to_hw))
    c.elect(1, (1, 2))
    for _ in range(5):
        c.produce(1, 1)
    c.run(3)
    c.log(1).flush()
    for _ in range(5):
        c.produce(1, 1)
    c.run(3)
    assert c.log(2).log_end_offset == 10
    c.stop(2)
    c.crash(1)  # page-cache loss: the leader keeps offsets 0..4 only
    c.start(1)
    assert c.log(1).log_end_offset == 5
    c.elect(1, (1,))  # new epoch, 10 more records at offsets 5..14
    for _ in range(10):
        c.produce(1, 1)
    c.start(2)
    c.run(10)
    same = c.batches(1) == c.batches(2)
    assert same is not truncate_to_hw
    assert c.log(2).log_end_offset == 15


def test_kip_279_fast_leader_changes_converge() -> None:
    # RF=2, unclean election on, min.isr=1, acks=1: stop/start alternately, writing 1, 3, 1, 2.
    c = MiniCluster(n=2, config=base(unclean_leader_election_enable=True))
    c.elect(1, (1, 2))
    c.produce(1, 1)
    c.run(3)
    c.stop(2)
    c.produce(1, 3)  # only on 1
    c.stop(1)
    c.start(2)
    c.elect(2, (2,))  # unclean: 2 leads epoch 1 from offset 1
    c.produce(2, 1)
    c.stop(2)
    c.start(1)
    c.elect(1, (1,))  # unclean again: epoch 2 from offset 4
    c.produce(1, 2)
    c.start(2)
    c.run(10)
    assert c.batches(1) == c.batches(2)
    assert [epoch for _, _, epoch in c.batches(1)] == [0, 0, 2]
    assert c.zk[TP].isr == (1, 2)


@pytest.mark.parametrize("maximal_isr", [True, False])
def test_maximal_isr_keeps_a_joining_replica_from_missing_committed_data(maximal_isr: bool) -> None:
    # ISR [1,2]; 3 starts joining at LEO 0; 10 records are written while the write is pending.
    c = MiniCluster(config=base(maximal_isr=maximal_isr))
    c.elect(1, (1, 2))
    rm = c.rm(1)
    # 3's fetch at 0 (= HW 0) makes the leader propose [1,2,3]; ZooKeeper is slow to answer.
    out = rm.fetch_messages(3, 0, 1, 1 << 20, {TP: (0, 0, 0, 1 << 20)}, c.now)
    [proposal] = out.isr_proposals
    c.produce(1, 10)
    c.step_broker(2)
    c.step_broker(2)
    c.apply_proposals([proposal])
    assert c.zk[TP].isr == (1, 2, 3)
    hw = c.log(1).high_watermark
    # Naive: HW 10 while replica 3, now in the ISR, has none of it: if 1 and 2 die and 3 is
    # elected, offsets 0..9 are lost although they were committed.
    assert (hw, c.log(3).log_end_offset) == ((0, 0) if maximal_isr else (10, 0))


@pytest.mark.parametrize("fence", [True, False])
def test_kip_320_a_zombie_follower_is_fenced(fence: bool) -> None:
    # Leader 1 and 2 at 50 records, 3 at 40; 2 misses the LeaderAndIsr requests but keeps fetching.
    c = MiniCluster(config=base(fence_leader_epochs=fence))
    c.elect(1, (1, 2, 3))
    c.produce(1, 40)
    c.run(3)
    c.stop(3)
    c.produce(1, 10)
    c.run(3)
    zombie_request = c.next_requests(2)  # what 2 sends next: fetch at 50, epoch 0
    assert zombie_request[0].partitions[TP].fetch_offset == 50
    c.live.discard(2)  # 2 loses its session: no LeaderAndIsr reaches it
    c.start(3)
    c.elect(3, (1, 3))  # epoch 1 from offset 40
    c.produce(3, 20)
    c.run(5)  # 1 truncates to 40 and replicates 40..59 of epoch 1
    c.elect(1, (1, 3))  # epoch 2
    c.run(3)
    result = c.rm(1).fetch(zombie_request[0], c.now).results[TP]
    if fence:
        assert result.error == Errors.FENCED_LEADER_EPOCH
    else:  # pre-KIP-320: served from 50, on top of 2's own 40..49 of epoch 0: divergence
        assert result.error == Errors.NONE and len(result.records) > 0
