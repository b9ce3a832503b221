"""Two real brokers replicating through the broker shell: the follower's fetcher task pulls over
tidelog's BrokerConnection, the leader expands the ISR with a compare-and-set in ZooKeeper, the
HW advances and acks=all completes; a stopped follower falls out of the ISR after
replica.lag.time.max.ms, and min.insync.replicas then refuses acks=all writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import (
    ActingController,
    BrokerThread,
    broker_props,
    fetch,
    produce,
    values_of,
    wait_until,
)
from zk_chroot import new_chroot

from tidelog.cluster.zookeeper import ZooKeeperServer
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records.builder import build_values

pytestmark = pytest.mark.integration

LAG_MS = 1500


@pytest.fixture
def pair(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[tuple[str, list[BrokerThread]]]:
    zk = new_chroot(zookeeper)
    extra = {"replica.lag.time.max.ms": LAG_MS, "min.insync.replicas": 2}
    brokers = [BrokerThread(broker_props(i, zk, tmp_path / f"b{i}", **extra)).start() for i in (1, 2)]
    try:
        yield zk, brokers
    finally:
        for b in brokers:
            b.stop()


def test_follower_joins_isr_hw_advances_and_acks_all_completes(pair: tuple[str, list[BrokerThread]]) -> None:
    zk, (b1, b2) = pair
    ctl = ActingController(zk, [b1, b2])
    try:
        # Leader 1 alone at first (broker 2 not told yet): ISR [1] < min.insync.replicas 2, so
        # acks=all is refused without appending, acks=1 is written.
        ctl.create_topic("rep", {0: [1, 2]}, isr=[1], live=[1])
        assert ctl.read_state("rep", 0).isr == (1,)
        err, _ = produce(b1.port, "rep", 0, build_values([b"early"]))
        assert err == ErrorCode.NOT_ENOUGH_REPLICAS
        assert produce(b1.port, "rep", 0, build_values([b"a"]), acks=1) == (ErrorCode.NONE, 0)
        # KIP-966: the HW does not advance while the ISR is below min.insync.replicas.
        assert b1.partition("rep", 0).high_watermark == 0
        # Now broker 2 learns it is a follower: it fetches, catches up, and the leader adds it
        # to the ISR: AlterPartition to the controller, which writes the partition state.
        ctl.send_leader_and_isr("rep", [0], live={2})
        # (KIP-841: the leader adds only brokers the controller reported live.)
        ctl.send_update_metadata()
        state = wait_until(lambda: (s := ctl.read_state("rep", 0)) is not None and s.isr == (1, 2) and s,
                           what="ISR expansion written to ZooKeeper")
        assert state.leader == 1 and state.zk_version == 1
        assert wait_until(lambda: b1.partition("rep", 0).isr == frozenset({1, 2}))

        err, base = produce(b1.port, "rep", 0, build_values([b"b", b"c"]), acks=-1)
        assert (err, base) == (ErrorCode.NONE, 1)
        # acks=all answered => the follower has the batch and the leader's HW covers it.
        leader = b1.partition("rep", 0)
        assert leader.high_watermark == 3
        follower = b2.partition("rep", 0)
        assert follower.log_end_offset == 3 and not follower.is_leader
        wait_until(lambda: b2.partition("rep", 0).high_watermark == 3, what="follower HW")
        data = fetch(b1.port, "rep", 0, 0)
        assert data.error_code == 0 and data.high_watermark == 3
        assert values_of(data.records) == [b"a", b"b", b"c"]
        # The follower's copy is byte-identical (same offsets and leader epoch stamped).
        f_log = b2.call(lambda: bytes(b2.server.log_manager.get_log("rep", 0).read(0, 1 << 20).records))
        l_log = b1.call(lambda: bytes(b1.server.log_manager.get_log("rep", 0).read(0, 1 << 20).records))
        assert f_log == l_log

        # The follower goes away: after replica.lag.time.max.ms the leader shrinks the ISR.
        b2.stop()
        state = wait_until(lambda: (s := ctl.read_state("rep", 0)) is not None and s.isr == (1,) and s,
                           timeout_s=LAG_MS / 1000 * 6, what="ISR shrink written to ZooKeeper")
        assert state.leader_epoch == 0
        # The leader applies the shrink when its compare-and-set returns: until then a produce
        # is appended over ISR [1,2] and fails after the append (20), not before it (19).
        assert wait_until(lambda: b1.partition("rep", 0).isr == frozenset({1}))
        err, _ = produce(b1.port, "rep", 0, build_values([b"d"]), acks=-1)
        assert err == ErrorCode.NOT_ENOUGH_REPLICAS
        err, base = produce(b1.port, "rep", 0, build_values([b"d"]), acks=1)
        assert (err, base) == (ErrorCode.NONE, 3)
        # Both ISR changes went to the controller as AlterPartition (KIP-497), which announced
        # them: the leader wrote no ISR-change notification.
        assert ctl.alter_partition_hook.requests >= 2
        assert ctl.zk.get_all_isr_change_notifications() == []
    finally:
        ctl.close()


def test_acks_all_waits_for_a_slow_follower_and_times_out(pair: tuple[str, list[BrokerThread]]) -> None:
    """acks=all is delayed in the purgatory until the ISR has the offset; with the follower
    gone and still in the ISR, it times out with REQUEST_TIMED_OUT."""
    zk, (b1, b2) = pair
    ctl = ActingController(zk, [b1, b2])
    try:
        ctl.create_topic("slow", {0: [1, 2]})
        wait_until(lambda: b2.call(lambda: b2.server.replica_manager.fetcher_manager.fetch_state(
            __import__("tidelog.replication.types", fromlist=["TopicPartition"]).TopicPartition("slow", 0)
        )) is not None, what="follower fetcher")
        err, base = produce(b1.port, "slow", 0, build_values([b"x"]), acks=-1)
        assert (err, base) == (ErrorCode.NONE, 0)
        # Stop the follower's fetching without a controller telling the leader: the leader still
        # counts it in the ISR, so acks=all cannot complete before its timeout.
        b2.call(b2.server.replica_manager.fetcher_manager.shutdown)
        err, _ = produce(b1.port, "slow", 0, build_values([b"y"]), acks=-1, timeout_ms=300)
        assert err == ErrorCode.REQUEST_TIMED_OUT
        # The record was appended (acks=all is not a transaction): the leader has it, below no HW.
        assert b1.partition("slow", 0).log_end_offset == 2
        assert b1.partition("slow", 0).high_watermark == 1
    finally:
        ctl.close()


def test_leader_change_follower_truncates_and_catches_up(pair: tuple[str, list[BrokerThread]]) -> None:
    """Leadership moves to broker 2 with a new epoch; broker 1 becomes its follower, asks
    OffsetsForLeaderEpoch, and replicates what the new leader writes."""
    zk, (b1, b2) = pair
    ctl = ActingController(zk, [b1, b2])
    try:
        ctl.create_topic("move", {0: [1, 2]})
        assert produce(b1.port, "move", 0, build_values([b"1", b"2"]), acks=-1) == (ErrorCode.NONE, 0)
        ctl.change_leader("move", 0, leader=2, isr=[1, 2])
        assert wait_until(lambda: b2.partition("move", 0).is_leader)
        # Broker 1 is no longer the leader.
        err, _ = produce(b1.port, "move", 0, build_values([b"no"]), acks=1)
        assert err == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert produce(b2.port, "move", 0, build_values([b"3"]), acks=-1) == (ErrorCode.NONE, 2)
        wait_until(lambda: b1.partition("move", 0).log_end_offset == 3, what="old leader catches up")
        data = fetch(b2.port, "move", 0, 0, current_leader_epoch=1)
        assert values_of(data.records) == [b"1", b"2", b"3"]
        # A fetch carrying the old epoch is fenced (KIP-320).
        assert fetch(b2.port, "move", 0, 0, current_leader_epoch=0).error_code == ErrorCode.FENCED_LEADER_EPOCH
    finally:
        ctl.close()


def test_idempotent_retries_are_recognised_by_a_new_leader(pair: tuple[str, list[BrokerThread]]) -> None:
    """A producer's retry after a leader change is answered with the original offset: the new
    leader rebuilt the producer state from its replicated log, and a broker that was leader
    before keeps it up to date while it follows."""
    zk, (b1, b2) = pair
    ctl = ActingController(zk, [b1, b2])

    def batch(seq: int) -> bytearray:
        return build_values([b"s%d" % seq], producer_id=99, producer_epoch=0, base_sequence=seq)

    try:
        ctl.create_topic("idem2", {0: [1, 2]})
        assert produce(b1.port, "idem2", 0, batch(0), acks=-1) == (ErrorCode.NONE, 0)
        ctl.change_leader("idem2", 0, leader=2, isr=[1, 2])
        wait_until(lambda: b2.partition("idem2", 0).is_leader, what="broker 2 leads")
        assert produce(b2.port, "idem2", 0, batch(0), acks=-1) == (ErrorCode.NONE, 0)  # a retry
        assert produce(b2.port, "idem2", 0, batch(1), acks=-1) == (ErrorCode.NONE, 1)
        assert produce(b2.port, "idem2", 0, batch(3), acks=-1)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        wait_until(lambda: b1.partition("idem2", 0).log_end_offset == 2, what="broker 1 follows")
        ctl.change_leader("idem2", 0, leader=1, isr=[1, 2])
        wait_until(lambda: b1.partition("idem2", 0).is_leader, what="broker 1 leads again")
        assert produce(b1.port, "idem2", 0, batch(1), acks=-1) == (ErrorCode.NONE, 1)
        assert produce(b1.port, "idem2", 0, batch(2), acks=-1) == (ErrorCode.NONE, 2)
        assert values_of(fetch(b1.port, "idem2", 0, 0).records) == [b"s0", b"s1", b"s2"]
    finally:
        ctl.close()
