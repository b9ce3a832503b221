"""OffsetCommit and OffsetFetch at the group coordinator, as Kafka answers them: commits of a
group without members (generation -1, as admin tools and assign()-only consumers send), each
per-partition error, commits naming a generation of a group that does not exist, and a member's
commits through a rebalance."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from differential import Pair, Target, coordinator, create_ready, raw

from tidelog.client.connection import BrokerConnection
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import describe_groups as dg
from tidelog.protocol.messages import join_group as jg
from tidelog.protocol.messages import offset_commit as oc
from tidelog.protocol.messages import offset_fetch as of
from tidelog.protocol.messages import sync_group as sg

pytestmark = [pytest.mark.integration, pytest.mark.slow]


# A coordinator just elected, or still loading the group's partition, sends the client back to
# FindCoordinator: clients retry, so do the tests (bounded).
_RETRY = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
          ErrorCode.COORDINATOR_NOT_AVAILABLE}


def _at_coordinator(t: Target, group: str, request: object, version: int,
                    errors: Callable[[Any], list[int]]) -> Any:
    deadline = time.monotonic() + 30
    while True:
        r = raw(coordinator(t, group), request, version)
        if not _RETRY & set(errors(r)) or time.monotonic() >= deadline:
            return r
        time.sleep(0.3)


def commit(t: Target, group: str, offsets: dict[tuple[str, int], int], generation: int = -1,
           member: str = "") -> dict[tuple[str, int], str]:
    request = oc.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=generation, member_id=member,
        topics=[oc.OffsetCommitRequestTopic(topic, [oc.OffsetCommitRequestPartition(p, o)])
                for (topic, p), o in offsets.items()])
    r = _at_coordinator(t, group, request, 8, lambda r: [p.error_code for tp in r.topics
                                                         for p in tp.partitions])
    return {(tp.name, p.partition_index): ErrorCode(p.error_code).name
            for tp in r.topics for p in tp.partitions}


def fetch(t: Target, group: str, partitions: list[tuple[str, int]]) -> object:
    request = of.OffsetFetchRequest(group_id=group, topics=[
        of.OffsetFetchRequestTopic(topic, [p]) for topic, p in partitions])
    r = _at_coordinator(t, group, request, 7, lambda r: [r.error_code])
    return (ErrorCode(r.error_code).name,
            {(tp.name, p.partition_index): (p.committed_offset, ErrorCode(p.error_code).name)
             for tp in r.topics for p in tp.partitions})


def test_commit_and_fetch_without_members_and_each_partition_error(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "committed", 2, 3)
        committed = commit(t, "g-simple", {("committed", 0): 5, ("committed", 1): 7,
                                           ("committed", 9): 1, ("no-such-topic", 0): 1})
        fetched = fetch(t, "g-simple", [("committed", 0), ("committed", 1), ("committed", 9),
                                        ("no-such-topic", 0)])
        never = fetch(t, "g-never", [("committed", 0)])
        return committed, fetched, never

    pair.same(scenario)


def test_commit_with_a_generation_to_a_group_that_does_not_exist(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "gen-commit", 1, 3)
        return (commit(t, "g-ghost", {("gen-commit", 0): 1}, generation=3, member="m-1"),
                fetch(t, "g-ghost", [("gen-commit", 0)]))

    pair.same(scenario)


def test_a_committed_offset_of_zero_is_kept(pair: Pair) -> None:
    """A consumer closing with nothing read from a partition commits its position, 0."""
    def scenario(t: Target) -> object:
        create_ready(t, "zero-commit", 2, 3)
        committed = commit(t, "g-zero", {("zero-commit", 0): 0, ("zero-commit", 1): 4})
        return committed, fetch(t, "g-zero", [("zero-commit", 0), ("zero-commit", 1)])

    pair.same(scenario)


def test_commits_through_a_rebalance(pair: Pair) -> None:
    """A member commits while a second member's JoinGroup rebalances the group (Kafka's
    doCommitOffsets): accepted in PreparingRebalance with the current generation; once the join
    ends (CompletingRebalance, generation 2), the old generation is ILLEGAL_GENERATION (checked
    before the state: what librdkafka expects of a commit during a cooperative rebalance), the
    new one REBALANCE_IN_PROGRESS until the sync, then accepted."""
    group, topic = "rebalancing", "rebalancing-offsets"

    def scenario(t: Target) -> list[tuple[str, object]]:
        create_ready(t, topic, 1, 3)
        assert commit(t, group, {(topic, 0): 0}) == {(topic, 0): "NONE"}  # the group exists
        address = coordinator(t, group)
        return asyncio.run(_rebalance(address, group, topic))

    steps = pair.same(scenario)
    assert [s for s, _ in steps][-1] == "commit, stable again, generation 2"


async def _rebalance(address: str, group: str, topic: str) -> list[tuple[str, object]]:
    host, port = address.rsplit(":", 1)
    a, b = (BrokerConnection(host, int(port), request_timeout_ms=60000) for _ in range(2))
    await a.connect(timeout_s=10)
    await b.connect(timeout_s=10)
    steps: list[tuple[str, object]] = []

    async def join(conn: BrokerConnection, member: str) -> jg.JoinGroupResponse:
        return await conn.send(jg.JoinGroupRequest(
            group_id=group, session_timeout_ms=30000, rebalance_timeout_ms=30000,
            member_id=member, protocol_type="consumer",
            protocols=[jg.JoinGroupRequestProtocol("range", b"")]), 5)

    async def first_join(conn: BrokerConnection) -> str:
        r = await join(conn, "")
        assert r.error_code == ErrorCode.MEMBER_ID_REQUIRED, r
        return str(r.member_id)

    async def sync(conn: BrokerConnection, member: str, generation: int,
                   assignments: list[str]) -> str:
        r = await conn.send(sg.SyncGroupRequest(
            group_id=group, generation_id=generation, member_id=member,
            assignments=[sg.SyncGroupRequestAssignment(m, b"") for m in assignments]), 3)
        return ErrorCode(r.error_code).name

    async def commit_(label: str, member: str, generation: int) -> None:
        r = await a.send(oc.OffsetCommitRequest(
            group_id=group, generation_id_or_member_epoch=generation, member_id=member,
            topics=[oc.OffsetCommitRequestTopic(topic, [oc.OffsetCommitRequestPartition(0, 1)])]),
            8)
        steps.append((label, ErrorCode(r.topics[0].partitions[0].error_code).name))

    try:
        member_a = await first_join(a)
        joined = await join(a, member_a)
        generation = joined.generation_id
        steps.append(("join alone", (ErrorCode(joined.error_code).name, generation)))
        steps.append(("sync alone", await sync(a, member_a, generation, [member_a])))
        await commit_("commit, stable", member_a, generation)
        member_b = await first_join(b)
        b_joining = asyncio.ensure_future(join(b, member_b))  # parks until `a` rejoins
        await _until_state(a, group, "PreparingRebalance")
        await commit_("commit, preparing rebalance, current generation", member_a, generation)
        rejoined, b_joined = await asyncio.gather(join(a, member_a), b_joining)
        new_generation = rejoined.generation_id
        steps.append(("join of both", (ErrorCode(rejoined.error_code).name,
                                       ErrorCode(b_joined.error_code).name,
                                       new_generation - generation)))
        await commit_("commit, completing rebalance, old generation", member_a, generation)
        await commit_("commit, completing rebalance, new generation", member_a, new_generation)
        await commit_("commit, completing rebalance, unknown member", "who", new_generation)
        leader = rejoined.leader == member_a
        syncs = await asyncio.gather(
            sync(a, member_a, new_generation, [member_a, member_b] if leader else []),
            sync(b, member_b, new_generation, [] if leader else [member_a, member_b]))
        steps.append(("sync of both", syncs))
        await commit_("commit, stable again, old generation", member_a, generation)
        await commit_("commit, stable again, generation 2", member_a, new_generation)
    finally:
        await a.close()
        await b.close()
    return steps


async def _until_state(conn: BrokerConnection, group: str, state: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        r = await conn.send(dg.DescribeGroupsRequest(groups=[group]), 4)
        if r.groups[0].group_state == state:
            return
        assert time.monotonic() < deadline, f"the group did not reach {state}"
        await asyncio.sleep(0.1)
