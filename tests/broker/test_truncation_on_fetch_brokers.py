"""Log truncation after an unclean election between real brokers. The follower (KIP-595,
Kafka's replica fetcher since IBP 2.7): its log has a tail the new leader never had; it sends its
last fetched epoch, gets the leader's diverging epoch and truncates there — no
OffsetsForLeaderEpoch request reaches the leader. tidelog's consumer (KIP-320, as Kafka's Java
consumer): it read that tail; after the leader change it validates its position with
OffsetsForLeaderEpoch and goes back to the divergence point, or raises LogTruncationError with
auto.offset.reset=none."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import ActingController, BrokerThread, broker_props, produce, wait_until
from waiting import raising_polls
from zk_chroot import new_chroot

from tidelog.client.cluster import KafkaClient
from tidelog.client.consumer import Consumer, LogTruncationError
from tidelog.client.metadata import TopicPartition
from tidelog.cluster.zookeeper import ZooKeeperServer, pick_free_port
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.records.builder import build_values


def count_requests(b: BrokerThread, keys: tuple[ApiKey, ...]
                   ) -> dict[ApiKey, list[tuple[float, Any]]]:
    """Every request of these kinds broker b handles from now on (in its loop's order), with
    the monotonic time it arrived (the brokers are threads of the test's process)."""
    seen: dict[ApiKey, list[tuple[float, Any]]] = {k: [] for k in keys}

    def install() -> None:
        apis = b.server.apis
        for key in keys:
            handle = apis.handlers[key]

            async def recording(ctx: Any, request: Any, key: ApiKey = key,
                                handle: Any = handle) -> Any:
                seen[key].append((time.monotonic(), request))
                return await handle(ctx, request)

            apis.register_handler(key, recording)

    b.call(install)
    return seen


def batches(b: BrokerThread, topic: str) -> list[tuple[int, int, int]]:
    return b.call(lambda: [(x.base_offset, x.last_offset, x.partition_leader_epoch)
                           for x in b.server.log_manager.get_log(topic, 0).batches()])


class UncleanElection:
    """Brokers 1 and 2 on fixed ports, topic ``div`` (replicas 1, 2). ``write_tail``: offset 0
    on both, then broker 2 goes and broker 1 writes offsets 1-2 in epoch 0 alone (committed
    once the ISR shrinks to 1: a consumer reads them).
    ``elect_2``: broker 1 goes, broker 2 comes back and is elected uncleanly (epoch 1),
    writing n1-n3 from offset 1. ``restart_1``: broker 1 comes back as its follower."""

    def __init__(self, zk: str, tmp_path: Path) -> None:
        self.props = {i: broker_props(i, zk, tmp_path / f"b{i}", **{
            "listeners": f"PLAINTEXT://127.0.0.1:{pick_free_port()}",
            "replica.lag.time.max.ms": 1000}) for i in (1, 2)}
        self.b = {i: BrokerThread(self.props[i]).start() for i in (1, 2)}
        self.ctl = ActingController(zk, list(self.b.values()))
        self.bootstrap = ",".join(b.bootstrap for b in self.b.values())

    def write_tail(self) -> None:
        self.ctl.create_topic("div", {0: [1, 2]})
        assert produce(self.b[1].port, "div", 0, build_values([b"both"]), acks=-1) == (0, 0)
        self.b[2].stop()
        assert produce(self.b[1].port, "div", 0, build_values([b"lost1", b"lost2"]),
                       acks=1) == (0, 1)
        wait_until(lambda: self.b[1].partition("div", 0).high_watermark == 3,
                   what="the ISR shrunk to broker 1 and its HW at 3")

    def elect_2(self) -> None:
        self.b[1].stop()
        self.b[2] = BrokerThread(self.props[2]).start()
        self.ctl.brokers = {2: self.b[2]}
        self.ctl.change_leader("div", 0, 2, [2])
        assert produce(self.b[2].port, "div", 0, build_values([b"n1", b"n2", b"n3"]),
                       acks=1) == (0, 1)

    def restart_1(self) -> None:
        self.b[1] = BrokerThread(self.props[1]).start()
        self.ctl.brokers = dict(self.b)
        self.ctl.send_leader_and_isr("div", [0])
        self.ctl.send_update_metadata()

    def close(self) -> None:
        self.ctl.close()
        for b in self.b.values():
            b.stop()


@pytest.fixture
def unclean(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[UncleanElection]:
    c = UncleanElection(new_chroot(zookeeper), tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.mark.integration
def test_after_an_unclean_election_the_old_leader_truncates_on_the_fetch_answer(
    unclean: UncleanElection
) -> None:
    unclean.write_tail()
    unclean.elect_2()
    b2 = unclean.b[2]
    seen = count_requests(b2, (ApiKey.OFFSET_FOR_LEADER_EPOCH, ApiKey.FETCH))
    unclean.restart_1()  # broker 1 comes back with its epoch-0 tail (offsets 1-2)
    b1 = unclean.b[1]
    wait_until(lambda: batches(b1, "div") == batches(b2, "div"), what="logs converge")
    assert batches(b1, "div") == [(0, 0, 0), (1, 3, 1)]
    fetched = b2.call(lambda: [(p.fetch_offset, p.last_fetched_epoch)
                               for _, r in seen[ApiKey.FETCH] for t in r.topics
                               for p in t.partitions])
    # Its first fetch: from its LEO (3) with its last epoch (0), answered (epoch 0, end 1).
    assert fetched[0] == (3, 0) and (1, 0) in fetched, fetched
    assert b2.call(lambda: len(seen[ApiKey.OFFSET_FOR_LEADER_EPOCH])) == 0


async def read_values(consumer: Consumer, count: int, polls: int = 50) -> list[bytes]:
    values: list[bytes] = []
    for _ in range(polls):
        if len(values) >= count:
            break
        values += [r.value or b"" for r in await consumer.poll(timeout_ms=200)]
    return values


DIV = TopicPartition("div", 0)


async def consumer_past_the_lost_tail(client: KafkaClient, auto_offset_reset: str) -> Consumer:
    """A consumer of div-0 that read offsets 0-2 (epoch 0: both, lost1, lost2) at broker 1."""
    await client.refresh_metadata(["div"])
    consumer = Consumer(client, auto_offset_reset=auto_offset_reset, fetch_max_wait_ms=50)
    consumer.assign([(DIV, 0)])
    assert await read_values(consumer, 3) == [b"both", b"lost1", b"lost2"]
    assert consumer.position(DIV) == 3
    return consumer


@pytest.mark.integration
@pytest.mark.parametrize("auto_offset_reset", ["earliest", "none"])
def test_a_consumer_that_read_the_lost_tail_validates_its_position_after_the_election(
    unclean: UncleanElection, auto_offset_reset: str
) -> None:
    unclean.write_tail()

    async def main() -> None:
        async with KafkaClient(unclean.bootstrap, retry_backoff_ms=50) as client:
            consumer = await consumer_past_the_lost_tail(client, auto_offset_reset)
            await asyncio.to_thread(unclean.elect_2)
            if auto_offset_reset == "none":
                with pytest.raises(LogTruncationError) as e:
                    await read_values(consumer, 3)
                # the first offset known to diverge and its epoch (Kafka's OffsetAndMetadata)
                assert (e.value.offset, e.value.divergent_offset) == (3, (1, 0))
            else:
                # Back to offset 1, where the logs part: n1-n3, none skipped.
                assert await read_values(consumer, 3) == [b"n1", b"n2", b"n3"]

    asyncio.run(main())


@pytest.mark.integration
def test_a_detected_truncation_is_not_fetched_from_until_the_position_is_sought(
    unclean: UncleanElection
) -> None:
    """As the Java consumer: a LogTruncationException leaves the partition awaiting
    validation (SubscriptionState.maybeCompleteValidation does not complete it), so it is not
    fetched from the unvalidated position until the application seeks; it is validated (and
    raised) again only once request.timeout.ms has passed since the validation was sent.
    Checked by counts and a lower bound, so a slow machine cannot fail it: each raise has its
    own OffsetsForLeaderEpoch, the second arrives at the leader no sooner than the timeout
    after the poll that raised the first began, and no fetch at offset 3 reaches the leader."""
    unclean.write_tail()
    timeout_s = 1.5

    async def main() -> None:
        async with KafkaClient(unclean.bootstrap, retry_backoff_ms=50,
                               request_timeout_ms=int(timeout_s * 1000)) as client:
            consumer = await consumer_past_the_lost_tail(client, "none")
            await asyncio.to_thread(unclean.elect_2)
            seen = await asyncio.to_thread(count_requests, unclean.b[2],
                                           (ApiKey.OFFSET_FOR_LEADER_EPOCH, ApiKey.FETCH))
            validations = seen[ApiKey.OFFSET_FOR_LEADER_EPOCH]
            # (the raising poll's start, validations); 100 polls: at least 20 s, past the timeout
            raised_at = await raising_polls(consumer, LogTruncationError, 2, 100, 200,
                                            lambda: len(validations))
            assert [n for _, n in raised_at] == [1, 2]
            assert validations[1][0] >= raised_at[0][0] + timeout_s
            assert [p.fetch_offset for _, r in seen[ApiKey.FETCH] for t in r.topics
                    for p in t.partitions if t.topic == "div"] == []
            consumer.seek(DIV, 1)
            assert await read_values(consumer, 3) == [b"n1", b"n2", b"n3"]

    asyncio.run(main())


@pytest.mark.integration
def test_a_validation_fenced_by_a_newer_leader_epoch_is_retried_at_a_later_poll(
    unclean: UncleanElection
) -> None:
    """The leader has an epoch the consumer's metadata does not show yet: its
    OffsetsForLeaderEpoch is FENCED_LEADER_EPOCH. As the Java consumer (validatePositionsAsync:
    the partitions to retry get a metadata update and a back-off), one request per validation,
    one validation per back-off, and the next carries the epoch of the new metadata.
    Before, the client's retry loop held poll(timeout_ms=200) 4.4 s, every attempt (one per
    back-off) with the epoch it started with (still fenced after the metadata moved on)."""
    unclean.write_tail()
    ctl = unclean.ctl

    def elect_2_then_epoch_2_unannounced() -> None:
        unclean.elect_2()
        # epoch 2 at the leader, its metadata cache still at epoch 1 (no UpdateMetadata)
        current = ctl.zk.get_partition_state(("div", 0))
        assert current is not None and current.leader_epoch == 1
        ok, version = ctl.zk.update_leader_and_isr(
            ("div", 0), dataclasses.replace(current, leader_epoch=2), current.zk_version)
        assert ok
        ctl.states[("div", 0)].update(leader_epoch=2, zk_version=version)
        ctl.send_leader_and_isr("div", [0])

    async def main() -> None:
        async with KafkaClient(unclean.bootstrap, retry_backoff_ms=50) as client:
            consumer = await consumer_past_the_lost_tail(client, "earliest")
            await asyncio.to_thread(elect_2_then_epoch_2_unannounced)
            seen = await asyncio.to_thread(count_requests, unclean.b[2],
                                           (ApiKey.OFFSET_FOR_LEADER_EPOCH,))
            validations = seen[ApiKey.OFFSET_FOR_LEADER_EPOCH]
            for polls in range(1, 4):  # broker 1 gone, then fenced: the metadata shows epoch 1
                assert [r.value for r in await consumer.poll(timeout_ms=200)] == []
                # one validation per retry.backoff.ms at most: 200 / 50 + 1 per poll (the old
                # retry loop sent its 9 attempts within each poll, past its timeout)
                assert len(validations) <= 5 * polls, len(validations)
            await asyncio.to_thread(ctl.send_update_metadata)
            assert await read_values(consumer, 3, polls=3) == [b"n1", b"n2", b"n3"]

    asyncio.run(main())
