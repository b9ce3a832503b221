"""The ZooKeeper interface (controller/zk_interface.py) behaves the same over kazoo against a real
ZooKeeper and in the simulator: every test here runs on both, and the controller's execute loop
(controller/executor.py) and the producer id manager run unchanged on either."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tidelog.broker.producer_id_manager import PRODUCER_ID_BLOCK_SIZE, ProducerIdManager
from tidelog.controller import zk_data
from tidelog.controller.core import ControllerCore, LeaderAndIsrRequest, UpdateMetadataRequest
from tidelog.controller.executor import DecisionExecutor
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch
from tidelog.controller.zk_interface import ControllerMovedError, NoTopicError, ZooKeeperClient
from tidelog.replication.types import TopicPartition
from tidelog.sim.clock import Scheduler
from tidelog.sim.zookeeper import SimZooKeeper


@pytest.fixture(params=["sim", pytest.param("kazoo", marks=pytest.mark.integration)])
def zk(request: pytest.FixtureRequest) -> Iterator[ZooKeeperClient]:
    if request.param == "sim":
        yield SimZooKeeper(Scheduler())
        return
    client = KafkaZkClient(request.getfixturevalue("zk_connect")).start()
    try:
        yield client
    finally:
        client.close()


def elect(zk: ZooKeeperClient) -> int:
    """Bump /controller_epoch (a controller elected); its new znode version fences writes."""
    data, version = zk.get_data_and_version(zk_data.CONTROLLER_EPOCH_PATH)
    epoch = zk_data.decode_controller_epoch(data) + 1 if data else 1
    if data is None:
        assert zk.create_path(zk_data.CONTROLLER_EPOCH_PATH, zk_data.encode_controller_epoch(epoch))
    else:
        assert zk.conditional_update_path(zk_data.CONTROLLER_EPOCH_PATH,
                                          zk_data.encode_controller_epoch(epoch), version)
    return zk.get_data_and_version(zk_data.CONTROLLER_EPOCH_PATH)[1]


def create_topic(zk: ZooKeeperClient, topic: str, assignment: dict[int, list[int]]) -> None:
    assert zk.create_path(zk_data.topic_path(topic), zk_data.encode_topic_assignment(assignment))


def state(leader: int, leader_epoch: int, isr: tuple[int, ...]) -> LeaderIsrAndControllerEpoch:
    return LeaderIsrAndControllerEpoch(leader, leader_epoch, isr, controller_epoch=1)


def three_brokers_with_topic(zk: ZooKeeperClient, assignment: dict[int, list[int]]
                             ) -> tuple[ControllerCore, DecisionExecutor]:
    """Topic t assigned as `assignment`, brokers 1-3 alive, its partitions' first leaders
    written by the elected controller's executor."""
    fence = elect(zk)
    create_topic(zk, "t", assignment)
    core = ControllerCore(1, 1)
    for p, replicas in assignment.items():
        core.add_partition(TopicPartition("t", p), replicas)
    for b in (1, 2, 3):
        core.live_brokers[b] = 10 + b
    executor = DecisionExecutor(zk, core, fence)
    executor.execute(core.initial_leaders)
    return core, executor


# --- partition states -------------------------------------------------------------------------


def test_partition_states_are_created_under_a_topic_and_compare_and_set(
        zk: ZooKeeperClient) -> None:
    fence = elect(zk)
    tp = ("orders", 0)
    with pytest.raises(NoTopicError):  # never under a topic that does not exist
        zk.create_partition_states({tp: state(1, 0, (1, 2))}, fence)
    create_topic(zk, "orders", {0: [1, 2]})
    assert zk.create_partition_states({tp: state(1, 0, (1, 2))}, fence) == {tp: True}
    assert zk.create_partition_states({tp: state(2, 0, (2,))}, fence) == {tp: False}
    assert zk.get_partition_state(tp) == LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1, 0)
    assert zk.get_data_and_version(zk_data.partition_state_path(tp)) == (
        b'{"controller_epoch":1,"leader":1,"version":1,"leader_epoch":0,"isr":[1,2]}', 0)
    # A leader's ISR shrink (no fence), then a controller's write from the old version loses.
    assert zk.update_leader_and_isr(tp, state(1, 0, (1,)), 0) == (True, 1)
    assert zk.update_leader_and_isr_many([(tp, state(2, 1, (2,)), 0)], fence) == {tp: (False, -1)}
    # Our own write whose answer was lost: the znode holds exactly it (checkLeaderAndIsrZkData).
    assert zk.update_leader_and_isr(tp, state(1, 0, (1,)), 0) == (True, 1)
    assert zk.get_partition_states([tp, ("orders", 7)]) == {
        tp: LeaderIsrAndControllerEpoch(1, 0, (1,), 1, 1)}


