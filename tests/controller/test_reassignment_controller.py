"""Reassignment (KIP-455) by the real controller against a real ZooKeeper, with brokers played by
fake listeners (test_controller.py's boundary mock): the ZooKeeper writes and the controller
requests of every phase, cancellation, the legacy znode, a dead removed replica and a controller
failover mid-reassignment."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_controller import (
    Cluster,
    create_topic,
    lai_states,
    three_brokers,
    wait_for,
    with_cluster,
)

from tidelog.controller.admin import AdminError, AdminZkClient
from tidelog.controller.controller import KafkaController
from tidelog.controller.reassignment import REASSIGN_PARTITIONS_PATH, ApiError
from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch, topic_path
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import TopicPartition

pytestmark = pytest.mark.timeout(120)

TP = TopicPartition("moving", 0)


async def four_brokers(cluster: Cluster) -> KafkaController:
    ctl = await three_brokers(cluster)
    await cluster.start_broker(4)
    await wait_for(lambda: ctl.core is not None and 4 in ctl.core.live_brokers,
                   what="broker 4 live")
    await create_topic(cluster, TP.topic, {0: [1, 2, 3]})
    return ctl


def topic_znode(cluster: Cluster) -> dict:
    data, _ = cluster.admin_zk.kazoo.get(topic_path(TP.topic))
    return json.loads(data)


def received_replicas(cluster: Cluster, broker: int) -> list[list[int]]:
    return [list(lai_states(b)[TP].replicas) for b in cluster.brokers[broker].of(ApiKey.LEADER_AND_ISR)
            if TP in lai_states(b)]


def deletes(cluster: Cluster, broker: int) -> list[bool]:
    """The delete flag of each StopReplica of TP that `broker` received."""
    return [p.delete_partition for r in cluster.brokers[broker].of(ApiKey.STOP_REPLICA)
            for t in r.topic_states for p in t.partition_states
            if (t.topic_name, p.partition_index) == TP]


async def leader_adds_to_isr(cluster: Cluster, isr: tuple[int, ...]) -> None:
    """What the leader does once the new replicas caught up: ISR CAS + notification."""
    zk = cluster.admin_zk
    s = cluster.state(TP.topic, TP.partition)
    assert s is not None
    ok, _ = await asyncio.to_thread(
        zk.update_leader_and_isr, TP, LeaderIsrAndControllerEpoch(
            s.leader, s.leader_epoch, isr, s.controller_epoch), s.zk_version)
    assert ok
    await asyncio.to_thread(zk.propagate_isr_changes, [TP])


async def reassign(ctl: KafkaController, target: list[int] | None) -> ApiError:
    result = await ctl.reassignments.alter_partition_reassignments({TP: target})
    assert result is not None
    return result[TP]


@with_cluster
async def test_move_goes_through_the_full_replica_set_then_to_the_targets(cluster: Cluster) -> None:
    ctl = await four_brokers(cluster)
    assert await reassign(ctl, [2, 3, 4]) == ApiError(0)
    # phase A: RS = TRS + ORS in the topic znode with adding/removing; the new replica hears RS
    znode = topic_znode(cluster)
    assert znode["partitions"]["0"] == [2, 3, 4, 1]
    assert (znode["adding_replicas"], znode["removing_replicas"]) == ({"0": [4]}, {"0": [1]})
    await wait_for(lambda: [2, 3, 4, 1] in received_replicas(cluster, 4), what="RS to broker 4")
    s = cluster.state(TP.topic, 0)
    assert s is not None and (s.leader, s.leader_epoch) == (1, 1)
    listed = await ctl.reassignments.list_partition_reassignments(None)
    assert listed is not None and listed[TP].adding_replicas == (4,)
    await ctl.wait_idle()
    assert deletes(cluster, 1) == []  # nothing deleted before the successor is in the ISR
    # phase B once broker 4 is in the ISR
    await leader_adds_to_isr(cluster, (1, 2, 3, 4))
    await wait_for(lambda: deletes(cluster, 1) == [True], what="StopReplica(delete) to broker 1")
    s = cluster.state(TP.topic, 0)
    assert s is not None and (s.leader, tuple(s.isr)) == (2, (2, 3, 4))
    await wait_for(lambda: topic_znode(cluster)["partitions"]["0"] == [2, 3, 4], what="AR = TRS")
    assert topic_znode(cluster)["adding_replicas"] == {}
    assert await ctl.reassignments.list_partition_reassignments(None) == {}
    assert ctl.core is not None and ctl.core.assignments[TP] == (2, 3, 4)


@with_cluster
async def test_bad_requests_get_kafkas_errors_and_change_nothing(cluster: Cluster) -> None:
    ctl = await four_brokers(cluster)
    before = topic_znode(cluster)
    result = await ctl.reassignments.alter_partition_reassignments({
        TP: [2, 3, 9], TopicPartition("moving", 1): [1, 2],
        TopicPartition("nope", 0): [1, 2], TopicPartition("moving", 0): [1, 1]})
    assert result is not None
    assert result[TP].code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert result[TopicPartition("moving", 1)].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert result[TopicPartition("nope", 0)].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert (await reassign(ctl, [])).code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert (await reassign(ctl, None)).code == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
    assert topic_znode(cluster) == before
    assert await ctl.reassignments.list_partition_reassignments(None) == {}


@with_cluster
async def test_cancelling_reverts_and_deletes_the_added_replica(cluster: Cluster) -> None:
    ctl = await four_brokers(cluster)
    await reassign(ctl, [2, 3, 4])
    await wait_for(lambda: received_replicas(cluster, 4), what="broker 4 started")
    assert await reassign(ctl, None) == ApiError(0)
    await wait_for(lambda: deletes(cluster, 4) == [True], what="broker 4's replica deleted")
    znode = topic_znode(cluster)
    assert sorted(znode["partitions"]["0"]) == [1, 2, 3] and znode["adding_replicas"] == {}
    s = cluster.state(TP.topic, 0)
    assert s is not None and s.leader == 1 and 4 not in s.isr
    assert deletes(cluster, 1) == []


@with_cluster
async def test_cancelling_is_refused_when_the_adding_replicas_are_the_whole_isr(
        cluster: Cluster) -> None:
    """KRaft's rule (Kafka's ZooKeeper controller would delete the only in-sync copies)."""
    ctl = await four_brokers(cluster)
    await reassign(ctl, [4, 2])
    await wait_for(lambda: received_replicas(cluster, 4), what="broker 4 started")
    # Broker 4 caught up, 2 had fallen behind (the move goes on); then the original replicas
    # fell out of the ISR and the new one leads.
    zk, s = cluster.admin_zk, cluster.state(TP.topic, TP.partition)
    assert s is not None
    ok, _ = await asyncio.to_thread(zk.update_leader_and_isr, TP, LeaderIsrAndControllerEpoch(
        4, s.leader_epoch + 1, (4,), s.controller_epoch), s.zk_version)
    assert ok
    await asyncio.to_thread(zk.propagate_isr_changes, [TP])
    await wait_for(lambda: ctl.core is not None and tuple(ctl.core.partition_states[TP].isr) == (4,),
                   what="the controller read ISR [4]")
    before = topic_znode(cluster)
    refused = await reassign(ctl, None)
    assert refused.code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert refused.message == ("Unable to revert partition assignment for moving:0 because it "
                               "would require an unclean leader election.")
    await ctl.wait_idle()
    assert topic_znode(cluster) == before and deletes(cluster, 4) == []


@with_cluster
async def test_the_legacy_znode_starts_a_move_and_is_deleted_when_it_completes(
        cluster: Cluster) -> None:
    ctl = await four_brokers(cluster)
    await asyncio.to_thread(cluster.admin_zk.set_partition_reassignment, {TP: [2, 3, 4]})
    await wait_for(lambda: [2, 3, 4, 1] in received_replicas(cluster, 4), what="RS to broker 4")
    await leader_adds_to_isr(cluster, (1, 2, 3, 4))
    await wait_for(lambda: cluster.admin_zk.kazoo.exists(REASSIGN_PARTITIONS_PATH) is None,
                   what="znode deleted")
    assert deletes(cluster, 1) == [True]
    assert ctl.core is not None and ctl.core.assignments[TP] == (2, 3, 4)


@with_cluster
async def test_a_removed_replica_on_a_dead_broker_is_deleted_when_it_returns(
        cluster: Cluster) -> None:
    ctl = await four_brokers(cluster)
    await cluster.brokers[3].deregister()
    await wait_for(lambda: ctl.core is not None and 3 not in ctl.core.live_brokers,
                   what="broker 3 dead")
    assert await reassign(ctl, [1, 2, 4]) == ApiError(0)
    s = cluster.state(TP.topic, 0)
    assert s is not None and 3 not in s.isr
    await leader_adds_to_isr(cluster, (*s.isr, 4))
    await wait_for(lambda: topic_znode(cluster)["partitions"]["0"] == [1, 2, 4], what="done")
    await ctl.wait_idle()
    assert deletes(cluster, 3) == []
    await cluster.brokers[3].register()
    await wait_for(lambda: deletes(cluster, 3) == [True], what="deleted on return")


@with_cluster
async def test_a_new_controller_resumes_the_move_from_zookeeper(cluster: Cluster) -> None:
    ctl = await four_brokers(cluster)
    await reassign(ctl, [2, 3, 4])
    await wait_for(lambda: received_replicas(cluster, 4), what="broker 4 started")
    other = await cluster.start_controller(2)
    await cluster.stop_controller(1)
    await wait_for(lambda: other.reassignments.list(None), what="broker 2 resumed the move")
    assert other.reassignments.list(None)[TP].removing_replicas == (1,)
    await leader_adds_to_isr(cluster, (1, 2, 3, 4))
    await wait_for(lambda: deletes(cluster, 1) == [True], what="StopReplica(delete) to broker 1")
    s = cluster.state(TP.topic, 0)
    assert s is not None and (s.leader, tuple(s.isr)) == (2, (2, 3, 4))
    await wait_for(lambda: topic_znode(cluster)["partitions"]["0"] == [2, 3, 4], what="AR = TRS")


@with_cluster
async def test_adding_partitions_to_a_moving_topic_is_refused(cluster: Cluster) -> None:
    ctl = await four_brokers(cluster)
    await reassign(ctl, [2, 3, 4])
    before = topic_znode(cluster)
    with pytest.raises(AdminError) as e:
        await asyncio.to_thread(AdminZkClient(cluster.admin_zk).create_partitions, TP.topic, 2)
    assert e.value.error_code == ErrorCode.REASSIGNMENT_IN_PROGRESS
    assert topic_znode(cluster) == before  # the move's adding/removing replicas kept


@with_cluster
async def test_a_topic_queued_for_deletion_cannot_be_moved(cluster: Cluster) -> None:
    ctl = await four_brokers(cluster)
    await cluster.brokers[3].deregister()  # the deletion waits for this replica's broker
    await wait_for(lambda: ctl.core is not None and 3 not in ctl.core.live_brokers,
                   what="broker 3 dead")
    await asyncio.to_thread(AdminZkClient(cluster.admin_zk).delete_topic, TP.topic)
    await wait_for(lambda: TP.topic in ctl.topics_to_be_deleted, what="deletion queued")
    assert await reassign(ctl, [2, 4, 1]) == ApiError(
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.")
    assert await ctl.reassignments.list_partition_reassignments(None) == {}
