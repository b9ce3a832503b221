"""The lifecycle's leader choices obey KIP-966 like the offline election: a replica back from an
unclean shutdown is no leader candidate. Found by the simulator's lifecycle faults: seed 7 lost
acked records when a move's phase A elected such a replica (the last member of the ISR), seed
38 when a preferred election (ElectLeaders) did."""

from __future__ import annotations

from tidelog.controller.core import ELECTION_PREFERRED, NO_LEADER, ControllerCore
from tidelog.controller.reassignment import ReplicaAssignment, complete_decision, start_decision
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition

TP = TopicPartition("t", 0)


def offline_with_dirty_last_member() -> ControllerCore:
    """t-0 moving [1,2] -> [0,2]: RS [0,2,1]; offline (leader -1, ISR [1]); broker 1 came back
    from an unclean shutdown (it may have lost the acked tail)."""
    core = ControllerCore(100, 2)
    core.add_partition(TP, (0, 2, 1))
    for b in (0, 1, 2):
        core.live_brokers[b] = 10 + b
    core.refresh_partition(TP, LeaderAndIsrPartitionState(
        topic=TP.topic, partition=TP.partition, controller_epoch=2, leader=NO_LEADER,
        leader_epoch=6, isr=(1,), zk_version=6, replicas=(0, 2, 1)))
    core.mark_unclean_restart(1)
    return core


def test_phase_a_does_not_elect_a_replica_back_from_an_unclean_shutdown() -> None:
    core = offline_with_dirty_last_member()
    d = start_decision(core, TP, ReplicaAssignment((0, 2, 1), (0,), (1,)), ())
    assert [w.state.leader for w in d.writes] == [NO_LEADER]


def test_phase_b_does_not_move_the_leader_onto_one_either() -> None:
    core = offline_with_dirty_last_member()
    core.assignments[TP] = (1, 2)
    d = complete_decision(core, TP, ReplicaAssignment((1, 2), (), (0,)))
    assert [w.state.leader for w in d.writes] == [NO_LEADER]


def test_a_preferred_election_does_not_elect_one() -> None:
    core = offline_with_dirty_last_member()
    core.assignments[TP] = (1, 2, 0)
    d, results = core.elect_leaders([TP], ELECTION_PREFERRED)
    assert d.writes == [] and results[TP][0] != 0
    assert core.elect_preferred_leaders().writes == []