def test_a_deposed_controller_writes_nothing(zk: ZooKeeperClient) -> None:
    old = elect(zk)
    create_topic(zk, "t", {0: [1]})
    tp = ("t", 0)
    zk.create_partition_states({tp: state(1, 0, (1,))}, old)
    elect(zk)  # another controller
    with pytest.raises(ControllerMovedError):
        zk.update_leader_and_isr_many([(tp, state(-1, 1, (1,)), 0)], old)
    with pytest.raises(ControllerMovedError):
        zk.set_unclean_replicas({tp: [1]}, old)
    assert zk.get_partition_state(tp) == LeaderIsrAndControllerEpoch(1, 0, (1,), 1, 0)
    assert zk.get_unclean_replicas() == {}


def test_isr_change_notifications_are_read_oldest_first_and_deleted(zk: ZooKeeperClient) -> None:
    fence = elect(zk)
    first = zk.propagate_isr_changes([("a", 0), ("b", 1)])
    second = zk.propagate_isr_changes([("a", 0)])
    seqs = zk.get_all_isr_change_notifications()
    assert [first, second] == [zk_data.ISR_CHANGE_PREFIX + s for s in seqs]
    assert zk.get_partitions_from_isr_change_notifications(seqs) == {("a", 0), ("b", 1)}
    zk.delete_isr_change_notifications(seqs, fence)
    assert zk.get_all_isr_change_notifications() == []


def test_hundreds_of_notifications_are_read_and_deleted_in_one_pass(zk: ZooKeeperClient) -> None:
    # More than one multi's worth (the deletes go 100 to a multi); one is already gone.
    fence = elect(zk)
    for p in range(250):
        zk.propagate_isr_changes([("a", p)])
    seqs = zk.get_all_isr_change_notifications()
    zk.delete_isr_change_notifications(seqs[7:8], fence)
    assert zk.get_partitions_from_isr_change_notifications(seqs) == {
        ("a", p) for p in range(250) if p != 7}
    zk.delete_isr_change_notifications(seqs, fence)
    assert zk.get_all_isr_change_notifications() == []


def test_an_isr_change_event_sends_only_the_notified_partitions(zk: ZooKeeperClient) -> None:
    _, executor = three_brokers_with_topic(zk, {p: [1, 2, 3] for p in range(4)})
    assert zk.update_leader_and_isr(("t", 2), state(1, 0, (1, 2)), 0) == (True, 1)
    zk.propagate_isr_changes([("t", 2)])
    done = executor.on_isr_change_notifications()
    assert done is not None
    sent = [r for batch in done.requests for rs in batch.values() for r in rs]
    assert sorted({b for batch in done.requests for b in batch}) == [1, 2, 3]
    assert {(s.tp, s.isr) for r in sent if isinstance(r, UpdateMetadataRequest)
            for s in r.partition_states} == {(TopicPartition("t", 2), (1, 2))}
    assert zk.get_all_isr_change_notifications() == []
    assert executor.on_isr_change_notifications() is None


def test_kip966_marks_are_kept_in_one_format(zk: ZooKeeperClient) -> None:
    fence = elect(zk)
    assert zk.get_unclean_replicas() == {}
    zk.set_unclean_replicas({("t", 0): [3, 2], ("t", 1): []}, fence)
    assert zk.get_unclean_replicas() == {("t", 0): {2, 3}}
    assert zk.get_data_and_version(zk_data.UNCLEAN_REPLICAS_PATH)[0] == \
        b'{"partitions": {"t:0": [2, 3]}, "version": 1}'
    zk.set_unclean_replicas({}, fence)
    assert zk.get_unclean_replicas() == {}


# --- users of the interface -----------------------------------------------------------------


def test_producer_id_blocks_are_reserved_by_compare_and_set(zk: ZooKeeperClient) -> None:
    a, b = ProducerIdManager(1, zk), ProducerIdManager(2, zk)
    assert [a.generate_producer_id() for _ in range(3)] == [0, 1, 2]
    assert b.generate_producer_id() == PRODUCER_ID_BLOCK_SIZE  # the next block, not a's
    for _ in range(PRODUCER_ID_BLOCK_SIZE - 3):
        a.generate_producer_id()
    assert a.generate_producer_id() == 2 * PRODUCER_ID_BLOCK_SIZE
    data, _ = zk.get_data_and_version(zk_data.PRODUCER_ID_BLOCK_PATH)
    assert data is not None and b'"broker": 1' in data


