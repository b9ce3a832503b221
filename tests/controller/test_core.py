"""The pure controller: events in, ZooKeeper writes and controller requests out."""

from __future__ import annotations

from tidelog.controller.core import (
    NO_LEADER,
    ControllerCore,
    Decision,
    LeaderAndIsrRequest,
    StopReplicaRequest,
    UpdateMetadataRequest,
)
from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition

TP = TopicPartition("t", 0)


def cluster(brokers: dict[int, int] | None = None, *, unclean: bool = False,
            replicas: tuple[int, ...] = (0, 1, 2)) -> ControllerCore:
    core = ControllerCore(100, 1, unclean_leader_election_enable=unclean)
    core.add_partition(TP, replicas)
    for b, epoch in (brokers if brokers is not None else {0: 10, 1: 11, 2: 12}).items():
        core.live_brokers[b] = epoch
    return core


def apply_all(core: ControllerCore, d: Decision) -> dict[int, list]:
    """Pretend every compare-and-set succeeded (ZooKeeper bumps the version by one)."""
    return core.commit(d, {w.tp: w.expected_zk_version + 1 for w in d.writes})


def started(core: ControllerCore) -> ControllerCore:
    apply_all(core, core.initial_leaders())
    return core


def test_initial_leader_is_first_live_assigned_replica_and_everyone_hears() -> None:
    core = cluster({1: 11, 2: 12})
    d = core.initial_leaders()
    assert [(w.state.leader, w.state.isr, w.expected_zk_version) for w in d.writes] == [(1, (1, 2), -1)]
    out = apply_all(core, d)
    lai = [r for r in out[1] if isinstance(r, LeaderAndIsrRequest)][0]
    assert lai.broker_epoch == 11 and lai.partition_states[0].leader == 1
    assert lai.partition_states[0].zk_version == 0
    assert sorted(out) == [1, 2]
    assert all(isinstance(out[b][-1], UpdateMetadataRequest) for b in out)


def test_leader_failure_elects_next_isr_replica_with_a_new_epoch_as_a_cas() -> None:
    core = started(cluster())
    d = core.on_broker_failure(0)
    (w,) = d.writes
    assert w.state.leader == 1 and w.state.isr == (1, 2)
    assert w.state.leader_epoch == 1 and w.expected_zk_version == 0
    out = apply_all(core, d)
    assert 0 not in out  # a dead broker gets nothing
    assert core.partition_states[TP].zk_version == 1


def test_follower_failure_shrinks_isr_and_bumps_epoch_but_keeps_leader() -> None:
    core = started(cluster())
    d = core.on_broker_failure(2)
    (w,) = d.writes
    assert (w.state.leader, w.state.isr, w.state.leader_epoch) == (0, (0, 1), 1)


def test_last_replica_standing_stays_in_isr_and_partition_goes_offline() -> None:
    core = started(cluster())
    apply_all(core, core.on_broker_failure(1))
    apply_all(core, core.on_broker_failure(2))
    d = core.on_broker_failure(0)
    assert d.offline == [TP]
    (w,) = d.writes
    assert w.state.leader == NO_LEADER and w.state.isr == (0,)
    apply_all(core, d)
    # 1 comes back: not in the ISR, unclean election off -> still offline.
    d = core.on_broker_startup(1, 21)
    assert d.writes == [] and d.offline == [TP]
    # 0 comes back cleanly: it is the ISR, it leads again.
    d = core.on_broker_startup(0, 22)
    (w,) = d.writes
    assert w.state.leader == 0


def test_unclean_election_picks_a_live_replica_outside_the_isr_only_when_enabled() -> None:
    for unclean, leader in ((False, None), (True, 1)):
        core = started(cluster(unclean=unclean))
        apply_all(core, core.on_broker_failure(1))
        apply_all(core, core.on_broker_failure(2))
        apply_all(core, core.on_broker_failure(0))
        d = core.on_broker_startup(1, 30)
        got = d.writes[0].state.leader if d.writes else None
        assert got == leader
        if unclean:
            assert d.writes[0].state.isr == (1,) and core.stats.unclean_elections == 1


def test_kip966_replica_back_from_unclean_shutdown_is_no_clean_candidate() -> None:
    core = started(cluster())
    apply_all(core, core.on_broker_failure(1))
    apply_all(core, core.on_broker_failure(2))
    apply_all(core, core.on_broker_failure(0))
    assert core.partition_states[TP].isr == (0,)
    core.mark_unclean_restart(0)
    d = core.on_broker_startup(0, 40)
    assert d.writes == [] and d.offline == [TP]
    # Without the mark (a clean restart), the same broker leads again.
    core.unclean_restarted.clear()
    d = core.on_broker_startup(0, 41)
    assert d.writes[0].state.leader == 0


