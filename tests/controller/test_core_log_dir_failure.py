"""The pure controller and a broker's log dir failing (Kafka's JBOD in ZooKeeper mode): the log
dir event asks the broker about every replica (LeaderAndIsr); the replicas it answers
KAFKA_STORAGE_ERROR for are offline: leaderships move off them, they leave the ISRs, and
UpdateMetadata names them as offline replicas."""

from __future__ import annotations

from test_core import apply_all, cluster, started

from tidelog.controller.core import (
    NO_LEADER,
    ControllerCore,
    LeaderAndIsrRequest,
    StopReplicaRequest,
    UpdateMetadataRequest,
)
from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import TopicPartition

TP = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)  # led by broker 1
STORAGE = int(ErrorCode.KAFKA_STORAGE_ERROR)


def two_partitions() -> ControllerCore:
    core = cluster()
    core.add_partition(TP1, (1, 2, 0))
    return started(core)


def test_a_log_dir_event_sends_leader_and_isr_for_every_replica_of_the_broker() -> None:
    core = two_partitions()
    d = core.on_log_dir_failure([0, 7])  # 7: not a live broker
    assert d.writes == [] and d.resend == {TP: {0}, TP1: {0}}
    out = apply_all(core, d)
    [lai] = [r for r in out[0] if isinstance(r, LeaderAndIsrRequest)]
    assert sorted((s.topic, s.partition, s.leader) for s in lai.partition_states) == [
        ("t", 0, 0), ("t", 1, 1)]


def test_storage_errors_move_the_leadership_and_shrink_the_isr() -> None:
    core = two_partitions()
    assert core.on_leader_and_isr_response(0, {TP: STORAGE, TP1: STORAGE}) == {TP, TP1}
    d = core.on_replicas_offline(0, {TP, TP1})
    writes = {w.tp: w.state for w in d.writes}
    # The partition it led gets a new leader among the online replicas, without it in the ISR.
    assert (writes[TP].leader, writes[TP].isr, writes[TP].leader_epoch) == (1, (1, 2), 1)
    # It leaves the ISR of the one it followed.
    assert (writes[TP1].leader, writes[TP1].isr) == (1, (1, 2))
    assert d.stop_replicas == {0: {TP, TP1}}
    out = apply_all(core, d)
    # The new state goes to the online replicas only; the broker stops its offline replicas.
    assert not any(isinstance(r, LeaderAndIsrRequest) for r in out[0])
    assert [r.partitions for r in out[0] if isinstance(r, StopReplicaRequest)] == [(TP, TP1)]
    [um] = [r for r in out[1] if isinstance(r, UpdateMetadataRequest)]
    assert dict(um.offline_dir_replicas) == {TP: (0,), TP1: (0,)}
    # The same answer again changes nothing.
    assert core.on_leader_and_isr_response(0, {TP: STORAGE, TP1: STORAGE}) == set()


def test_an_offline_replica_is_no_leader_candidate_and_the_last_one_leaves_no_leader() -> None:
    core = started(cluster({0: 10, 1: 11}))  # ISR (0, 1)
    apply_all(core, core.on_replicas_offline(1, core.on_leader_and_isr_response(1, {TP: STORAGE})))
    assert core.partition_states[TP].isr == (0,)
    d = core.on_broker_failure(0)
    # Broker 1 is alive but its replica is on a failed dir: the partition goes offline.
    assert [(w.state.leader, w.state.isr) for w in d.writes] == [(NO_LEADER, (0,))]
    assert d.offline == [TP]


def test_the_broker_registering_again_brings_its_replicas_back() -> None:
    core = started(cluster({0: 10, 1: 11}))
    core.on_leader_and_isr_response(1, {TP: STORAGE})
    apply_all(core, core.on_broker_startup(1, 21))  # restarted: a new registration
    assert core.replicas_on_offline_dirs == {}
    assert core.is_replica_online(1, TP)


def test_an_answer_without_the_error_brings_a_replica_back_online() -> None:
    core = two_partitions()
    core.on_leader_and_isr_response(0, {TP: STORAGE, TP1: STORAGE})
    assert core.on_leader_and_isr_response(0, {TP: 0}) == set()
    assert core.replicas_on_offline_dirs == {0: {TP1}}
