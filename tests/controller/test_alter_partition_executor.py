"""AlterPartition (KIP-497) at the controller, the code both controllers run
(`DecisionExecutor.alter_partition` over `ControllerCore.alter_partition`): each check Kafka's
KafkaController.tryProcessAlterPartition makes, the write, and the UpdateMetadata it sends
instead of a LeaderAndIsr. On the simulator's ZooKeeper and on a real one (test_zk_interface's
fixture)."""

from __future__ import annotations

import pytest
from test_zk_interface import three_brokers_with_topic
from test_zk_interface import zk as zk  # the fixture: both ZooKeepers

from tidelog.controller.core import ControllerCore, LeaderAndIsrRequest, UpdateMetadataRequest
from tidelog.controller.executor import AlterPartitionOutcome, DecisionExecutor
from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch
from tidelog.controller.zk_interface import ZooKeeperClient
from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import ProposeIsr, TopicPartition

TP = TopicPartition("t", 0)


def setup(zk: ZooKeeperClient) -> tuple[ControllerCore, DecisionExecutor]:
    """t-0 on brokers 1-3 (epochs 11-13), led by 1 at leader epoch 0, zk version 0; the
    ISR is shrunk to [1, 2] by the controller first (so an expansion to 3 is proposable)."""
    core, executor = three_brokers_with_topic(zk, {0: [1, 2, 3]})
    s = core.partition_states[TP]
    assert (s.leader, s.leader_epoch, s.zk_version) == (1, 0, 0)
    out = executor.alter_partition(1, 11, [propose(isr=(1, 2), zk_version=0)])
    assert out.errors == {TP: 0}
    return core, executor


def propose(isr: tuple[int, ...] = (1, 2, 3), leader_epoch: int = 0, zk_version: int = 1,
            epochs: dict[int, int] | None = None, tp: TopicPartition = TP) -> ProposeIsr:
    epochs = {1: 11, 2: 12, 3: 13} if epochs is None else epochs
    return ProposeIsr(tp, 1, leader_epoch, isr, zk_version, 1,
                      tuple((b, epochs.get(b, -1)) for b in isr))


def test_an_accepted_change_is_written_and_announced_by_update_metadata_only(
        zk: ZooKeeperClient) -> None:
    core, executor = setup(zk)
    out = executor.alter_partition(1, 11, [propose()])
    assert out.error == 0 and out.errors == {TP: 0} and out.written == [TP]
    state = out.states[TP]
    assert state.isr == (1, 2, 3) and state.leader == 1 and state.zk_version == 2
    assert core.partition_states[TP] == state
    written = zk.get_partition_state(("t", 0))
    assert written is not None and written.isr == (1, 2, 3) and written.zk_version == 2
    requests = [r for batch in out.executed.requests for rs in batch.values() for r in rs]
    assert not any(isinstance(r, LeaderAndIsrRequest) for r in requests)
    updates = [r for r in requests if isinstance(r, UpdateMetadataRequest)]
    assert len(updates) == 3 and all(r.partition_states == (state,) for r in updates)
    assert zk.get_all_isr_change_notifications() == []


def test_a_retry_of_a_change_already_made_is_answered_with_the_state(zk: ZooKeeperClient) -> None:
    _, executor = setup(zk)
    executor.alter_partition(1, 11, [propose()])
    # The answer was lost: the leader sends the same proposal, with the zk version it had.
    again = executor.alter_partition(1, 11, [propose()])
    assert again.errors == {TP: 0} and again.written == []
    assert again.states[TP].zk_version == 2


@pytest.mark.parametrize(("broker", "epoch"), [(1, 10), (4, 14)], ids=["stale", "unknown"])
def test_a_request_from_another_registration_is_refused_whole(
        zk: ZooKeeperClient, broker: int, epoch: int) -> None:
    _, executor = setup(zk)
    out = executor.alter_partition(broker, epoch, [propose()])
    assert out.error == ErrorCode.STALE_BROKER_EPOCH and out.errors == {}
    assert zk.get_partition_state(("t", 0)).isr == (1, 2)  # type: ignore[union-attr]
    # Kafka answers at once: no UpdateMetadata (a leader retrying every 50 ms until the
    # controller sees its new registration sent every broker one per retry)
    assert [r for batch in out.executed.requests for rs in batch.values() for r in rs] == []


