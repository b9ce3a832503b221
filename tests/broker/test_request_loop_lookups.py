"""Per-request work on the replication path that is not needed: no event loop lookup per
request (Python 3.11's asyncio.get_running_loop makes a getpid system call each time), and no
future for a fetch that is answered at once."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
from harness import ActingController, BrokerThread, fetch_request, produce_request

from tidelog.client.connection import BrokerConnection
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import build_values
from tidelog.protocol.records.decoder import decode_records

pytestmark = pytest.mark.integration


def _spy_loop_lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of each asyncio.get_running_loop() call made through the asyncio module."""
    threads: list[int] = []
    lookup = asyncio.get_running_loop

    def spy() -> asyncio.AbstractEventLoop:
        threads.append(threading.get_ident())
        return lookup()

    monkeypatch.setattr(asyncio, "get_running_loop", spy)
    return threads


async def _produce_and_fetch(port: int, topic: str, rounds: int) -> list[bytes | None]:
    conn = BrokerConnection("127.0.0.1", port)
    await conn.connect()
    try:
        for i in range(rounds):
            produced = await conn.send(produce_request(topic, 0, build_values([b"v%d" % i])))
            assert produced.responses[0].partition_responses[0].error_code == ErrorCode.NONE
            fetched = await conn.send(fetch_request(topic, 0, i))
            assert fetched.responses[0].partitions[0].error_code == ErrorCode.NONE
        last = await conn.send(fetch_request(topic, 0, 0))
    finally:
        await conn.close()
    records = last.responses[0].partitions[0].records
    return [r.value for b in iter_batches(records) for r in decode_records(b)]


def test_produce_and_fetch_requests_look_up_no_event_loop(
        one_broker: BrokerThread, controller: ActingController,
        monkeypatch: pytest.MonkeyPatch) -> None:
    controller.create_topic("loop-lookups", {0: [1]})
    asyncio.run(_produce_and_fetch(one_broker.port, "loop-lookups", 1))  # caches filled
    broker_thread = one_broker.call(threading.get_ident)
    threads = _spy_loop_lookups(monkeypatch)
    values = asyncio.run(_produce_and_fetch(one_broker.port, "loop-lookups", 20))
    assert values == [b"v0"] + [b"v%d" % i for i in range(20)]
    # (the old code: one in the produce, one or two in each fetch)
    assert threads.count(broker_thread) == 0


def test_a_fetchers_requests_look_up_no_event_loop(
        one_broker: BrokerThread, controller: ActingController,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """BrokerConnection.request_future, the replica fetchers' way of sending, uses the loop
    its connection was made on."""
    controller.create_topic("fetcher-loop-lookups", {0: [1]})

    async def scenario() -> tuple[int, list[int]]:
        conn = BrokerConnection("127.0.0.1", one_broker.port)
        await conn.connect()
        threads = _spy_loop_lookups(monkeypatch)
        try:
            for _ in range(10):
                request = fetch_request("fetcher-loop-lookups", 0, 0)
                version = conn.pick_version(ApiKey.FETCH, 12)
                answer = await conn.request_future(request, version, 5000)
                assert answer.responses[0].partitions[0].error_code == ErrorCode.NONE
        finally:
            await conn.close()
        return threading.get_ident(), threads

    me, threads = asyncio.run(scenario())
    assert threads.count(me) == 0


def _spy_futures(loop: asyncio.AbstractEventLoop) -> tuple[list[str], Callable[[], None]]:
    """The function that asked ``loop`` for each future, and how to stop spying."""
    callers: list[str] = []
    create_future = loop.create_future

    def spy() -> asyncio.Future[Any]:
        callers.append(sys._getframe(1).f_code.co_name)
        return create_future()

    loop.create_future = spy  # type: ignore[method-assign]
    return callers, lambda: delattr(loop, "create_future")


def test_a_fetch_answered_at_once_makes_no_future_and_a_held_one_still_completes(
        one_broker: BrokerThread, controller: ActingController) -> None:
    controller.create_topic("fetch-futures", {0: [1]})

    async def scenario() -> list[bytes | None]:
        conn = BrokerConnection("127.0.0.1", one_broker.port)
        other = BrokerConnection("127.0.0.1", one_broker.port)
        await conn.connect()
        await other.connect()
        try:
            await conn.send(produce_request("fetch-futures", 0, build_values([b"first"])))
            for _ in range(10):  # data at the offset: answered at once
                got = await conn.send(fetch_request("fetch-futures", 0, 0, max_wait_ms=5000))
                assert got.responses[0].partitions[0].records
            assert "fetch_messages" not in callers
            # at the log end: held until a record comes
            held = asyncio.ensure_future(conn.send(
                fetch_request("fetch-futures", 0, 1, max_wait_ms=20000), timeout_ms=30000))
            while "fetch_messages" not in callers:  # the held fetch's future
                await asyncio.sleep(0.01)
            assert not held.done()
            await other.send(produce_request("fetch-futures", 0, build_values([b"second"])))
            answer = await asyncio.wait_for(held, 10)
        finally:
            await conn.close()
            await other.close()
        records = answer.responses[0].partitions[0].records
        return [r.value for b in iter_batches(records) for r in decode_records(b)]

    callers, stop = one_broker.call(lambda: _spy_futures(one_broker.loop))
    try:
        assert asyncio.run(asyncio.wait_for(scenario(), 30)) == [b"second"]
    finally:
        one_broker.call(stop)