def test_unclean_mark_clears_once_back_in_the_isr_under_another_leader() -> None:
    core = started(cluster())
    core.mark_unclean_restart(2)
    state = core.partition_states[TP]
    core.on_isr_change({TP: LeaderAndIsrPartitionState(
        "t", 0, 1, 0, state.leader_epoch, (0, 1, 2), state.zk_version + 1, (0, 1, 2))})
    assert 2 not in core.unclean_restarted[TP]


def test_bounced_broker_with_new_epoch_is_a_failure_then_a_startup() -> None:
    core = started(cluster())
    d = core.on_broker_startup(0, 99)  # 0 re-registered: new broker epoch
    leaders = [w.state.leader for w in d.writes]
    assert leaders and leaders[0] != 0  # leadership moved off the old registration first
    out = apply_all(core, d)
    lai = [r for r in out.get(0, []) if isinstance(r, LeaderAndIsrRequest)]
    assert lai and lai[0].broker_epoch == 99


def test_a_bounce_writes_each_partition_once_and_its_elections_last() -> None:
    # led: moves to 1 at the failure; alone: no other replica, so leaderless at the failure and
    # led by the new registration after it; followed: 0 leaves the ISR.
    led, alone, followed = (TopicPartition("t", p) for p in range(3))
    core = ControllerCore(100, 1)
    for tp, replicas in ((led, (0, 1, 2)), (alone, (0,)), (followed, (1, 0))):
        core.add_partition(tp, replicas)
    core.live_brokers.update({0: 10, 1: 11, 2: 12})
    started(core)
    d = core.on_broker_startup(0, 99)
    assert [(w.tp, w.state.leader) for w in d.writes] == [(led, 1), (followed, 1), (alone, 0)]
    assert d.writes[-1].expected_zk_version == 0  # the failure's write of it was replaced
    assert d.writes[1].state.isr == (1,)
    out = apply_all(core, d)
    (lai,) = [r for r in out[0] if isinstance(r, LeaderAndIsrRequest)]
    assert sorted(s.tp for s in lai.partition_states) == [led, alone, followed]


def test_a_started_broker_hears_each_of_its_partitions_once() -> None:
    core = spread(12)
    apply_all(core, core.on_broker_failure(3))
    core.add_partition(TopicPartition("u", 0), (3,))  # no replica alive until 3 starts
    d = core.on_broker_startup(3, 23)
    assert [w.tp for w in d.writes] == [TopicPartition("u", 0)]
    out = apply_all(core, d)
    (lai,) = [r for r in out[3] if isinstance(r, LeaderAndIsrRequest)]
    named = [s.tp for s in lai.partition_states]
    assert sorted(named) == sorted(tp for tp, rs in core.assignments.items() if 3 in rs)
    assert len(named) == len(set(named))


def test_controlled_shutdown_moves_leadership_and_stops_replicas() -> None:
    core = started(cluster())
    d = core.controlled_shutdown(0)
    (w,) = d.writes
    assert w.state.leader == 1 and 0 not in w.state.isr
    out = apply_all(core, d)
    stop = [r for r in out[0] if isinstance(r, StopReplicaRequest)]
    assert stop and stop[0].partitions == (TP,) and stop[0].delete_partitions is False
    assert not any(isinstance(r, LeaderAndIsrRequest) for r in out[0])


def test_failed_cas_is_not_applied_and_refresh_lets_the_event_replay() -> None:
    core = started(cluster())
    d = core.on_broker_failure(0)
    out = core.commit(d, {TP: None})  # a leader changed the ISR meanwhile
    assert core.partition_states[TP].leader == 0
    assert not any(isinstance(r, LeaderAndIsrRequest) for rs in out.values() for r in rs)
    # The shell re-reads: ISR is now (0, 1) at version 1.
    core.refresh_partition(TP, LeaderAndIsrPartitionState("t", 0, 1, 0, 0, (0, 1), 1, (0, 1, 2)))
    d = core.on_broker_failure(0)
    (w,) = d.writes
    assert w.expected_zk_version == 1 and w.state.leader == 1 and w.state.isr == (1,)


def test_preferred_election_moves_leadership_back_to_first_replica() -> None:
    core = started(cluster())
    apply_all(core, core.on_broker_failure(0))
    assert core.partition_states[TP].leader == 1
    core.on_broker_startup(0, 50)
    state = core.partition_states[TP]
    core.refresh_partition(TP, LeaderAndIsrPartitionState(
        "t", 0, 1, 1, state.leader_epoch, (1, 2, 0), state.zk_version + 1, (0, 1, 2)))
    d = core.elect_preferred_leaders()
    (w,) = d.writes
    assert w.state.leader == 0