def test_the_execute_loop_replays_a_lost_compare_and_set_and_persists_kip966_marks(
        zk: ZooKeeperClient) -> None:
    fence = elect(zk)
    create_topic(zk, "t", {0: [1, 2, 3]})
    tp = TopicPartition("t", 0)
    core = ControllerCore(1, 1)
    core.add_partition(tp, (1, 2, 3))
    for b in (1, 2, 3):
        core.live_brokers[b] = 10 + b
    executor = DecisionExecutor(zk, core, fence)
    done = executor.execute(core.initial_leaders)
    assert [(s.leader, s.isr) for s in done.written] == [(1, (1, 2, 3))]
    assert zk.get_partition_state(tp) == LeaderIsrAndControllerEpoch(1, 0, (1, 2, 3), 1, 0)
    # The leader shrinks the ISR behind the controller's back; broker 1 then fails: the first
    # write (from version 0) loses, the partition is re-read and the event replayed.
    assert zk.update_leader_and_isr(tp, state(1, 0, (1, 2)), 0) == (True, 1)
    done = executor.execute(lambda: core.on_broker_failure(1))
    assert len(done.requests) == 2
    assert zk.get_partition_state(tp) == LeaderIsrAndControllerEpoch(2, 1, (2,), 1, 2)
    assert core.partition_states[tp].zk_version == 2
    sent = [r for batch in done.requests for rs in batch.values() for r in rs]
    assert any(isinstance(r, LeaderAndIsrRequest) and r.partition_states[0].leader == 2
               and r.partition_states[0].isr == (2,) for r in sent)
    assert any(isinstance(r, UpdateMetadataRequest) for r in sent)
    # Broker 3 comes back from an unclean shutdown: marked, and the mark outlives the controller.
    core.mark_unclean_restart(3)
    executor.execute(lambda: core.on_broker_startup(3, 20))
    assert zk.get_unclean_replicas() == {("t", 0): {3}}
    successor = ControllerCore(1, 2)
    successor.add_partition(tp, (1, 2, 3))
    DecisionExecutor(zk, successor, elect(zk)).load_unclean_marks()
    assert successor.unclean_restarted == {tp: {3}}
    with pytest.raises(ControllerMovedError):  # the first controller is deposed now
        executor.execute(lambda: core.on_broker_failure(2))


def count_partition_state_reads(zk: ZooKeeperClient, monkeypatch: pytest.MonkeyPatch
                                ) -> list[tuple[str, int]]:
    """The partition state znodes read through `get_partition_states` from now on."""
    reads: list[tuple[str, int]] = []
    read = zk.get_partition_states

    def counting(tps: list[tuple[str, int]]) -> dict[tuple[str, int], LeaderIsrAndControllerEpoch]:
        reads.extend(tps)
        return read(tps)

    monkeypatch.setattr(zk, "get_partition_states", counting)
    return reads


def test_a_restarted_broker_is_brought_up_from_the_cached_states(
        zk: ZooKeeperClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # Kafka's onBrokerStartup: the broker's replicas go online with the ControllerContext's
    # states; no partition with a live leader is read from ZooKeeper.
    core, executor = three_brokers_with_topic(zk, {p: [1 + p % 3, 1 + (p + 1) % 3, 1 + (p + 2) % 3]
                                                   for p in range(30)})
    executor.broker_failure(3)
    reads = count_partition_state_reads(zk, monkeypatch)
    done = executor.broker_startup(3, 30)
    assert reads == []
    assert core.live_brokers[3] == 30
    sent = [r for batch in done.requests for r in batch.get(3, [])
            if isinstance(r, LeaderAndIsrRequest)]
    assert sorted(s.partition for r in sent for s in r.partition_states) == list(range(30))
    assert all(s.leader != 3 and s.zk_version == 1 for r in sent for s in r.partition_states)


def test_a_started_broker_rereads_only_the_partitions_it_may_lead(
        zk: ZooKeeperClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # t-0 lives on broker 3 alone: offline while 3 is down, elected (after a re-read, as
    # Kafka's electLeaderForPartitions reads the states) when it returns; t-1 keeps its leader.
    core, executor = three_brokers_with_topic(zk, {0: [3], 1: [1, 3]})
    executor.broker_failure(3)
    assert core.partition_states[TopicPartition("t", 0)].leader == -1
    reads = count_partition_state_reads(zk, monkeypatch)
    executor.broker_startup(3, 30)
    assert reads == [("t", 0)]
    assert zk.get_partition_state(("t", 0)) == LeaderIsrAndControllerEpoch(3, 2, (3,), 1, 2)
    assert core.partition_states[TopicPartition("t", 1)].leader == 1


def test_a_bounced_broker_rereads_its_partitions_as_a_failure_does(
        zk: ZooKeeperClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # A registration under another broker epoch is a failure then a startup (KIP-380): the
    # failure's ISR removals decide on ZooKeeper's states, as Kafka's removeReplicasFromIsr.
    core, executor = three_brokers_with_topic(zk, {0: [1, 3], 1: [2, 1], 2: [3, 2]})
    reads = count_partition_state_reads(zk, monkeypatch)
    executor.broker_startup(3, 30)
    assert sorted(reads) == [("t", 0), ("t", 2)]
    assert core.partition_states[TopicPartition("t", 2)].leader == 2