@pytest.mark.parametrize(("proposal", "error"), [
    (propose(leader_epoch=1), ErrorCode.NOT_CONTROLLER),  # ahead of this controller's state
    (propose(zk_version=2), ErrorCode.NOT_CONTROLLER),
    (propose(zk_version=0), ErrorCode.INVALID_UPDATE_VERSION),
    (propose(isr=(1, 2, 4)), ErrorCode.INELIGIBLE_REPLICA),  # broker 4 is not registered
    (propose(epochs={1: 11, 2: 12, 3: 9}), ErrorCode.INELIGIBLE_REPLICA),  # 3's old epoch
    (propose(tp=TopicPartition("t", 5)), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
], ids=["leader epoch ahead", "zk version ahead", "stale zk version", "unregistered member",
        "member's earlier registration", "unknown partition"])
def test_each_check_refuses_with_kafkas_error(zk: ZooKeeperClient, proposal: ProposeIsr,
                                              error: ErrorCode) -> None:
    _, executor = setup(zk)
    out = executor.alter_partition(1, 11, [proposal])
    assert out.error == 0 and out.errors == {proposal.tp: error} and out.written == []
    assert zk.get_partition_state(("t", 0)).zk_version == 1  # type: ignore[union-attr]


def test_a_leader_of_an_earlier_epoch_is_fenced(zk: ZooKeeperClient) -> None:
    core, executor = setup(zk)
    # The controller elects 2 (leader epoch 1); leader 1 has not heard of it yet.
    executor.execute(lambda: core.controlled_shutdown(1))
    assert core.partition_states[TP].leader_epoch == 1
    out = executor.alter_partition(1, 11, [propose()])
    assert out.errors == {TP: ErrorCode.FENCED_LEADER_EPOCH}


def test_a_member_shutting_down_is_ineligible(zk: ZooKeeperClient) -> None:
    core, executor = setup(zk)
    core.shutting_down.add(3)
    assert executor.alter_partition(1, 11, [propose()]).errors == {
        TP: ErrorCode.INELIGIBLE_REPLICA}
    executor.kip841_eligibility = False  # the simulator's scenarios without the rule
    assert executor.alter_partition(1, 11, [propose()]).errors == {TP: 0}


def test_a_lost_compare_and_set_answers_invalid_update_version(zk: ZooKeeperClient) -> None:
    """The controller's cache is behind ZooKeeper (someone else wrote the state): the write
    loses its compare-and-set, the state is read again and the check refuses the proposal."""
    core, executor = setup(zk)
    fence = executor.epoch_zk_version
    ok, _ = zk.update_leader_and_isr(
        ("t", 0), LeaderIsrAndControllerEpoch(1, 0, (1,), 1), 1, fence)
    assert ok
    out = executor.alter_partition(1, 11, [propose()])
    assert out.errors == {TP: ErrorCode.INVALID_UPDATE_VERSION}
    assert core.partition_states[TP].isr == (1,)


def test_the_partitions_answer_independently(zk: ZooKeeperClient) -> None:
    core, executor = three_brokers_with_topic(zk, {0: [1, 2, 3], 1: [1, 2, 3]})
    tp1 = TopicPartition("t", 1)
    out = executor.alter_partition(1, 11, [propose(isr=(1, 2), zk_version=0),
                                           propose(isr=(1, 4), zk_version=0, tp=tp1)])
    assert out.errors == {TP: 0, tp1: ErrorCode.INELIGIBLE_REPLICA} and out.written == [TP]
    updates = [r for batch in out.executed.requests for rs in batch.values() for r in rs
               if isinstance(r, UpdateMetadataRequest)]
    # Kafka's UpdateMetadata names every partition of the request
    assert {(s.topic, s.partition) for s in updates[0].partition_states} == {("t", 0), ("t", 1)}
    assert core.partition_states[TP].isr == (1, 2) and core.partition_states[tp1].isr == (1, 2, 3)


def test_each_partition_is_answered_with_its_error_or_its_new_state(zk: ZooKeeperClient) -> None:
    core, executor = three_brokers_with_topic(zk, {0: [1, 2, 3], 1: [1, 2, 3]})
    tp1, tp2 = TopicPartition("t", 1), TopicPartition("t", 2)
    out = executor.alter_partition(1, 11, [propose(isr=(1, 2), zk_version=0),
                                           propose(isr=(1, 4), zk_version=0, tp=tp1)])
    assert list(out.partition_answers()) == [
        (TP, 0, core.partition_states[TP]), (tp1, ErrorCode.INELIGIBLE_REPLICA, None)]
    # A NONE whose state the controller does not know (the partition gone meanwhile).
    gone = AlterPartitionOutcome(out.executed, 0, {tp2: 0}, {})
    assert list(gone.partition_answers()) == [(tp2, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)]
