"""Fetch, ListOffsets and OffsetForLeaderEpoch at the wire level, as Kafka answers them: leader
epoch fencing (KIP-320), both isolation levels, a follower asked as if it led; and
InitProducerId for an idempotent producer. The same batch (fixed timestamps) is written to both
clusters, so the fetched bytes must be equal too."""

from __future__ import annotations

import time

import pytest
from differential import (
    Pair,
    Target,
    address_of,
    create_ready,
    leader_address,
    partition_metadata,
    raw,
)

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import fetch as m_fetch
from tidelog.protocol.messages import list_offsets as m_lo
from tidelog.protocol.messages import offset_for_leader_epoch as m_ofle
from tidelog.protocol.messages import produce as m_produce
from tidelog.protocol.messages.init_producer_id import InitProducerIdRequest
from tidelog.protocol.records.builder import Record, build_batch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "epochs"
# A minute ago, fixed for the module: the same bytes go to both clusters, and retention
# (7 days from the newest timestamp) never deletes them mid-test, as it would a 1970 batch.
BASE_TIMESTAMP = int(time.time() * 1000) - 60_000
BATCH = bytes(build_batch([Record(b"a", b"k"), Record(b"b"), Record(b"c")],
                          base_timestamp=BASE_TIMESTAMP))


def _follower_address(t: Target, topic: str = TOPIC) -> str:
    p, brokers = partition_metadata(t, topic)
    return address_of(brokers, next(r for r in p.replicas if r != p.leader))


def _fetch(address: str, current_leader_epoch: int, isolation_level: int = 0,
           offset: int = 0, topic: str = TOPIC, version: int = 12, rack_id: str = "") -> object:
    request = m_fetch.FetchRequest(
        max_wait_ms=0, min_bytes=1, isolation_level=isolation_level, rack_id=rack_id,
        topics=[m_fetch.FetchTopic(topic, partitions=[m_fetch.FetchPartition(
            0, current_leader_epoch=current_leader_epoch, fetch_offset=offset,
            partition_max_bytes=1 << 20)])])
    p = raw(address, request, version).responses[0].partitions[0]
    return (ErrorCode(p.error_code).name, p.high_watermark, p.last_stable_offset,
            p.log_start_offset, bytes(p.records or b""))


def _replica_hw(address: str, topic: str) -> int:
    """The HW a replica itself holds: a Fetch with Kafka's debugging replica id (-2), which any
    replica answers."""
    request = m_fetch.FetchRequest(
        replica_id=-2, max_wait_ms=0, min_bytes=0, topics=[m_fetch.FetchTopic(
            topic, partitions=[m_fetch.FetchPartition(0, fetch_offset=0, partition_max_bytes=1)])])
    p = raw(address, request, 12).responses[0].partitions[0]
    return int(p.high_watermark) if p.error_code == 0 else -1


def _list_offsets(address: str, current_leader_epoch: int, isolation_level: int,
                  timestamp: int, topic: str = TOPIC) -> object:
    request = m_lo.ListOffsetsRequest(replica_id=-1, isolation_level=isolation_level, topics=[
        m_lo.ListOffsetsTopic(topic, [m_lo.ListOffsetsPartition(
            0, current_leader_epoch=current_leader_epoch, timestamp=timestamp)])])
    p = raw(address, request, 4).topics[0].partitions[0]
    return ErrorCode(p.error_code).name, p.offset, p.timestamp, p.leader_epoch


def _end_offset_for_epoch(address: str, current_leader_epoch: int, epoch: int,
                          topic: str = TOPIC) -> object:
    request = m_ofle.OffsetForLeaderEpochRequest(replica_id=-1, topics=[
        m_ofle.OffsetForLeaderTopic(topic, [m_ofle.OffsetForLeaderPartition(
            0, current_leader_epoch=current_leader_epoch, leader_epoch=epoch)])])
    p = raw(address, request, 3).topics[0].partitions[0]
    return ErrorCode(p.error_code).name, p.leader_epoch, p.end_offset


