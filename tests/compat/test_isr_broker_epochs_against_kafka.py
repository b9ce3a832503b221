"""A follower's broker epoch and the ISR (KIP-903): a replica fetch naming a registration its
broker no longer has. The test plays broker 4 on both clusters: its registrations in
/brokers/ids (each a ZooKeeper session of its own: a new one is a new broker epoch, the czxid)
and its fetches (raw Fetch v15 with the ReplicaState Kafka's ReplicaFetcherThread sends)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka.admin import NewTopic
from differential import Pair, Target, address_of, outcome, raw, until

from tidelog.controller.zk_client import KafkaZkClient
from tidelog.controller.zk_data import BrokerEndPoint, BrokerInfo
from tidelog.protocol.messages import fetch as m_fetch
from tidelog.protocol.messages.metadata import MetadataRequest, MetadataRequestTopic

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAKE = 4  # a broker id no broker of the clusters has


@contextmanager
def registered(t: Target) -> Iterator[int]:
    """Broker 4 registered (its listener is nowhere: nothing answers the controller); yields
    its broker epoch, and goes when the block ends."""
    zk = KafkaZkClient(t.zookeeper, session_timeout_ms=6000).start()
    try:
        yield zk.register_broker(BrokerInfo(FAKE, (BrokerEndPoint("PLAINTEXT", "127.0.0.1", 1),)))
    finally:
        zk.close()


def _partitions(t: Target, topic: str) -> dict[int, tuple[int, tuple[int, ...]]]:
    """{partition: (leader, ISR)} as the Metadata shows them."""
    address = t.bootstrap.split(",")[0]
    r = raw(address, MetadataRequest(topics=[MetadataRequestTopic(name=topic)],
                                     allow_auto_topic_creation=False), 12)
    return {p.partition_index: (p.leader_id, tuple(sorted(p.isr_nodes)))
            for p in r.topics[0].partitions}


def _brokers(t: Target) -> set[int]:
    r = raw(t.bootstrap.split(",")[0], MetadataRequest(topics=[]), 12)
    return {b.node_id for b in r.brokers}


def _fetch_as_fake(address: str, topic_id: object, partition: int, broker_epoch: int) -> int:
    r = raw(address, m_fetch.FetchRequest(
        replica_state=m_fetch.ReplicaState(FAKE, broker_epoch), max_wait_ms=0, min_bytes=0,
        max_bytes=1 << 20, topics=[m_fetch.FetchTopic(topic_id=topic_id, partitions=[
            m_fetch.FetchPartition(partition=partition, fetch_offset=0,
                                   partition_max_bytes=1 << 20)])]), 15)
    return int(r.responses[0].partitions[0].error_code)


def test_a_fetch_from_a_follower_s_previous_registration_and_the_isr(pair: Pair) -> None:
    """Broker 4 leaves the ISR of `epochs-0` and `epochs-1` (replicas [1, 4]) when its first
    registration goes, and registers again. Its old process's fetch of partition 0 at the
    leader's end arrives: Kafka's ZooKeeper mode checks only that broker 4 is alive and adds it;
    tidelog, as KRaft does, refuses a fetch from a registration that is not the current one.
    The fetch of partition 1 with the current epoch is added on both, after the other (the
    leader proposes ISR changes in order), so its ISR is the barrier for partition 0's."""
    topic = "isr-broker-epochs"

    def scenario(t: Target) -> object:
        admin = t.admin()
        with registered(t) as old_epoch:
            fs = admin.create_topics([NewTopic(topic, 2, replica_assignment=[[1, FAKE], [1, FAKE]])],
                                     operation_timeout=30)
            assert outcome(fs[topic]) is None
            until(lambda: _partitions(t, topic) == {0: (1, (1, FAKE)), 1: (1, (1, FAKE))},
                   "the topic led by broker 1 with broker 4 in sync")
        # The first registration gone, broker 4 leaves the ISR.
        until(lambda: FAKE not in _brokers(t), "broker 4 gone")
        until(lambda: _partitions(t, topic) == {0: (1, (1,)), 1: (1, (1,))},
               "broker 4 out of the ISR")
        with registered(t) as new_epoch:
            assert new_epoch > old_epoch
            until(lambda: FAKE in _brokers(t), "broker 4 registered again")
            brokers = admin.list_topics(timeout=10).brokers
            leader = address_of(brokers, 1)
            r = raw(leader, MetadataRequest(topics=[MetadataRequestTopic(name=topic)],
                                            allow_auto_topic_creation=False), 12)
            topic_id = r.topics[0].topic_id
            errors = (_fetch_as_fake(leader, topic_id, 0, old_epoch),
                      _fetch_as_fake(leader, topic_id, 1, new_epoch))
            until(lambda: FAKE in _partitions(t, topic)[1][1], "partition 1's ISR expanded")
            seen = {"fetch errors": errors,
                    "partition 0 ISR": _partitions(t, topic)[0][1],
                    "partition 1 ISR": _partitions(t, topic)[1][1]}
        # The topic stays: deleting it would wait for broker 4's answer (Kafka's deletion of a
        # topic with a replica on a dead broker waits until that broker is back).
        return seen

    on_kafka, on_tidelog = pair.run(scenario)
    assert on_kafka == {"fetch errors": (0, 0), "partition 0 ISR": (1, FAKE),
                        "partition 1 ISR": (1, FAKE)}
    assert on_tidelog == {"fetch errors": (0, 0), "partition 0 ISR": (1,),
                          "partition 1 ISR": (1, FAKE)}
