"""tidelog's consumer in KIP-227 fetch sessions against a real broker: a full fetch opens the
session, incremental fetches list only what changed, and the two session errors are handled as
Kafka's Java consumer does (a new session after FETCH_SESSION_ID_NOT_FOUND, a full fetch closing
the old one after INVALID_FETCH_SESSION_EPOCH) without losing or repeating records."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from harness import ActingController, BrokerThread, produce
from waiting import poll_values

from tidelog.broker.fetch_session import FetchSession, next_epoch
from tidelog.client.cluster import KafkaClient
from tidelog.client.consumer import Consumer
from tidelog.client.metadata import TopicPartition
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records.builder import build_values

# (session id, epoch, partitions listed, partitions forgotten, top-level error, session id back)
Call = tuple[int, int, list[int], list[int], int, int]


def spy_fetches(client: KafkaClient) -> list[Call]:
    """Record each fetch the consumer sends and the session fields of its answer."""
    calls: list[Call] = []
    real: Callable[..., Awaitable[Any]] = client.fetch_from

    async def fetch_from(broker_id: int, partitions: Any, **kw: Any) -> Any:
        error, session_id, results = await real(broker_id, partitions, **kw)
        calls.append((kw.get("session_id", 0), kw.get("session_epoch", -1),
                      sorted(tp.partition for tp in partitions),
                      sorted(tp.partition for tp in kw.get("forgotten", ())), error, session_id))
        return error, session_id, results

    client.fetch_from = fetch_from  # type: ignore[method-assign]
    return calls


async def consumer_in_a_session(client: KafkaClient, topic: str
                                ) -> tuple[list[Call], Consumer, int]:
    """A consumer of ``topic``'s partition 0 after its first fetch, with the fetches spied on
    and the id of the session that fetch opened."""
    await client.refresh_metadata([topic])
    calls = spy_fetches(client)
    consumer = Consumer(client, fetch_max_wait_ms=50)
    consumer.assign([(TopicPartition(topic, 0), 0)])
    await consumer.poll(timeout_ms=100)
    session_id = calls[0][5]
    assert session_id != 0
    return calls, consumer, session_id


def consumer_session(broker: BrokerThread, session_id: int) -> FetchSession:
    session = broker.call(lambda: broker.server.apis.fetch_manager.cache.get(session_id))
    assert session is not None and session.replica_id == -1
    return session


def test_the_consumer_fetches_incrementally_in_a_session(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("cs-incr", {0: [1], 1: [1], 2: [1]})
    assert produce(one_broker.port, "cs-incr", 0, build_values([b"a", b"b"]), acks=1) == (0, 0)

    async def main() -> None:
        async with KafkaClient(one_broker.bootstrap) as client:
            await client.refresh_metadata(["cs-incr"])
            calls = spy_fetches(client)
            consumer = Consumer(client, fetch_max_wait_ms=50)
            consumer.assign([(TopicPartition("cs-incr", p), 0) for p in range(3)])
            assert await poll_values(consumer, 2) == [b"a", b"b"]
            # The first fetch is full (epoch 0, every partition) and opens a session.
            sid, epoch, listed, forgotten, error, got = calls[0]
            assert (sid, epoch, listed, forgotten, error) == (0, 0, [0, 1, 2], [], 0)
            assert got != 0 and consumer_session(one_broker, got).size == 3
            # Then partition 0, whose position moved, is the only one listed, at epoch 1.
            await consumer.poll(timeout_ms=100)
            assert calls[1] == (got, 1, [0], [], 0, got)
            # Nothing moves: the next fetches list nothing.
            await consumer.poll(timeout_ms=100)
            assert all(c[2] == [] and c[5] == got for c in calls[2:])
            # A partition no longer assigned is forgotten; the session holds the others.
            consumer.assign([(TopicPartition("cs-incr", p), 0 if p else 2) for p in range(2)])
            n = len(calls)
            await consumer.poll(timeout_ms=100)
            assert calls[n][3] == [2] and consumer_session(one_broker, got).size == 2
            await consumer.close()
            # close ends the session at the broker (epoch -1).
            assert one_broker.call(
                lambda: one_broker.server.apis.fetch_manager.cache.get(got)) is None

    asyncio.run(main())


def test_a_session_the_broker_lost_is_replaced_by_a_new_one(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("cs-lost", {0: [1]})

    async def main() -> None:
        async with KafkaClient(one_broker.bootstrap) as client:
            calls, consumer, first = await consumer_in_a_session(client, "cs-lost")
            one_broker.call(lambda: one_broker.server.apis.fetch_manager.cache.remove(first))
            assert await asyncio.to_thread(
                produce, one_broker.port, "cs-lost", 0, build_values([b"x"]), 1) == (0, 0)
            assert await poll_values(consumer, 1) == [b"x"]
            lost = next(i for i, c in enumerate(calls) if c[4])
            assert calls[lost][:2] == (first, calls[lost - 1][1] + 1)
            assert calls[lost][4] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
            # As Kafka's consumer: start over with a full fetch without a session id.
            sid, epoch, listed, _, error, second = calls[lost + 1]
            assert (sid, epoch, listed, error) == (0, 0, [0], 0) and second not in (0, first)
            assert await asyncio.to_thread(
                produce, one_broker.port, "cs-lost", 0, build_values([b"y"]), 1) == (0, 1)
            assert await poll_values(consumer, 1) == [b"y"]
            assert calls[-1][0] == second and calls[-1][1] >= 1
            await consumer.close()

    asyncio.run(main())


def test_a_wrong_session_epoch_makes_the_next_fetch_full_and_close_the_session(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("cs-epoch", {0: [1]})

    async def main() -> None:
        async with KafkaClient(one_broker.bootstrap) as client:
            calls, consumer, first = await consumer_in_a_session(client, "cs-epoch")
            session = consumer_session(one_broker, first)

            def skip_an_epoch() -> None:  # as if another fetch of this session went through
                session.epoch = next_epoch(session.epoch)

            one_broker.call(skip_an_epoch)
            assert await asyncio.to_thread(
                produce, one_broker.port, "cs-epoch", 0, build_values([b"x"]), 1) == (0, 0)
            assert await poll_values(consumer, 1) == [b"x"]
            bad = next(i for i, c in enumerate(calls) if c[4])
            assert calls[bad][4] == ErrorCode.INVALID_FETCH_SESSION_EPOCH
            # The next fetch is full (epoch 0) and names the session, which closes it.
            sid, epoch, listed, _, error, second = calls[bad + 1]
            assert (sid, epoch, listed, error) == (first, 0, [0], 0) and second != 0
            assert one_broker.call(
                lambda: one_broker.server.apis.fetch_manager.cache.get(first)) is None
            await consumer.close()

    asyncio.run(main())
