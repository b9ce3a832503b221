"""What a leader answers a fetch by its metadata cache and its replicas, as Kafka 3.9 does: a
consumer's fetch of a partition the cache lacks is UNKNOWN_TOPIC_OR_PARTITION even when the
partition is hosted here (its UpdateMetadata has not come yet); a follower's of a partition the
cluster has elsewhere is NOT_LEADER_OR_FOLLOWER (UNKNOWN_TOPIC_OR_PARTITION only when the cache
lacks it too). And Fetch v12+'s diverging epoch in a fetch session: a partition whose last
fetched epoch diverges is answered, with the epoch's end, even when nothing else changed."""

from __future__ import annotations

import uuid

import pytest
from harness import ActingController, BrokerThread, fetch, produce, send

from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import fetch as m_fetch
from tidelog.protocol.records.builder import build_values

pytestmark = pytest.mark.integration


def lead_without_update_metadata(controller: ActingController, topic: str,
                                 replicas: list[int], leader: int) -> None:
    """The controller's LeaderAndIsr for the topic's partition 0, and no UpdateMetadata yet."""
    controller.zk.create_topic(topic, {0: replicas}, {})
    controller.topic_ids[topic] = uuid.uuid4()
    controller.zk.create_partition_state(
        (topic, 0), LeaderIsrAndControllerEpoch(leader, 0, tuple(replicas), 1))
    controller.states[(topic, 0)] = {"leader": leader, "leader_epoch": 0, "isr": replicas,
                                     "zk_version": 0, "replicas": replicas}
    controller.send_leader_and_isr(topic, [0])


def test_a_hosted_partition_the_metadata_cache_lacks(
        one_broker: BrokerThread, controller: ActingController) -> None:
    lead_without_update_metadata(controller, "no-meta-yet", [1, 2], 1)
    port = one_broker.port
    assert fetch(port, "no-meta-yet", 0, 0).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # A follower's fetch is read (Kafka would answer it UNKNOWN_TOPIC_OR_PARTITION too: see
    # KafkaApis._partitions_to_read for why tidelog does not).
    assert fetch(port, "no-meta-yet", 0, 0, replica_id=2).error_code == ErrorCode.NONE
    controller.send_update_metadata()
    assert fetch(port, "no-meta-yet", 0, 0).error_code == ErrorCode.NONE


def test_a_follower_fetch_of_a_partition_hosted_elsewhere(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("led-elsewhere", {0: [2]}, live=[1])  # broker 1 hosts no replica
    port = one_broker.port
    assert fetch(port, "led-elsewhere", 0, 0, replica_id=3).error_code == \
        ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert fetch(port, "led-elsewhere", 0, 0).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert fetch(port, "no-such-topic", 0, 0, replica_id=3).error_code == \
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def _session_fetch(port: int, session_id: int, epoch: int, partitions: list[m_fetch.FetchPartition]
                   ) -> m_fetch.FetchResponse:
    return send(port, m_fetch.FetchRequest(
        max_wait_ms=0, min_bytes=0, session_id=session_id, session_epoch=epoch,
        topics=[m_fetch.FetchTopic("two-epochs", partitions=partitions)] if partitions else []),
        12)


def test_a_diverging_epoch_is_answered_in_a_fetch_session(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("two-epochs", {0: [1]})
    port = one_broker.port
    assert produce(port, "two-epochs", 0, build_values([b"a", b"b"])) == (0, 0)
    controller.change_leader("two-epochs", 0, 1, [1])  # epoch 1
    assert produce(port, "two-epochs", 0, build_values([b"c"])) == (0, 2)

    def at_the_end(last_fetched_epoch: int) -> m_fetch.FetchPartition:
        return m_fetch.FetchPartition(0, current_leader_epoch=1, fetch_offset=3,
                                      last_fetched_epoch=last_fetched_epoch,
                                      partition_max_bytes=1 << 20)

    full = _session_fetch(port, 0, 0, [at_the_end(1)])
    (p,) = full.responses[0].partitions
    assert full.session_id > 0 and p.diverging_epoch is None
    # Nothing changed but the last fetched epoch: the partition is answered, with where the
    # fetcher's epoch 0 ends here (offset 2) and no records.
    inc = _session_fetch(port, full.session_id, 1, [at_the_end(0)])
    (p,) = inc.responses[0].partitions
    assert (p.error_code, p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (0, 0, 2)
    assert not p.records and p.high_watermark == 3
    # The session keeps the epoch: answered again while it diverges.
    again = _session_fetch(port, full.session_id, 2, [])
    assert [(q.diverging_epoch.epoch, q.diverging_epoch.end_offset)
            for q in again.responses[0].partitions] == [(0, 2)]


def test_a_session_fetch_with_every_partition_unknown_to_the_cache_is_answered_at_once(
        one_broker: BrokerThread, controller: ActingController) -> None:
    """Kafka's handleFetchRequest answers at once when no partition is left to read (its
    "interesting" is empty): a consumer's session whose partitions the metadata cache all
    lacks is not held for max.wait.ms. The answer arriving at all is the barrier: held, it
    would come after an hour, well past the client's 15 s request timeout."""
    lead_without_update_metadata(controller, "no-meta-session", [1, 2], 1)
    port = one_broker.port

    def session_fetch(session_id: int, epoch: int, max_wait_ms: int,
                      partitions: list[m_fetch.FetchPartition]) -> m_fetch.FetchResponse:
        return send(port, m_fetch.FetchRequest(
            max_wait_ms=max_wait_ms, min_bytes=1, session_id=session_id, session_epoch=epoch,
            topics=[m_fetch.FetchTopic("no-meta-session", partitions=partitions)] if partitions
            else []), 12)

    full = session_fetch(0, 0, 0, [m_fetch.FetchPartition(0, fetch_offset=0,
                                                          partition_max_bytes=1 << 20)])
    (p,) = full.responses[0].partitions
    assert full.session_id > 0 and p.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    held = session_fetch(full.session_id, 1, 3_600_000, [])
    (p,) = held.responses[0].partitions
    assert held.error_code == 0 and p.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
