"""The simulated controller runs the real controller's reassignment phases (KIP-455), partition
additions and ElectLeaders through the shared executor; the lifecycle checks see a broken
move when one is forced."""

from __future__ import annotations

from tidelog.controller.core import ELECTION_UNCLEAN
from tidelog.controller.reassignment import ApiError
from tidelog.controller.reassignment_manager import ReassignmentManager
from tidelog.sim.cluster import SimCluster, SimConfig
from tidelog.sim.controller import SimController
from tidelog.sim.messages import ReplicaFetchRequest
from tidelog.sim.runner import UNCLEAN_ALLOWED, run_seed, unclean_config


def booted(**kw: object) -> SimCluster:
    c = SimCluster(SimConfig(**kw))  # type: ignore[arg-type]
    c.start()
    c.run_for(300)
    return c


def cut_fetches(c: SimCluster, follower: int) -> None:
    c.network.rules.append(
        lambda s, d, m: s == follower and isinstance(m, ReplicaFetchRequest))


def moving_to_3() -> tuple[SimCluster, SimController]:
    """4 brokers, t-0 on [0,1,2] moving to [1,2,3] while 3 cannot fetch (stuck in phase A)."""
    c = booted(brokers=4)
    cut_fetches(c, 3)
    assert c.controller is not None
    assert c.controller.reassign({c.tps[0]: [1, 2, 3]}) == {c.tps[0]: ApiError(0)}
    c.run_for(200)
    return c, c.controller


def kinds(c: SimCluster) -> set[str]:
    return {v.invariant for v in c.checker.violations}


def test_a_move_goes_through_the_full_replica_set_and_deletes_the_old_replica() -> None:
    c, ctl = moving_to_3()
    tp = c.tps[0]
    assert isinstance(ctl.reassignments, ReassignmentManager)  # the real controller's
    p = c.add_producer(tp, -1)
    p.produce(5)
    c.run_for(300)
    # RS = TRS + ORS while 3 cannot catch up; nothing deleted yet.
    assert c.assignments[tp] == (1, 2, 3, 0) and c.moving[tp] == ((3,), (0,))
    assert c.nodes[0].log(tp) is not None
    c.network.rules.clear()
    p.produce(5)
    assert c.settle(10_000)
    s = c.zk_state(tp)
    assert s is not None and c.assignments[tp] == (1, 2, 3) and set(s.isr) == {1, 2, 3}
    assert s.leader in (1, 2, 3) and tp not in c.moving
    c.run_for(200)
    assert c.nodes[0].log(tp) is None
    assert c.final_checks() == [] and c.checker.violations == []


def test_a_new_controller_resumes_the_move_from_the_topic_znode() -> None:
    c, _ = moving_to_3()
    tp = c.tps[0]
    c.failover_controller()
    c.run_for(100)
    assert c.controller.reassignments.list(None)[tp].removing_replicas == (0,)
    c.network.rules.clear()
    assert c.settle(10_000)
    assert c.assignments[tp] == (1, 2, 3)
    assert c.final_checks() == [] and c.checker.violations == []


def test_cancelling_reverts_to_the_original_replicas() -> None:
    c, ctl = moving_to_3()
    tp = c.tps[0]
    assert ctl.reassign({tp: None}) == {tp: ApiError(0)}
    c.run_for(300)
    assert set(c.assignments[tp]) == {0, 1, 2} and tp not in c.moving
    assert c.nodes[3].log(tp) is None
    assert c.checker.violations == []


def test_a_cancel_completes_at_once_while_an_original_replica_is_out_of_the_isr() -> None:
    # Kafka's isReassignmentComplete: the revert has no adding/removing replicas, so it is
    # done; it was left moving (listed, its topic not deletable) until 0 came back.
    c, ctl = moving_to_3()
    tp = c.tps[0]
    c.nodes[0].stop("kill")
    c.run_for(3000)
    s = c.zk_state(tp)
    assert s is not None and 0 not in s.isr
    assert ctl.reassign({tp: None}) == {tp: ApiError(0)}
    c.run_for(300)
    assert tp not in c.moving and ctl.reassignments.list(None) == {}
    assert set(c.assignments[tp]) == {0, 1, 2} and c.nodes[3].log(tp) is None
    assert c.checker.violations == []


def test_regression_unclean_seed_600_cancels_a_move_whose_adding_replica_was_the_whole_isr(
        ) -> None:
    # t-0 moving [2,1] -> [0,2]; 1 and 2 died and 0 (adding) was elected uncleanly, ISR [0];
    # the cancel at 4,856 ms left ISR [0] with replicas [2,1] (IsrWithinAssigned) until the
    # revert restarted the ISR from an original replica as KRaft's does.
    s = run_seed(600, 3000, config=unclean_config(), allowed=UNCLEAN_ALLOWED)
    assert s.ok, s.report()


def test_a_partition_added_to_the_topic_znode_is_created_by_the_controller() -> None:
    c = booted()
    parts = c.zk.get_topic_assignment("t") or {}
    c.zk.set_topic_assignment("t", {**parts, 1: [1, 2, 0]})
    c.run_for(300)
    assert len(c.tps) == 2
    s = c.zk_state(c.tps[1])
    assert s is not None and s.leader == 1 and set(s.isr) == {0, 1, 2}
    assert c.acting_leader(c.tps[1]) is c.nodes[1]


def test_a_move_started_before_the_controller_reads_an_added_partition_keeps_it() -> None:
    # Seed 256 (2000 steps): CreatePartitions wrote partition 1, and a reassignment of t-0
    # rewrote the topic znode from the controller's partitions before its watch read the
    # addition; partition 1 was gone for good and never got a leader.
    c = booted()
    assert c.controller is not None
    parts = c.zk.get_topic_assignment("t") or {}
    c.zk.set_topic_assignment("t", {**parts, 1: [1, 2, 0]})
    assert c.controller.reassign({c.tps[0]: [0, 2]}) == {c.tps[0]: ApiError(0)}
    c.run_for(300)
    assert (c.zk.get_topic_assignment("t") or {}).get(1) == [1, 2, 0]
    assert len(c.tps) == 2
    s = c.zk_state(c.tps[1])
    assert s is not None and s.leader == 1 and set(s.isr) == {0, 1, 2}


def test_an_unclean_election_elects_a_replica_out_of_the_isr() -> None:
    # unclean.leader.election.enable is off: an admin's UNCLEAN election goes ahead anyway.
    c = booted()
    tp = c.tps[0]
    cut_fetches(c, 2)
    c.run_for(3000)  # 2 drops out of the ISR
    c.nodes[0].stop("kill")
    c.nodes[1].stop("kill")
    c.run_for(3000)
    s = c.zk_state(tp)
    assert s is not None and s.leader == -1  # no clean candidate: offline
    assert c.controller is not None
    result = c.controller.elect_leaders([tp], ELECTION_UNCLEAN)
    assert result is not None and result[tp] == (0, None, 2)
    c.network.rules.clear()
    c.run_for(200)
    assert c.acting_leader(tp) is c.nodes[2]


def test_the_lifecycle_checks_catch_an_early_delete_and_an_isr_outside_the_assignment() -> None:
    c, _ = moving_to_3()
    tp = c.tps[0]
    c.lifecycle.on_delete_sent(0, tp)  # as if StopReplica(delete) went out now
    assert "RemovedReplicaDeletedEarly" in kinds(c)
    # AR = TRS written while the old replica is still in the ISR.
    c.zk.set_topic_assignment("t", {0: [1, 2, 3]})
    c.run_for(5)
    assert {"IsrWithinAssigned", "SuccessorsInIsr"} <= kinds(c)