def test_requests_carry_controller_epoch_and_each_receivers_broker_epoch() -> None:
    core = started(cluster())
    out = apply_all(core, core.on_broker_failure(2))
    for broker, reqs in out.items():
        for r in reqs:
            assert r.controller_epoch == 1 and r.controller_id == 100
            assert r.broker_epoch == core.live_brokers[broker]


def test_new_partition_without_live_replicas_comes_online_when_one_starts() -> None:
    core = cluster({})  # nobody registered yet
    d = core.initial_leaders()
    assert d.writes == [] and d.offline == [TP]
    d = core.on_broker_startup(1, 31)
    (w,) = d.writes
    assert w.expected_zk_version == -1 and w.state.leader == 1 and w.state.isr == (1,)
    out = apply_all(core, d)
    assert core.partition_states[TP].zk_version == 0
    assert any(isinstance(r, LeaderAndIsrRequest) for r in out[1])


def test_startup_load_before_initial_leaders_does_not_elect_from_a_partial_view() -> None:
    core = ControllerCore(100, 1)
    core.add_partition(TP, (2, 0, 1))
    for b, e in ((0, 10), (1, 11), (2, 12)):  # brokers found at controller start, one by one
        assert core.on_broker_startup(b, e).writes == []
    (w,) = core.initial_leaders().writes
    assert w.state.leader == 2 and w.state.isr == (2, 0, 1)


def test_elect_offline_leaders_uses_the_current_unclean_rule_for_the_named_topics() -> None:
    core = started(cluster())
    core.partition_states[TP] = LeaderAndIsrPartitionState(
        "t", 0, 1, 0, 0, (0,), core.partition_states[TP].zk_version, (0, 1, 2))
    apply_all(core, core.on_broker_failure(0))  # ISR [0] only: no clean candidate
    assert core.partition_states[TP].leader == NO_LEADER
    assert core.elect_offline_leaders({"t"}).writes == []
    core.unclean_leader_election_enable = True
    assert core.elect_offline_leaders({"other"}).writes == []
    (w,) = core.elect_offline_leaders({"t"}).writes
    assert w.state.leader in (1, 2) and w.state.isr == (w.state.leader,)


