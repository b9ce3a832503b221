"""The replica fetcher manager: Kafka's partition -> fetcher id hashing, the translation between
the core's fetcher requests and the wire, and real fetcher tasks between two brokers — several
fetchers per source broker, one failed partition not stopping the others, and reconnection
after the leader's process restarts."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import ActingController, BrokerThread, broker_props, produce, wait_until
from zk_chroot import new_chroot

from tidelog.broker.fetcher_manager import (
    BrokerLeaderEndPoint,
    SessionTopicIds,
    from_wire,
    to_wire,
)
from tidelog.broker.socket_server import RequestContext, SocketServer
from tidelog.cluster.zookeeper import ZooKeeperServer, pick_free_port
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.api_versions import api_versions_response
from tidelog.protocol.codec import decode_request, encode_request
from tidelog.protocol.messages import fetch as m_fetch
from tidelog.protocol.messages import list_offsets as m_lo
from tidelog.protocol.messages import offset_for_leader_epoch as m_ofle
from tidelog.protocol.primitives import ZERO_UUID
from tidelog.protocol.records.builder import build_values
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors
from tidelog.replication.fetcher import (
    FetchPartition,
    FetchRequest,
    ListOffsetsRequest,
    OffsetsForLeaderEpochRequest,
)
from tidelog.replication.types import TopicPartition
from tidelog.shell.fetcher_manager import fetcher_id_for, java_string_hash


def test_java_string_hash_matches_java() -> None:
    # Values of java.lang.String#hashCode.
    assert java_string_hash("") == 0
    assert java_string_hash("test") == 3556498
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -2147483648


def test_fetcher_id_is_kafkas() -> None:
    # Utils.abs(31 * hashCode + partition) % n; abs(MIN_VALUE) is 0 in Kafka's Utils.abs.
    assert fetcher_id_for(TopicPartition("test", 0), 3) == (31 * 3556498) % 3
    assert fetcher_id_for(TopicPartition("test", 5), 1) == 0
    ids = {fetcher_id_for(TopicPartition("t", p), 4) for p in range(16)}
    assert ids == {0, 1, 2, 3}


def _roundtrip(wire: object, version: int) -> object:
    frame = b"".join(bytes(b) for b in encode_request(wire, version, 1))
    return decode_request(memoryview(frame[4:]))[1]


def test_requests_translate_to_the_wire_and_back() -> None:
    a, b = TopicPartition("a", 0), TopicPartition("b", 3)
    fetch = FetchRequest(1, 2, 7, 99, 500, 1, 1 << 20, {a: FetchPartition(10, 4, 2, 4096),
                                                       b: FetchPartition(0, 1, 0, 100)})
    wire = _roundtrip(to_wire(fetch), 12)
    assert isinstance(wire, m_fetch.FetchRequest)
    assert (wire.replica_id, wire.max_wait_ms, wire.min_bytes, wire.max_bytes) == (7, 500, 1, 1 << 20)
    parts = {(t.topic, p.partition): (p.fetch_offset, p.current_leader_epoch, p.log_start_offset,
                                      p.partition_max_bytes)
             for t in wire.topics for p in t.partitions}
    assert parts == {("a", 0): (10, 4, 2, 4096), ("b", 3): (0, 1, 0, 100)}
    resp = m_fetch.FetchResponse(responses=[m_fetch.FetchableTopicResponse(topic="a", partitions=[
        m_fetch.PartitionData(partition_index=0, error_code=74, high_watermark=5, log_start_offset=1,
                              records=None)])])
    got = from_wire(fetch, resp)
    assert (got.error, got.session_id) == (Errors.NONE, 0)
    assert got.partitions[a].error == Errors.FENCED_LEADER_EPOCH
    assert got.partitions[a].high_watermark == 5 and got.partitions[a].records == b""
    refused = from_wire(fetch, m_fetch.FetchResponse(error_code=70))
    assert (refused.error, refused.partitions) == (Errors.FETCH_SESSION_ID_NOT_FOUND, {})
    # An incremental fetch lists only its changed partitions and forgets the dropped ones.
    incremental = FetchRequest(2, 2, 7, 99, 500, 1, 1 << 20, {a: FetchPartition(11, 4, 2, 4096)},
                               session_id=77, session_epoch=3,
                               to_send={a: FetchPartition(11, 4, 2, 4096)}, to_forget=(b,))
    wire = _roundtrip(to_wire(incremental), 12)
    assert (wire.session_id, wire.session_epoch) == (77, 3)
    assert [(t.topic, [p.fetch_offset for p in t.partitions]) for t in wire.topics] == [("a", [11])]
    assert [(t.topic, t.partitions) for t in wire.forgotten_topics_data] == [("b", [3])]


    ofle = OffsetsForLeaderEpochRequest(2, 2, 7, {a: (4, 3)})
    wire = _roundtrip(to_wire(ofle), 4)
    assert isinstance(wire, m_ofle.OffsetForLeaderEpochRequest) and wire.replica_id == 7
    p = wire.topics[0].partitions[0]
    assert (p.partition, p.current_leader_epoch, p.leader_epoch) == (0, 4, 3)
    got = from_wire(ofle, m_ofle.OffsetForLeaderEpochResponse(topics=[m_ofle.OffsetForLeaderTopicResult(
        "a", [m_ofle.EpochEndOffset(error_code=0, partition=0, leader_epoch=3, end_offset=42)])]))
    assert (got[a].error, got[a].leader_epoch, got[a].end_offset) == (Errors.NONE, 3, 42)

    lo = ListOffsetsRequest(3, 2, 7, {b: (1, -2)})
    wire = _roundtrip(to_wire(lo), 7)
    assert isinstance(wire, m_lo.ListOffsetsRequest) and wire.topics[0].partitions[0].timestamp == -2
    got = from_wire(lo, m_lo.ListOffsetsResponse(topics=[m_lo.ListOffsetsTopicResponse("b", [
        m_lo.ListOffsetsPartitionResponse(partition_index=3, offset=8, leader_epoch=1)])]))
    assert (got[b].offset, got[b].leader_epoch) == (8, 1)


def test_a_fetch_carries_the_last_fetched_epoch_and_its_answer_the_diverging_epoch() -> None:
    # Fetch v12+ (KIP-595): what truncation on fetch needs both ways.
    a, b = TopicPartition("a", 0), TopicPartition("a", 1)
    fetch = FetchRequest(1, 2, 7, 99, 500, 1, 1 << 20, {a: FetchPartition(10, 4, 2, 4096, 3),
                                                       b: FetchPartition(5, 4, 0, 4096)})
    wire = _roundtrip(to_wire(fetch), 12)
    assert {p.partition: p.last_fetched_epoch for t in wire.topics for p in t.partitions} == {
        0: 3, 1: -1}
    resp = m_fetch.FetchResponse(responses=[m_fetch.FetchableTopicResponse(topic="a", partitions=[
        m_fetch.PartitionData(partition_index=0, high_watermark=9, records=None,
                              diverging_epoch=m_fetch.EpochEndOffset(epoch=2, end_offset=8)),
        m_fetch.PartitionData(partition_index=1, high_watermark=9, records=None)])])
    got = from_wire(fetch, resp).partitions
    assert (got[a].diverging_epoch, got[b].diverging_epoch) == ((2, 8), None)


def test_an_error_code_the_core_does_not_know_reads_as_unknown_server_error() -> None:
    a = TopicPartition("a", 0)
    ofle = OffsetsForLeaderEpochRequest(2, 2, 7, {a: (4, 3)})
    got = from_wire(ofle, m_ofle.OffsetForLeaderEpochResponse(topics=[m_ofle.OffsetForLeaderTopicResult(
        "a", [m_ofle.EpochEndOffset(error_code=32000, partition=0)])]))
    assert got[a].error is Errors.UNKNOWN_SERVER_ERROR
    fetch = FetchRequest(1, 2, 7, 99, 500, 1, 1 << 20, {a: FetchPartition(10, 4, 2, 4096)})
    refused = from_wire(fetch, m_fetch.FetchResponse(error_code=-7))
    assert refused.error is Errors.UNKNOWN_SERVER_ERROR


def test_a_session_swaps_the_id_of_a_topic_created_again_and_forgets_under_the_held_id() -> None:
    """The leader keys a v13+ session by topic id (Kafka's FetchSessionHandler keeps each
    partition's id): a topic whose id changed under the same name is forgotten under the old id
    and listed under the new one, although its fetch state did not change; a partition leaving
    the session is forgotten under the id it was held under, even once the metadata dropped it."""
    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
    ids = {"a": uuid.uuid4(), "b": uuid.uuid4()}
    held = SessionTopicIds(lambda topic: ids.get(topic, ZERO_UUID))
    data = {a0: FetchPartition(5, 0, 0, 100), a1: FetchPartition(6, 0, 0, 100),
            b0: FetchPartition(7, 0, 0, 100)}

    def request(epoch: int, to_send: dict, to_forget: tuple = (), parts: dict = data) -> FetchRequest:
        return FetchRequest(epoch, 2, 7, 99, 500, 1, 1 << 20, parts, session_id=77,
                            session_epoch=epoch, to_send=to_send, to_forget=to_forget)

    def plan(r: FetchRequest) -> tuple[dict, dict]:
        topics = {tp.topic: ids.get(tp.topic, ZERO_UUID) for tp in r.partitions}
        sent, forgotten_id_of = held.plan(r, topics)
        wire = to_wire(sent, lambda t: ids.get(t, ZERO_UUID), forgotten_id_of)
        return ({(t.topic_id, p.partition) for t in wire.topics for p in t.partitions},
                {(t.topic_id, p) for t in wire.forgotten_topics_data for p in t.partitions})

    old_a = ids["a"]
    assert plan(request(0, data)) == ({(old_a, 0), (old_a, 1), (ids["b"], 0)}, set())
    assert plan(request(1, {})) == (set(), set())
    ids["a"] = uuid.uuid4()  # "a" deleted and created again; its fetch state is the same
    assert plan(request(2, {})) == ({(ids["a"], 0), (ids["a"], 1)}, {(old_a, 0), (old_a, 1)})
    assert plan(request(3, {})) == (set(), set())
    # "b" deleted: the metadata no longer has its id, the session still holds it.
    old_b = ids.pop("b")
    assert plan(request(4, {}, (b0,), {a0: data[a0], a1: data[a1]})) == (set(), {(old_b, 0)})
    assert "b" not in held.held


def test_an_endpoints_round_trips_on_an_open_connection_take_no_task_each() -> None:
    """The leader endpoint writes a fetch at once on its open connection and answers from the
    response future's callback (Kafka's fetcher thread goes straight from one response to the
    next request): one task to connect, none per round trip, where each round trip was a
    task. Every answer still reaches ``on_done``, translated, in a later turn."""
    async def leader(ctx: RequestContext, request: Any) -> Any:
        if ctx.header.request_api_key == ApiKey.API_VERSIONS:
            return api_versions_response()
        return m_fetch.FetchResponse(error_code=0, session_id=7, responses=[])

    async def scenario() -> tuple[list[Any], int]:
        server = SocketServer("127.0.0.1", pick_free_port(), leader)
        port = await server.start()
        loop = asyncio.get_running_loop()
        created = 0

        def count(lp: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            nonlocal created  # the endpoint's tasks (the server makes its own)
            created += coro.__qualname__.startswith("BrokerLeaderEndPoint")
            return asyncio.Task(coro, loop=lp, **kwargs)

        loop.set_task_factory(count)
        endpoint = BrokerLeaderEndPoint(2, 1, 0, ReplicationConfig(),
                                        lambda broker: ("127.0.0.1", port))
        answers: list[Any] = []
        try:
            tp = TopicPartition("t", 0)
            for epoch in range(5):
                got = loop.create_future()
                sent_in = len(answers)
                endpoint.send(
                    FetchRequest(epoch, 1, 2, 99, 500, 1, 1 << 20,
                                 {tp: FetchPartition(epoch, 0, 0, 100)}, session_id=0,
                                 session_epoch=-1),
                    lambda response, got=got: (answers.append(response), got.set_result(None)))
                assert len(answers) == sent_in  # never answered from inside send
                await asyncio.wait_for(got, 10)
        finally:
            loop.set_task_factory(None)
            endpoint.close()
            await server.shutdown()
        return answers, created

    answers, created = asyncio.run(scenario())
    assert [(a.error, a.session_id) for a in answers] == [(Errors.NONE, 7)] * 5
    assert created == 1


# ---------------------------------------------------------------- real fetcher tasks


@pytest.fixture
def two(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[tuple[str, Path, list[BrokerThread]]]:
    zk = new_chroot(zookeeper)
    extra = {"num.replica.fetchers": 2}
    brokers = [BrokerThread(broker_props(i, zk, tmp_path / f"b{i}", **extra)).start() for i in (1, 2)]
    try:
        yield zk, tmp_path, brokers
    finally:
        for b in brokers:
            b.stop()


@pytest.mark.integration
def test_fetchers_per_source_and_a_failed_partition_does_not_stop_the_others(
    two: tuple[str, Path, list[BrokerThread]]
) -> None:
    zk, _, (b1, b2) = two
    ctl = ActingController(zk, [b1, b2])
    try:
        ctl.create_topic("many", {p: [1, 2] for p in range(4)})
        fm = b2.server.replica_manager.fetcher_manager
        keys = wait_until(lambda: b2.call(lambda: sorted(fm.fetchers)), what="fetcher tasks")
        expected = sorted({(1, fetcher_id_for(TopicPartition("many", p), 2)) for p in range(4)})
        assert keys == expected
        for p in range(4):
            assert produce(b1.port, "many", p, build_values([b"a"]), acks=-1) == (0, 0)
        # Break partition 0's log on the follower: its appends fail, the others go on.
        b2.call(lambda: b2.server.log_manager.get_log("many", 0).close())
        for p in range(4):
            assert produce(b1.port, "many", p, build_values([b"b"]), acks=1) == (0, 1)
        for p in (1, 2, 3):
            wait_until(lambda p=p: b2.partition("many", p).log_end_offset == 2, what=f"many-{p} replicated")
        wait_until(lambda: TopicPartition("many", 0) in b2.call(lambda: fm.failed_partitions),
                   what="many-0 marked failed")
    finally:
        ctl.close()


@pytest.mark.integration
def test_follower_reconnects_after_the_leader_restarts(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    zk = new_chroot(zookeeper)
    port = pick_free_port()
    props1 = broker_props(1, zk, tmp_path / "b1", **{"listeners": f"PLAINTEXT://127.0.0.1:{port}"})
    b1 = BrokerThread(props1).start()
    b2 = BrokerThread(broker_props(2, zk, tmp_path / "b2")).start()
    ctl = ActingController(zk, [b1, b2])
    try:
        ctl.create_topic("re", {0: [1, 2]})
        assert produce(b1.port, "re", 0, build_values([b"1"]), acks=-1) == (0, 0)
        b1.stop()  # the follower's connection breaks; it backs off and retries
        b1 = BrokerThread(props1).start()
        assert b1.port == port
        ctl.brokers[1] = b1
        ctl.states[("re", 0)]["zk_version"] = ctl.read_state("re", 0).zk_version
        ctl.send_leader_and_isr("re", [0], live={1})
        # As Kafka's controller, to the restarted broker (onBrokerStartup): a leader answers a
        # follower's fetch only for partitions its metadata cache has.
        ctl.send_update_metadata()
        assert produce(b1.port, "re", 0, build_values([b"2"]), acks=1) == (0, 1)
        wait_until(lambda: b2.partition("re", 0).log_end_offset == 2, what="follower caught up")
        assert b2.call(lambda: sum(t.endpoint.connects for t in b2.server.replica_manager.fetcher_manager.fetchers.values())) >= 2
    finally:
        b1.stop()
        b2.stop()
        ctl.close()


@pytest.mark.integration
def test_an_idle_follower_sends_incremental_fetches_listing_only_changed_partitions(
    two: tuple[str, Path, list[BrokerThread]]
) -> None:
    from tidelog.protocol.api_keys import ApiKey

    zk, _, (b1, b2) = two
    ctl = ActingController(zk, [b1, b2])
    seen: list[tuple[int, int, list[int], list[int]]] = []

    def record_fetches() -> None:
        apis = b1.server.apis
        handle = apis.handlers[ApiKey.FETCH]

        async def recording(ctx, request):  # type: ignore[no-untyped-def]
            # A follower names itself in the ReplicaState from Fetch v15 on.
            state = request.replica_state
            if (state.replica_id if state is not None else request.replica_id) == 2:
                seen.append((request.session_id, request.session_epoch,
                             sorted(p.partition for t in request.topics for p in t.partitions),
                             sorted(p for t in request.forgotten_topics_data for p in t.partitions)))
            return await handle(ctx, request)

        apis.register_handler(ApiKey.FETCH, recording)

    try:
        b1.call(record_fetches)
        ctl.create_topic("inc", {p: [1, 2] for p in range(6)})
        fm = b2.server.replica_manager.fetcher_manager
        wait_until(lambda: len(b2.call(lambda: fm.fetchers)) == 2, what="two fetcher tasks")
        # Each fetcher opens a session with a full fetch, then goes on with empty incremental ones.
        wait_until(lambda: b2.call(lambda: sum(
            1 for t in fm.fetchers.values() if t.fetcher.session.session_id != 0)) == 2,
            what="both fetchers in a session")
        mark = len(b1.call(lambda: seen))
        wait_until(lambda: len(b1.call(lambda: seen)) >= mark + 2, what="incremental fetches")
        idle = b1.call(lambda: list(seen[mark:]))
        assert all(sid != 0 and epoch > 0 and parts == [] and forgot == []
                   for sid, epoch, parts, forgot in idle), idle
        assert produce(b1.port, "inc", 3, build_values([b"x"]), acks=-1) == (0, 0)
        mark = len(b1.call(lambda: seen))
        assert produce(b1.port, "inc", 3, build_values([b"y"]), acks=-1) == (0, 1)
        after = b1.call(lambda: list(seen[mark:]))
        # The follower lists partition 3 alone when its fetch offset moves; nothing else.
        assert any(parts == [3] for _, _, parts, _ in after), after
        assert all(parts in ([], [3]) and epoch > 0 for _, epoch, parts, _ in after), after
        wait_until(lambda: b2.partition("inc", 3).high_watermark == 2, what="follower HW")
    finally:
        ctl.close()
