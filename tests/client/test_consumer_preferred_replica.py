"""The consumer's side of KIP-392, as Kafka's Java consumer: ``client_rack`` on every Fetch, the
preferred read replica a leader names followed until ``metadata.max.age.ms`` passes, a fetch
from it fails with an error that asks for new metadata, or the metadata names a new leader
epoch, then the leader again; UNKNOWN_LEADER_EPOCH and UNKNOWN_SERVER_ERROR keep it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from kafka_peer import CLOSE, ScriptedBroker, metadata_answer
from waiting import poll_values

from tidelog.client.cluster import KafkaClient
from tidelog.client.consumer import Consumer
from tidelog.client.metadata import TopicPartition
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages.fetch import FetchableTopicResponse, FetchResponse, PartitionData
from tidelog.protocol.records import Record, build_batch

TP = TopicPartition("t", 0)
LEADER, FOLLOWER = 0, 1


class NearbyScript:
    """Node 0 leads ("t", 0) in ``leader_epoch`` with offsets [0, leader_end); node 1 follows
    with [0, follower_end). The leader names node 1 to a consumer in rack "r1" (then answering
    no records) ``names`` times; ``follower_down`` makes node 1 drop its connections; node 1
    answers its next fetches with the codes in ``follower_errors``."""

    def __init__(self, leader_end: int, follower_end: int, names: int = 100) -> None:
        self.ends = {LEADER: leader_end, FOLLOWER: follower_end}
        self.names = names
        self.follower_down = False
        self.follower_errors: list[int] = []
        self.leader_epoch = 0
        self.nodes = {n: ScriptedBroker(self.handler(n)) for n in (LEADER, FOLLOWER)}

    def fetches(self, node: int) -> list[tuple[int, str]]:
        """(fetch offset, rack id) of each Fetch ``node`` received for TP."""
        return [(p.fetch_offset, r.rack_id) for _, r in self.nodes[node].received(ApiKey.FETCH)
                for t in r.topics for p in t.partitions]

    def handler(self, node: int) -> Any:
        def answer(header: Any, request: Any) -> Any:
            key = header.request_api_key
            if key == ApiKey.METADATA:
                return metadata_answer({n: b.port for n, b in self.nodes.items()},
                                       {("t", 0): LEADER}, leader_epoch=self.leader_epoch)
            if key != ApiKey.FETCH:
                return None
            if node == FOLLOWER and self.follower_down:
                return CLOSE
            if not request.topics:
                return FetchResponse(responses=[])
            offset = request.topics[0].partitions[0].fetch_offset
            end = self.ends[node]
            preferred, records = -1, None
            if node == FOLLOWER and self.follower_errors:
                code = self.follower_errors.pop(0)
            elif not 0 <= offset <= end:
                code = ErrorCode.OFFSET_OUT_OF_RANGE
            else:
                code = ErrorCode.NONE
                if node == LEADER and request.rack_id == "r1" and self.names > 0:
                    self.names -= 1
                    preferred = FOLLOWER
                elif offset < end:
                    records = build_batch([Record(b"n%d-%d" % (node, o))
                                           for o in range(offset, end)], base_offset=offset)
            return FetchResponse(responses=[FetchableTopicResponse("t", partitions=[
                PartitionData(0, code, high_watermark=end, records=records,
                              preferred_read_replica=preferred)])])

        return answer


def run(script: NearbyScript, body: Any, **client: Any) -> None:
    async def main() -> None:
        async with script.nodes[LEADER], script.nodes[FOLLOWER], \
                KafkaClient(script.nodes[LEADER].address, retry_backoff_ms=5, **client) as kafka:
            await body(kafka)

    asyncio.run(main())


def test_a_consumer_in_the_followers_rack_reads_from_the_follower() -> None:
    script = NearbyScript(leader_end=3, follower_end=3)

    async def body(kafka: KafkaClient) -> None:
        consumer = Consumer(kafka, client_rack="r1")
        consumer.assign([(TP, 0)])
        assert await poll_values(consumer, 3) == [b"n1-0", b"n1-1", b"n1-2"]
        assert script.fetches(LEADER) == [(0, "r1")]  # named the follower, no records
        assert script.fetches(FOLLOWER)[0] == (0, "r1")

    run(script, body)


def test_a_consumer_without_a_rack_stays_on_the_leader() -> None:
    script = NearbyScript(leader_end=3, follower_end=3)

    async def body(kafka: KafkaClient) -> None:
        consumer = Consumer(kafka)
        consumer.assign([(TP, 0)])
        assert await poll_values(consumer, 3) == [b"n0-0", b"n0-1", b"n0-2"]
        assert script.fetches(LEADER)[0] == (0, "") and script.fetches(FOLLOWER) == []

    run(script, body)


def test_out_of_range_at_the_follower_goes_back_to_the_leader_without_a_reset() -> None:
    # The follower has offsets 0-1 only: at 3 it answers OFFSET_OUT_OF_RANGE, which from a
    # preferred replica means "ask the leader", not "reset the position".
    script = NearbyScript(leader_end=5, follower_end=2, names=1)

    async def body(kafka: KafkaClient) -> None:
        consumer = Consumer(kafka, client_rack="r1", auto_offset_reset="none")
        consumer.assign([(TP, 3)])
        assert await poll_values(consumer, 2) == [b"n0-3", b"n0-4"]
        assert script.fetches(FOLLOWER) == [(3, "r1")]
        assert script.fetches(LEADER)[:2] == [(3, "r1"), (3, "r1")]
        assert script.nodes[LEADER].received(ApiKey.LIST_OFFSETS) == []

    run(script, body)


def test_a_lost_follower_sends_the_consumer_back_to_the_leader() -> None:
    # The leader names the follower three times; each fetch from it finds the connection
    # closed, and the next goes to the leader, which serves the fourth.
    script = NearbyScript(leader_end=3, follower_end=3, names=3)
    script.follower_down = True

    async def body(kafka: KafkaClient) -> None:
        consumer = Consumer(kafka, client_rack="r1")
        consumer.assign([(TP, 0)])
        assert await poll_values(consumer, 3) == [b"n0-0", b"n0-1", b"n0-2"]
        assert script.fetches(FOLLOWER) == [(0, "r1")] * 3
        assert script.fetches(LEADER)[:4] == [(0, "r1")] * 4

    run(script, body)


def test_the_preferred_replica_expires_with_the_metadata() -> None:
    script = NearbyScript(leader_end=3, follower_end=3)

    async def body(kafka: KafkaClient) -> None:
        consumer = Consumer(kafka, client_rack="r1", fetch_max_wait_ms=20)
        consumer.assign([(TP, 0)])
        assert await poll_values(consumer, 3) == [b"n1-0", b"n1-1", b"n1-2"]
        named_at = time.monotonic()
        # Caught up at the follower: fetches go there until metadata.max.age.ms (300 ms)
        # has passed since the leader named it; then to the leader, which names it again.
        deadline = named_at + 10
        while len(script.fetches(LEADER)) < 2 and time.monotonic() < deadline:
            await consumer.poll(timeout_ms=50)
        assert len(script.fetches(LEADER)) == 2
        assert time.monotonic() - named_at >= 0.3
        assert script.fetches(LEADER)[1] == (3, "r1")

    run(script, body, metadata_max_age_ms=300)


@pytest.mark.parametrize("error", [ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.UNKNOWN_SERVER_ERROR])
def test_errors_the_java_consumer_only_logs_keep_the_follower(error: ErrorCode) -> None:
    # FetchCollector.handleInitializeErrors only logs these: the next fetch goes to the same
    # follower, with no new metadata (and UNKNOWN_SERVER_ERROR is not raised).
    script = NearbyScript(leader_end=3, follower_end=3)
    script.follower_errors = [error, error]

    async def body(kafka: KafkaClient) -> None:
        def metadata_requests() -> int:
            return sum(len(n.received(ApiKey.METADATA)) for n in script.nodes.values())

        await kafka.refresh_metadata(["t"])
        metadata_before = metadata_requests()
        consumer = Consumer(kafka, client_rack="r1")
        consumer.assign([(TP, 0)])
        assert await poll_values(consumer, 3) == [b"n1-0", b"n1-1", b"n1-2"]
        assert script.fetches(LEADER) == [(0, "r1")]
        assert script.fetches(FOLLOWER)[:3] == [(0, "r1")] * 3
        assert metadata_requests() == metadata_before

    run(script, body)


@pytest.mark.parametrize("error", [ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.OFFSET_NOT_AVAILABLE,
                                   ErrorCode.REPLICA_NOT_AVAILABLE])
def test_errors_that_ask_for_new_metadata_send_the_consumer_back_to_the_leader(
        error: ErrorCode) -> None:
    # Kafka's requestMetadataUpdate: new metadata, and the preferred read replica cleared.
    script = NearbyScript(leader_end=3, follower_end=3, names=1)
    script.follower_errors = [error]

    async def body(kafka: KafkaClient) -> None:
        consumer = Consumer(kafka, client_rack="r1")
        consumer.assign([(TP, 0)])
        assert await poll_values(consumer, 3) == [b"n0-0", b"n0-1", b"n0-2"]
        assert script.fetches(FOLLOWER) == [(0, "r1")]
        assert script.fetches(LEADER)[:2] == [(0, "r1")] * 2

    run(script, body)


def test_a_new_leader_epoch_in_the_metadata_drops_the_follower() -> None:
    # Kafka's maybeValidatePosition clears the preferred read replica when the metadata's
    # leader or epoch changes: the next fetch asks the leader, which may name it again.
    script = NearbyScript(leader_end=3, follower_end=3, names=1)

    async def body(kafka: KafkaClient) -> None:
        consumer = Consumer(kafka, client_rack="r1", fetch_max_wait_ms=20)
        consumer.assign([(TP, 0)])
        assert await poll_values(consumer, 3) == [b"n1-0", b"n1-1", b"n1-2"]
        assert script.fetches(LEADER) == [(0, "r1")]
        script.leader_epoch = 1
        await kafka.refresh_metadata(["t"])
        await consumer.poll(timeout_ms=50)
        assert script.fetches(LEADER)[1:] and script.fetches(LEADER)[1] == (3, "r1")

    run(script, body)
