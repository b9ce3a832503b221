"""KIP-455's pure part: the assignment arithmetic, Kafka's validation and the phase decisions."""

from __future__ import annotations

from dataclasses import replace

from tidelog.controller.core import (
    NO_LEADER,
    ControllerCore,
    Decision,
    LeaderAndIsrRequest,
    StopReplicaRequest,
)
from tidelog.controller.reassignment import (
    INVALID_REPLICA_ASSIGNMENT,
    NO_REASSIGNMENT_IN_PROGRESS,
    ApiError,
    ReplicaAssignment,
    build_reassignment,
    complete_decision,
    decode_reassign_partitions,
    encode_reassign_partitions,
    full_assignments,
    is_reassignment_complete,
    start_decision,
    validate_replicas,
)
from tidelog.replication.types import TopicPartition

TP = TopicPartition("t", 0)


def started(replicas: tuple[int, ...] = (1, 2, 3), live: tuple[int, ...] = (1, 2, 3, 4)
            ) -> ControllerCore:
    core = ControllerCore(100, 1)
    core.add_partition(TP, replicas)
    for b in live:
        core.live_brokers[b] = 10 + b
    apply_all(core, core.initial_leaders())
    return core


def apply_all(core: ControllerCore, d: Decision) -> dict[int, list]:
    return core.commit(d, {w.tp: w.expected_zk_version + 1 for w in d.writes})


def test_reassign_to_puts_the_targets_first_and_names_the_adding_and_removing_replicas():
    a = ReplicaAssignment((1, 2, 3)).reassign_to([2, 3, 4])
    assert a == ReplicaAssignment((2, 3, 4, 1), (4,), (1,))
    assert a.origin_replicas == (2, 3, 1) and a.target_replicas == (2, 3, 4)
    assert a.is_being_reassigned
    # Kafka's arithmetic from the original replicas (a cancellation's revert uses it)
    assert a.reassign_to([3, 5]) == ReplicaAssignment((3, 5, 2, 1), (5,), (2, 1))


def test_a_new_target_for_a_moving_partition_keeps_the_replaced_moves_adding_replicas():
    # (0, 1) moving to (0, 1, 2), then to (1, 0): 2, added by the first move, may be the leader
    # and the only ISR member (sim seed 487); it leaves only when the new target is in the ISR.
    moving = ReplicaAssignment((0, 1)).reassign_to([0, 1, 2])
    assert build_reassignment(moving, [1, 0]) == ReplicaAssignment((1, 0, 2), (), (2,))
    assert build_reassignment(moving, [3, 5]) == ReplicaAssignment((3, 5, 0, 1, 2), (3, 5),
                                                                   (0, 1, 2))
    # from a settled assignment, the same as Kafka's
    assert build_reassignment(ReplicaAssignment((1, 2, 3)), [2, 3, 4]) == \
        ReplicaAssignment((2, 3, 4, 1), (4,), (1,))


def test_cancelling_reverts_to_the_original_replicas_and_needs_a_reassignment():
    moving = ReplicaAssignment((1, 2, 3)).reassign_to([2, 3, 4])
    assert build_reassignment(moving, None) == ReplicaAssignment((2, 3, 1))
    assert build_reassignment(ReplicaAssignment((1, 2, 3)), None) is None


def test_validation_refuses_kafkas_bad_replica_lists():
    current = ReplicaAssignment((1, 2, 3))
    live = {1, 2, 3, 4}
    assert validate_replicas(current, [], live).code == INVALID_REPLICA_ASSIGNMENT  # type: ignore[union-attr]
    dup = validate_replicas(current, [1, 1], live)
    assert dup is not None and dup.message == ("Duplicate replica ids in partition reassignment "
                                               "replica list: ArrayBuffer(1, 1)")  # Kafka 3.9's
    assert ApiError(NO_REASSIGNMENT_IN_PROGRESS).text == "No partition reassignment is in progress."
    assert ApiError(0).text is None
    neg = validate_replicas(current, [1, -2], live)
    assert neg is not None and "Invalid broker id" in (neg.message or "")
    dead = validate_replicas(current, [2, 3, 9], live)
    assert dead is not None and dead.code == INVALID_REPLICA_ASSIGNMENT
    assert "not alive" in (dead.message or "")
    # an original replica on a dead broker may stay or go: only the adding ones must be alive
    assert validate_replicas(current, [2, 3, 4], {2, 3, 4}) is None


def test_completion_needs_every_target_replica_in_the_isr():
    a = ReplicaAssignment((1, 2, 3)).reassign_to([2, 3, 4])
    assert not is_reassignment_complete(a, (1, 2, 3))
    assert is_reassignment_complete(a, (1, 2, 3, 4))


def test_start_sends_the_full_replica_set_with_a_new_epoch_to_every_replica():
    core = started()
    a = ReplicaAssignment((1, 2, 3)).reassign_to([2, 3, 4])
    core.assignments[TP] = a.replicas
    d = start_decision(core, TP, a, ())
    (w,) = d.writes
    assert (w.state.leader, w.state.isr, w.state.replicas) == (1, (1, 2, 3), (2, 3, 4, 1))
    assert w.state.leader_epoch == 1
    out = apply_all(core, d)
    lai = [r for r in out[4] if isinstance(r, LeaderAndIsrRequest)]
    assert lai and lai[0].partition_states[0].replicas == (2, 3, 4, 1)
    assert not any(isinstance(r, StopReplicaRequest) for rs in out.values() for r in rs)