# -- ElectLeaders (an admin's election) -----------------------------------------------------
def test_preferred_election_moves_the_leader_back_to_the_first_replica() -> None:
    from tidelog.controller.core import ELECTION_PREFERRED

    core = started(cluster())
    apply_all(core, core.on_broker_failure(0))
    apply_all(core, core.on_broker_startup(0, 20))
    state = core.partition_states[TP]
    apply_all(core, core.on_isr_change({TP: LeaderAndIsrPartitionState(
        topic="t", partition=0, controller_epoch=1, leader=state.leader,
        leader_epoch=state.leader_epoch, isr=(0, 1, 2), zk_version=state.zk_version,
        replicas=(0, 1, 2))}))
    d, results = core.elect_leaders([TP, TopicPartition("t", 9)], ELECTION_PREFERRED)
    assert results == {TP: (0, None, 0),
                       TopicPartition("t", 9): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.", -1)}
    (w,) = d.writes
    assert (w.state.leader, w.state.leader_epoch) == (0, state.leader_epoch + 1)
    apply_all(core, d)
    _, again = core.elect_leaders([TP], ELECTION_PREFERRED)
    assert again == {TP: (ErrorCode.ELECTION_NOT_NEEDED, None, -1)}


def test_preferred_election_needs_the_preferred_replica_in_the_isr() -> None:
    from tidelog.controller.core import ELECTION_PREFERRED

    core = started(cluster())
    apply_all(core, core.on_broker_failure(0))  # 0 leaves the ISR
    d, results = core.elect_leaders([TP], ELECTION_PREFERRED)
    assert d.writes == []
    assert results == {TP: (ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, "Failed to elect leader for partition t-0 under strategy"
                                " PreferredReplicaPartitionLeaderElectionStrategy", -1)}


def test_unclean_election_takes_a_live_replica_out_of_the_isr() -> None:
    from tidelog.controller.core import ELECTION_UNCLEAN

    core = started(cluster({0: 10, 1: 11}, replicas=(0, 1)))
    apply_all(core, core.on_broker_failure(1))  # ISR [0]
    apply_all(core, core.on_broker_failure(0))  # offline, ISR kept [0]
    assert core.partition_states[TP].leader == NO_LEADER
    d, results = core.elect_leaders([TP], ELECTION_UNCLEAN)
    assert results == {TP: (ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "Failed to elect leader for partition t-0 under strategy"
                                " OfflinePartitionLeaderElectionStrategy(true)", -1)}
    apply_all(core, core.on_broker_startup(1, 21))  # out of sync: no clean election
    assert core.partition_states[TP].leader == NO_LEADER
    d, results = core.elect_leaders([TP], ELECTION_UNCLEAN)  # the broker config says no
    assert results == {TP: (0, None, 1)}
    (w,) = d.writes
    assert (w.state.leader, w.state.isr) == (1, (1,))
    apply_all(core, d)
    _, again = core.elect_leaders([TP], ELECTION_UNCLEAN)
    assert again == {TP: (ErrorCode.ELECTION_NOT_NEEDED, None, -1)}


# -- UpdateMetadata names the partitions an event touched (Kafka's ControllerBrokerRequestBatch) --

def spread(partitions: int = 6) -> ControllerCore:
    """Partitions t-0..t-5 over brokers 0-3, three replicas each, all led."""
    core = ControllerCore(100, 1)
    for p in range(partitions):
        core.add_partition(TopicPartition("t", p), tuple((p + i) % 4 for i in range(3)))
    for b in range(4):
        core.live_brokers[b] = 10 + b
    return started(core)


def metadata_partitions(out: dict[int, list], broker: int) -> set[TopicPartition]:
    return {s.tp for r in out.get(broker, []) if isinstance(r, UpdateMetadataRequest)
            for s in r.partition_states}


def test_isr_change_sends_every_broker_the_notified_partitions_only() -> None:
    core = spread()
    tp = TopicPartition("t", 4)
    shrunk = LeaderAndIsrPartitionState("t", 4, 1, 0, 0, (0, 1), 1, (0, 1, 2))
    out = apply_all(core, core.on_isr_change({tp: shrunk}))
    assert sorted(out) == [0, 1, 2, 3]
    for b in range(4):
        (um,) = [r for r in out[b] if isinstance(r, UpdateMetadataRequest)]
        assert um.partition_states == (core.partition_states[tp],)
        assert um.live_brokers == ((0, 10), (1, 11), (2, 12), (3, 13))


def test_broker_failure_names_each_of_its_partitions_changed_or_not() -> None:
    core = spread()
    hosted = {tp for tp, rs in core.assignments.items() if 3 in rs}
    out = apply_all(core, core.on_broker_failure(3))
    assert hosted != set(core.assignments)
    for b in (0, 1, 2):
        # Its offline replicas changed in each, written or not; the others are unchanged.
        assert metadata_partitions(out, b) == hosted


def test_broker_startup_sends_the_new_broker_everything_and_the_others_its_partitions() -> None:
    core = spread()
    apply_all(core, core.on_broker_failure(3))
    out = apply_all(core, core.on_broker_startup(3, 23))
    assert metadata_partitions(out, 3) == set(core.assignments)
    hosted = {tp for tp, rs in core.assignments.items() if 3 in rs}
    for b in (0, 1, 2):
        assert metadata_partitions(out, b) == hosted


def test_a_started_broker_hears_the_metadata_first_then_its_leader_and_isr() -> None:
    """Kafka's onBrokerStartup: first an UpdateMetadata to every live broker (to the started
    one every partition state as cached before the event, to the others none), then the
    LeaderAndIsr of its replicas and elections, then the UpdateMetadata of what changed."""
    core = started(cluster({0: 10, 1: 11, 2: 12, 3: 13}))
    for b in (1, 2, 0):
        apply_all(core, core.on_broker_failure(b))
    assert core.partition_states[TP].leader == NO_LEADER
    out = apply_all(core, core.on_broker_startup(0, 20))
    first, lai, last = out[0]
    assert isinstance(first, UpdateMetadataRequest) and isinstance(lai, LeaderAndIsrRequest)
    assert isinstance(last, UpdateMetadataRequest)
    assert dict(first.live_brokers) == {0: 20, 3: 13}
    # as cached before the election, which only the LeaderAndIsr announces
    assert [(s.tp, s.leader) for s in first.partition_states] == [(TP, NO_LEADER)]
    assert [s.leader for s in lai.partition_states] == [0]
    assert [(s.tp, s.leader) for s in last.partition_states] == [(TP, 0)]
    assert [[s.tp for s in r.partition_states] for r in out[3]] == [[], [TP]]


def test_controlled_shutdown_names_the_partitions_of_the_broker_only() -> None:
    core = spread()
    hosted = {tp for tp, rs in core.assignments.items() if 0 in rs}
    out = apply_all(core, core.controlled_shutdown(0))
    for b in range(4):
        assert metadata_partitions(out, b) == hosted