def _setup(t: Target, topic: str = TOPIC) -> str:
    create_ready(t, topic, 1, 3)
    leader = leader_address(t, topic)
    produce = m_produce.ProduceRequest(acks=-1, timeout_ms=10000, topic_data=[
        m_produce.TopicProduceData(topic, [m_produce.PartitionProduceData(0, BATCH)])])
    deadline = time.monotonic() + 30
    # The leader may learn of its new partition (LeaderAndIsr) after a client saw it in Metadata.
    while (answer := raw(leader, produce, 8).responses[0].partition_responses[0]).error_code in (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER):
        assert time.monotonic() < deadline, "the leader did not take the batch in time"
        time.sleep(0.2)
    assert (answer.error_code, answer.base_offset) == (0, 0)
    return leader


def test_fetch_list_offsets_and_epoch_end_offsets_with_each_leader_epoch(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        leader = _setup(t)
        follower = _follower_address(t)
        return {
            "fetch, no epoch": _fetch(leader, -1),
            "fetch, current epoch": _fetch(leader, 0),
            "fetch, read_committed": _fetch(leader, 0, isolation_level=1),
            "fetch, future epoch": _fetch(leader, 5),
            "fetch, past the end": _fetch(leader, 0, offset=10),
            "list latest": _list_offsets(leader, -1, 0, -1),
            "list latest, read_committed": _list_offsets(leader, 0, 1, -1),
            "list earliest": _list_offsets(leader, 0, 0, -2),
            "list, future epoch": _list_offsets(leader, 5, 0, -1),
            "list at a follower": _list_offsets(follower, 0, 0, -1),
            "end of epoch 0": _end_offset_for_epoch(leader, -1, 0),
            "end of epoch 3": _end_offset_for_epoch(leader, 0, 3),
            "end of epoch, future current epoch": _end_offset_for_epoch(leader, 5, 0),
        }

    got = pair.same(scenario)
    # The batch as written (from its magic byte on: the broker stamps its partition leader epoch).
    assert got["fetch, current epoch"][4][16:] == BATCH[16:]


def test_a_consumer_fetch_at_a_follower(pair: Pair) -> None:
    """KIP-392: from Fetch v11 (client metadata) a consumer may read from a follower, up to the
    follower's HW, even without a replica.selector.class (no preferred read replica is named);
    before v11 only the leader answers. A rack id changes nothing without a selector."""
    topic = "from-follower"

    def scenario(t: Target) -> object:
        leader = _setup(t, topic)
        follower = _follower_address(t, topic)
        deadline = time.monotonic() + 30
        while _replica_hw(follower, topic) < 3:  # the follower learns the HW on its next fetch
            assert time.monotonic() < deadline, "the follower's HW did not reach 3"
            time.sleep(0.1)
        return {
            "follower, v12": _fetch(follower, 0, topic=topic),
            "follower, v11": _fetch(follower, 0, topic=topic, version=11),
            "follower, v10": _fetch(follower, 0, topic=topic, version=10),
            "follower, read_committed": _fetch(follower, 0, isolation_level=1, topic=topic),
            "follower, from offset 1": _fetch(follower, -1, offset=1, topic=topic),
            "follower, past the end": _fetch(follower, 0, offset=10, topic=topic),
            "follower, future epoch": _fetch(follower, 5, topic=topic),
            "follower, rack id": _fetch(follower, 0, topic=topic, rack_id="rack-a"),
            "leader, rack id": _fetch(leader, 0, topic=topic, rack_id="rack-a"),
        }

    got = pair.same(scenario)
    assert got["follower, v12"][:2] == ("NONE", 3)
    assert got["follower, v12"][4][16:] == BATCH[16:]
    assert got["follower, v10"][0] == "NOT_LEADER_OR_FOLLOWER"


def test_init_producer_id_for_an_idempotent_producer(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        address = t.bootstrap.split(",")[0]
        deadline = time.monotonic() + 30
        while True:
            r = raw(address, InitProducerIdRequest(transactional_id=None,
                                                   transaction_timeout_ms=60000), 4)
            # Kafka's broker answers this (retriable) error until it holds a block of ids.
            if r.error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                break
            assert time.monotonic() < deadline, "no producer id in time"
            time.sleep(0.2)
        return ErrorCode(r.error_code).name, r.producer_id >= 0, r.producer_epoch

    assert pair.same(scenario) == ("NONE", True, 0)


def _stop_the_leader(t: Target, topic: str) -> int:
    """Stop the broker leading the topic's partition 0 (which holds the 3 records of `_setup`)
    once every replica knows HW 3, so that the new leader starts from it on both clusters
    (followers learn the HW in the fetch after the one that copied the batch). Returns its id."""
    part, brokers = partition_metadata(t, topic)
    deadline = time.monotonic() + 30
    for r in part.replicas:
        while _replica_hw(address_of(brokers, r), topic) != 3:
            assert time.monotonic() < deadline, f"replica {r} did not learn the HW in time"
            time.sleep(0.2)
    t.stop_broker(part.leader)
    return int(part.leader)


def _serving_new_leader(t: Target, topic: str, old_leader: int) -> str:
    """The new leader's address once it answers a fetch at epoch 1: right after the election a
    broker's Metadata may still name a stale leader, and Kafka's new leader may answer with a
    transient error (OFFSET_OUT_OF_RANGE was seen under load)."""
    deadline = time.monotonic() + 60
    while True:
        p, _ = partition_metadata(t, topic)
        leader = leader_address(t, topic)
        if p.leader != old_leader and _fetch(leader, 1, topic=topic)[0] == "NONE":
            return leader
        assert time.monotonic() < deadline, f"no serving new leader in time ({leader})"
        time.sleep(0.3)


def test_a_stale_leader_epoch_is_fenced_after_a_leader_change(pair: Pair) -> None:
    """The leader's broker shuts down: a new leader with epoch 1 fences requests naming epoch 0
    (FENCED_LEADER_EPOCH) and tells where epoch 0 ended."""
    def scenario(t: Target) -> object:
        _setup(t, "fenced")
        old_leader = _stop_the_leader(t, "fenced")
        try:
            leader = _serving_new_leader(t, "fenced", old_leader)
            seen = {
                "fetch, old epoch": _fetch(leader, 0, topic="fenced")[0],
                "fetch, new epoch": _fetch(leader, 1, topic="fenced")[:4],
                "list, old epoch": _list_offsets(leader, 0, 0, -1, topic="fenced"),
                "list, new epoch": _list_offsets(leader, 1, 0, -1, topic="fenced"),
                "end of epoch 0": _end_offset_for_epoch(leader, 1, 0, topic="fenced"),
                "end of epoch 1": _end_offset_for_epoch(leader, 1, 1, topic="fenced"),
                "epochs, old current": _end_offset_for_epoch(leader, 0, 0, topic="fenced"),
                # the debugging replica id's fetch is fenced too (localLogWithEpochOrThrow)
                "debugging fetch, old epoch": _replica_fetch(leader, -2, "fenced", 0),
                "debugging fetch, new epoch": _replica_fetch(leader, -2, "fenced", 1),
            }
        finally:
            t.start_broker(old_leader)
        return seen

    got = pair.same(scenario)
    assert got["fetch, old epoch"] == got["debugging fetch, old epoch"] == "FENCED_LEADER_EPOCH"


def _replica_fetch(address: str, replica_id: int, topic: str,
                   current_leader_epoch: int = -1) -> str:
    """A follower's Fetch v12 (replica_id >= 0; -2: Kafka's debugging id) of partition 0: the
    error's name."""
    request = m_fetch.FetchRequest(
        replica_id=replica_id, max_wait_ms=0, min_bytes=0, topics=[m_fetch.FetchTopic(
            topic, partitions=[m_fetch.FetchPartition(
                0, current_leader_epoch=current_leader_epoch, fetch_offset=0,
                partition_max_bytes=1 << 20)])])
    return ErrorCode(raw(address, request, 12).responses[0].partitions[0].error_code).name


def test_a_replica_fetch_of_a_partition_the_broker_does_not_host(pair: Pair) -> None:
    """Kafka answers a follower's fetch UNKNOWN_TOPIC_OR_PARTITION for a partition its metadata
    cache lacks, NOT_LEADER_OR_FOLLOWER for one the cluster has elsewhere, as it answers
    consumers; a fetch from a broker that is not a replica is refused at the leader."""
    topic = "hosted-elsewhere"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 1)
        part, brokers = partition_metadata(t, topic)
        other = next(b for b in sorted(brokers) if b != part.leader)
        elsewhere = address_of(brokers, other)
        # The other broker learns of the topic from its UpdateMetadata: until then it is
        # unknown there to consumers as to followers.
        deadline = time.monotonic() + 30
        while _fetch(elsewhere, -1, topic=topic)[0] != "NOT_LEADER_OR_FOLLOWER":
            assert time.monotonic() < deadline, "the other broker did not learn the topic"
            time.sleep(0.2)
        leader = address_of(brokers, part.leader)
        return {
            "follower fetch, not hosted": _replica_fetch(elsewhere, part.leader, topic),
            "follower fetch, no such topic": _replica_fetch(elsewhere, part.leader, "no-such"),
            "consumer fetch, not hosted": _fetch(elsewhere, -1, topic=topic)[0],
            "not a replica, no epoch": _replica_fetch(leader, other, topic),
            "not a replica, its epoch": _replica_fetch(leader, other, topic, 0),
        }

    got = pair.same(scenario)
    assert got["follower fetch, not hosted"] == "NOT_LEADER_OR_FOLLOWER"
    assert got["follower fetch, no such topic"] == "UNKNOWN_TOPIC_OR_PARTITION"


def _fetch_after(address: str, offset: int, last_fetched_epoch: int, topic: str,
                 current_leader_epoch: int = -1, isolation_level: int = 0,
                 version: int = 12) -> object:
    """A consumer's Fetch naming the epoch of the last record it read (KIP-320/595)."""
    request = m_fetch.FetchRequest(
        max_wait_ms=0, min_bytes=1, isolation_level=isolation_level,
        topics=[m_fetch.FetchTopic(topic, partitions=[m_fetch.FetchPartition(
            0, current_leader_epoch=current_leader_epoch, fetch_offset=offset,
            last_fetched_epoch=last_fetched_epoch, partition_max_bytes=1 << 20)])])
    p = raw(address, request, version).responses[0].partitions[0]
    d = p.diverging_epoch
    return (ErrorCode(p.error_code).name, p.high_watermark, p.log_start_offset,
            None if d is None else (d.epoch, d.end_offset), bytes(p.records or b""),
            p.aborted_transactions)


def test_a_diverging_last_fetched_epoch_is_answered_with_where_the_epoch_ends(
        pair: Pair) -> None:
    """Fetch v12+ (KIP-320/595): epoch 0 holds offsets 0-2, epoch 1 (the leader moved) 3-5.
    A fetch whose last fetched epoch ends before its fetch offset gets that epoch's end
    (diverging_epoch) and no records, at once; an epoch the leader cannot place is
    OFFSET_OUT_OF_RANGE; a shared history is read as usual; before v12 the field is not sent."""
    topic = "diverging"

    def scenario(t: Target) -> object:
        _setup(t, topic)
        old_leader = _stop_the_leader(t, topic)
        try:
            leader = _serving_new_leader(t, topic, old_leader)
            produce = m_produce.ProduceRequest(acks=-1, timeout_ms=10000, topic_data=[
                m_produce.TopicProduceData(topic, [m_produce.PartitionProduceData(0, BATCH)])])
            answer = raw(leader, produce, 8).responses[0].partition_responses[0]
            assert (answer.error_code, answer.base_offset) == (0, 3)
            seen = {
                "epoch 0 past its end": _fetch_after(leader, 5, 0, topic),
                "epoch 0, read_committed": _fetch_after(leader, 5, 0, topic,
                                                        isolation_level=1),
                "epoch 0 at its end": _fetch_after(leader, 3, 0, topic)[:4],
                "epoch 0 within it": _fetch_after(leader, 1, 0, topic)[:4],
                "epoch 1 at the end": _fetch_after(leader, 6, 1, topic, 1),
                "epoch 1 within it": _fetch_after(leader, 4, 1, topic, 1)[:4],
                "an epoch not yet": _fetch_after(leader, 6, 5, topic),
                "no epoch": _fetch_after(leader, 5, -1, topic)[:4],
                "epoch 0 past its end, v11": _fetch_after(leader, 5, 0, topic, version=11)[:4],
            }
        finally:
            t.start_broker(old_leader)
        return seen

    got = pair.same(scenario)
    assert got["epoch 0 past its end"][3] == (0, 3)
    assert got["epoch 0 past its end"][4] == b""
