"""KIP-903 on the wire: a follower's Fetch (v15+) carries its broker epoch, the leader records
it, and a fetch from a registration the follower no longer has does not put it back in the ISR.

Broker 1 is a real broker leading `kip903-0` (replicas [1, 2], ISR [1]). The test plays
broker 2: its registration in /brokers/ids (a ZooKeeper session of its own, so a "restart" is a
new session with a new czxid, the broker epoch) and its fetches (raw Fetch requests with the
ReplicaState Kafka's ReplicaFetcherThread sends). The old process's fetch at the leader's LEO
is what must not count once broker 2 registered again: its log may be gone (KIP-903).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ActingController, BrokerThread, broker_props, produce, send, wait_until
from zk_chroot import new_chroot

from tidelog.cluster.zookeeper import ZooKeeperServer
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.controller.zk_data import BrokerEndPoint, BrokerInfo
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import fetch as m_fetch
from tidelog.protocol.messages import update_metadata as m_um
from tidelog.protocol.records.builder import build_values

pytestmark = pytest.mark.integration

TOPIC = "kip903"


class Setup:
    def __init__(self, zk: str, leader: BrokerThread) -> None:
        self.zk = zk
        self.leader = leader
        self.controller = ActingController(zk, [leader])
        self.follower_session: KafkaZkClient | None = None

    def register_follower(self) -> int:
        """Broker 2 (re)starts: a new ZooKeeper session registers it; returns its broker epoch."""
        if self.follower_session is not None:
            self.follower_session.close()  # the old registration goes with its session
        self.follower_session = KafkaZkClient(self.zk, session_timeout_ms=6000).start()
        return self.follower_session.register_broker(BrokerInfo(
            2, (BrokerEndPoint("PLAINTEXT", "127.0.0.1", 1),)))

    def update_metadata(self) -> None:
        """The controller's UpdateMetadata naming brokers 1 and 2 live (without their epochs:
        UpdateMetadata has none for other brokers)."""
        ctl, b = self.controller, self.leader
        live = [m_um.UpdateMetadataBroker(
            id=i, v0_host="127.0.0.1", v0_port=port,
            endpoints=[m_um.UpdateMetadataEndpoint(port, "127.0.0.1", "PLAINTEXT", 0)], rack=None)
            for i, port in ((1, b.port), (2, 1))]
        s = ctl.states[(TOPIC, 0)]
        resp = send(b.port, m_um.UpdateMetadataRequest(
            controller_id=ctl.controller_id, controller_epoch=ctl.controller_epoch,
            broker_epoch=b.server.broker_epoch, live_brokers=live,
            topic_states=[m_um.UpdateMetadataTopicState(TOPIC, ctl.topic_ids[TOPIC], [
                m_um.UpdateMetadataPartitionState(
                    topic_name=TOPIC, partition_index=0, controller_epoch=ctl.controller_epoch,
                    leader=1, leader_epoch=0, isr=list(s["isr"]), zk_version=s["zk_version"],
                    replicas=[1, 2], offline_replicas=[])])]))
        assert resp.error_code == 0

    def fetch_as_follower(self, broker_epoch: int, offset: int) -> m_fetch.PartitionData:
        """A replica fetch from broker 2 at ``offset``, as Kafka 3.9's ReplicaFetcherThread
        sends it (v15: topic id, ReplicaState)."""
        resp = send(self.leader.port, m_fetch.FetchRequest(
            replica_id=2, replica_state=m_fetch.ReplicaState(2, broker_epoch),
            max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
            topics=[m_fetch.FetchTopic(
                topic=TOPIC, topic_id=self.controller.topic_ids[TOPIC],
                partitions=[m_fetch.FetchPartition(
                    partition=0, current_leader_epoch=0, fetch_offset=offset,
                    partition_max_bytes=1 << 20)])]), 15)
        return resp.responses[0].partitions[0]

    def leader_isr(self) -> tuple[frozenset[int], frozenset[int] | None]:
        """The leader's (committed ISR, pending ISR)."""
        p = self.leader.partition(TOPIC, 0)
        return self.leader.call(lambda: (p.isr, p.pending_isr))

    def close(self) -> None:
        if self.follower_session is not None:
            self.follower_session.close()
        self.controller.close()


@pytest.fixture
def setup(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[Setup]:
    zk = new_chroot(zookeeper)
    leader = BrokerThread(broker_props(1, zk, tmp_path / "b1")).start()
    s = Setup(zk, leader)
    try:
        s.controller.create_topic(TOPIC, {0: [1, 2]}, live=[1], isr=[1])
        assert produce(leader.port, TOPIC, 0, build_values([b"a", b"b", b"c"]), acks=1) == (0, 0)
        yield s
    finally:
        s.close()
        leader.stop()


def test_a_fetch_from_a_follower_s_previous_registration_does_not_add_it_to_the_isr(
    setup: Setup,
) -> None:
    old_epoch = setup.register_follower()
    new_epoch = setup.register_follower()  # broker 2 restarted (and lost its log)
    assert new_epoch > old_epoch
    setup.update_metadata()
    # The old process's fetch, at the leader's LEO, arrives now: not caught up by this broker.
    assert setup.fetch_as_follower(old_epoch, 3).error_code == 0
    # The leader decides on the fetch itself: no ISR proposal, nothing pending.
    assert setup.leader_isr() == (frozenset({1}), None)
    assert setup.controller.read_state(TOPIC, 0).isr == (1,)
    # The new process catching up is added, with its epoch.
    assert setup.fetch_as_follower(new_epoch, 3).error_code == 0
    wait_until(lambda: setup.controller.read_state(TOPIC, 0).isr == (1, 2),
               what="broker 2 added to the ISR")


def test_the_isr_writer_refuses_a_member_whose_registration_changed(setup: Setup) -> None:
    """The leader's metadata still names broker 2's old registration (the controller's
    UpdateMetadata for its restart has not arrived): the leader proposes the expansion with
    the old epoch in its AlterPartition, and the controller, which knows broker 2's new
    registration, refuses it (INELIGIBLE_REPLICA, KIP-903)."""
    old_epoch = setup.register_follower()
    setup.update_metadata()
    setup.register_follower()  # restarted; no UpdateMetadata yet
    writer = setup.leader.server.replica_manager.alter_partition_manager
    assert setup.fetch_as_follower(old_epoch, 3).error_code == 0
    wait_until(lambda: setup.leader.call(
        lambda: writer.answered.get(ErrorCode.INELIGIBLE_REPLICA)) == 1,
        what="the ISR change refused")
    assert setup.leader_isr() == (frozenset({1}), None)
    assert setup.controller.read_state(TOPIC, 0).isr == (1,)