def test_completion_moves_the_leader_into_the_targets_and_deletes_the_removed_replica():
    core = started()
    a = ReplicaAssignment((1, 2, 3)).reassign_to([2, 3, 4])
    core.assignments[TP] = a.replicas
    apply_all(core, start_decision(core, TP, a, ()))
    # the leader expanded the ISR with the new replica
    core.refresh_partition(TP, replace(core.partition_states[TP], isr=(1, 2, 3, 4),
                                       zk_version=core.partition_states[TP].zk_version + 1))
    core.assignments[TP] = a.target_replicas
    d = complete_decision(core, TP, a)
    (w,) = d.writes
    assert (w.state.leader, w.state.isr, w.state.replicas) == (2, (2, 3, 4), (2, 3, 4))
    assert w.state.leader_epoch == 2
    out = apply_all(core, d)
    assert [r for r in out[1] if isinstance(r, LeaderAndIsrRequest)] == []
    (stop,) = [r for r in out[1] if isinstance(r, StopReplicaRequest)]
    assert stop.delete_partitions and stop.partitions == (TP,)
    assert all(not isinstance(r, StopReplicaRequest) for b in (2, 3, 4) for r in out[b])


def test_completion_keeps_a_leader_that_is_a_target_replica():
    core = started(replicas=(2, 1, 3))
    a = ReplicaAssignment((2, 1, 3)).reassign_to([2, 3])
    core.assignments[TP] = a.target_replicas
    (w,) = complete_decision(core, TP, a).writes
    assert (w.state.leader, w.state.isr) == (2, (2, 3))


def test_a_dead_leader_is_replaced_by_a_live_in_sync_target_replica():
    core = started()
    del core.live_brokers[1]
    a = ReplicaAssignment((1, 2, 3)).reassign_to([1, 3, 2])
    core.assignments[TP] = a.target_replicas
    (w,) = complete_decision(core, TP, a).writes
    assert w.state.leader == 3


def test_no_live_in_sync_target_leaves_the_partition_without_leader():
    core = started()
    for b in (1, 2, 3):
        del core.live_brokers[b]
    a = ReplicaAssignment((1, 2, 3))
    (w,) = complete_decision(core, TP, a).writes
    assert w.state.leader == NO_LEADER


def test_the_topic_znode_content_lists_adding_and_removing_per_partition():
    core = started()
    a = ReplicaAssignment((1, 2, 3)).reassign_to([2, 3, 4])
    core.assignments[TP] = a.replicas
    core.add_partition(TopicPartition("t", 1), (3, 1, 2))
    assert full_assignments(core.assignments, {TP: a}, "t") == (
        {0: [2, 3, 4, 1], 1: [3, 1, 2]}, {0: [4]}, {0: [1]})


def test_the_legacy_znode_round_trips_kafkas_format():
    data = encode_reassign_partitions({("t", 0): [2, 3, 4]})
    assert data == b'{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3,4]}]}'
    assert decode_reassign_partitions(data) == {TP: [2, 3, 4]}


def test_a_move_never_elects_a_replica_on_a_failed_log_dir():
    # Kafka's ReassignPartitionLeaderElectionStrategy takes replicas that are online
    # (isReplicaOnline): broker 2 answered KAFKA_STORAGE_ERROR for the partition (sim seed 166).
    core = started()
    core.replicas_on_offline_dirs[2] = {TP}
    a = ReplicaAssignment((1, 2, 3)).reassign_to([2, 3])
    core.add_partition(TP, a.replicas)
    d = complete_decision(core, TP, a)
    assert d.writes[0].state.leader == 3


def cancelled_with_only_adding_replicas_in_sync(live: tuple[int, ...]) -> ControllerCore:
    """t-0 moving [2,1] -> [0,2] (RS [0,2,1], adding 0) when 1 and 2 died and 0 was elected
    uncleanly (ISR [0]); the move is cancelled: the core's assignment is back to [2,1] and the
    adding replica 0 leaves (sim seed 600 --unclean)."""
    core = started(replicas=(0, 2, 1), live=(0, 1, 2))
    core.unclean_leader_election_enable = True
    core.refresh_partition(TP, replace(core.partition_states[TP], leader=0, isr=(0,)))
    core.assignments[TP] = (2, 1)
    for b in set(core.live_brokers) - set(live):
        del core.live_brokers[b]
    return core


def test_a_cancel_whose_adding_replicas_were_the_whole_isr_restarts_it_from_an_original_one():
    # KRaft's PartitionReassignmentRevert: ISR [first original replica]. Kafka's ZooKeeper
    # controller keeps the deleted replica 0 as the ISR, outside the assignment [2,1].
    core = cancelled_with_only_adding_replicas_in_sync(live=(0, 1, 2))
    (w,) = complete_decision(core, TP, ReplicaAssignment((2, 1), (), (0,))).writes
    assert (w.state.leader, w.state.isr, w.state.replicas) == (2, (2,), (2, 1))


def test_without_the_first_original_replica_the_cancel_elects_another_one_uncleanly():
    core = cancelled_with_only_adding_replicas_in_sync(live=(0, 1))
    (w,) = complete_decision(core, TP, ReplicaAssignment((2, 1), (), (0,))).writes
    assert (w.state.leader, w.state.isr) == (1, (1,))
    # with no original replica alive, the partition waits offline for the first one
    core = cancelled_with_only_adding_replicas_in_sync(live=(0,))
    (w,) = complete_decision(core, TP, ReplicaAssignment((2, 1), (), (0,))).writes
    assert (w.state.leader, w.state.isr) == (NO_LEADER, (2,))
