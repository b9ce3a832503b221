"""The asyncio `GroupCoordinator` over a real replica manager and real logs on disk (no
network): ownership errors, a full join/sync round with waiting requests, offsets written to
`__consumer_offsets` with acks=all, and a coordinator on the same log after a move serving the
same committed offsets and the group's generation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from tidelog.broker.replica_manager import BrokerReplicaManager
from tidelog.coordinator.group import GroupState
from tidelog.coordinator.group_coordinator import CoordinatorConfig, GroupCoordinator
from tidelog.coordinator.offsets import GROUP_METADATA_TOPIC_NAME, OffsetAndMetadata, load_partition
from tidelog.protocol.errors import ErrorCode as E
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition
from tidelog.storage.file_io import OsFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

T = TypeVar("T")
CONFIG = CoordinatorConfig(offsets_topic_num_partitions=1, group_initial_rebalance_delay_ms=0)
TP = TopicPartition(GROUP_METADATA_TOPIC_NAME, 0)
PROTOCOLS = [("range", b"subscription")]


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 30))  # type: ignore[arg-type]


class Broker:
    """A replica manager leading `__consumer_offsets-0` alone, and a coordinator on it."""

    def __init__(self, log_dir: Path, leader_epoch: int = 0) -> None:
        self.log_manager = LogManager([str(log_dir)], LogConfig(), OsFileIO(), 0)
        self.rm = BrokerReplicaManager(1, self.log_manager, ReplicationConfig(), zk_client=None,
                                       endpoint_of=lambda _: None)
        self.rm.set_broker_epoch(1)
        result = self.rm.become_leader_or_follower(0, 1, 1, [LeaderAndIsrPartitionState(
            GROUP_METADATA_TOPIC_NAME, 0, 1, 1, leader_epoch, (1,), 0, (1,), True)], {1})
        assert int(result.error) == 0
        self.coordinator = GroupCoordinator(1, self.rm, CONFIG)

    async def start(self) -> None:
        self.coordinator.startup()
        self.coordinator.on_election(0, 0)
        for _ in range(100):
            if not self.coordinator.coordinator_error("g"):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the offsets partition was not loaded")

    async def stop(self) -> None:
        await self.coordinator.shutdown()
        await self.rm.shutdown()
        self.log_manager.shutdown()


async def join_and_sync(c: GroupCoordinator, group: str) -> tuple[str, int]:
    r = await c.handle_join_group(group, "", None, True, "client", "/127.0.0.1", 30000, 10000,
                                  "consumer", PROTOCOLS)
    assert r.error == E.MEMBER_ID_REQUIRED and r.member_id.startswith("client-")
    r = await c.handle_join_group(group, r.member_id, None, True, "client", "/127.0.0.1", 30000,
                                  10000, "consumer", PROTOCOLS)
    assert r.error == 0 and r.generation_id == 1 and r.leader_id == r.member_id
    s = await c.handle_sync_group(group, 1, r.member_id, "consumer", "range",
                                  {r.member_id: b"my-partitions"})
    assert s.error == 0 and s.assignment == b"my-partitions"
    return r.member_id, r.generation_id


def test_requests_before_the_partition_is_loaded_are_refused(tmp_path: Path) -> None:
    async def go() -> None:
        b = Broker(tmp_path)
        b.coordinator.startup()
        try:
            assert b.coordinator.coordinator_error("g") == E.NOT_COORDINATOR
            r = await b.coordinator.handle_join_group("g", "", None, True, "c", "/h", 1, 10000,
                                                      "consumer", PROTOCOLS)
            assert r.error == E.NOT_COORDINATOR
            b.coordinator.on_election(0, 0)
            assert b.coordinator.handle_heartbeat("g", "m", 1) == E.COORDINATOR_LOAD_IN_PROGRESS
            await b.start()
            r = await b.coordinator.handle_join_group("", "", None, True, "c", "/h", 1, 10000,
                                                      "consumer", PROTOCOLS)
            assert r.error == E.INVALID_GROUP_ID
            r = await b.coordinator.handle_join_group("g", "", None, True, "c", "/h", 1, 1000,
                                                      "consumer", PROTOCOLS)
            assert r.error == E.INVALID_SESSION_TIMEOUT  # below group.min.session.timeout.ms
            r = await b.coordinator.handle_join_group("g", "someone", None, True, "c", "/h", 1,
                                                      10000, "consumer", PROTOCOLS)
            assert r.error == E.UNKNOWN_MEMBER_ID
            assert b.coordinator.handle_heartbeat("nope", "m", 1) == E.UNKNOWN_MEMBER_ID
            errors = await b.coordinator.handle_commit_offsets(
                "nope", "m", 3, {("t", 0): OffsetAndMetadata(1)})
            assert errors == {("t", 0): E.ILLEGAL_GENERATION}
            b.coordinator.on_resignation(0)
            assert b.coordinator.handle_heartbeat("g", "m", 1) == E.NOT_COORDINATOR
        finally:
            await b.stop()

    run(go())


def test_two_members_rebalance_through_the_shell(tmp_path: Path) -> None:
    async def go() -> None:
        b = Broker(tmp_path)
        await b.start()
        c = b.coordinator
        try:
            m1, gen = await join_and_sync(c, "g")
            # A second member's JoinGroup waits until the first one rejoins.
            join2 = asyncio.ensure_future(c.handle_join_group(
                "g", "", None, False, "other", "/h", 30000, 10000, "consumer", PROTOCOLS))
            for _ in range(500):  # the join has been handled as far as it goes: it waits
                if c.groups["g"].state == GroupState.PREPARING_REBALANCE:
                    break
                await asyncio.sleep(0.01)
            assert c.groups["g"].state == GroupState.PREPARING_REBALANCE
            assert not join2.done()
            assert c.handle_heartbeat("g", m1, gen) == E.REBALANCE_IN_PROGRESS
            r1 = await c.handle_join_group("g", m1, None, True, "client", "/h", 30000, 10000,
                                           "consumer", PROTOCOLS)
            r2 = await join2
            assert r1.generation_id == r2.generation_id == 2
            assert r1.leader_id == m1 and len(r1.members) == 2 and r2.members == ()
            sync2 = asyncio.ensure_future(c.handle_sync_group("g", 2, r2.member_id, None, None, {}))
            s1 = await c.handle_sync_group("g", 2, m1, None, None,
                                           {m1: b"p0", r2.member_id: b"p1"})
            assert (s1.assignment, (await sync2).assignment) == (b"p0", b"p1")
            _, (state, _, protocol, members) = c.handle_describe_group("g")
            assert (state, protocol, len(members)) == ("Stable", "range", 2)
            assert c.handle_list_groups() == (0, [("g", "consumer", "Stable")])
            error, per_member = c.handle_leave_group("g", [r2.member_id, "ghost"])
            assert error == 0 and per_member == [0, E.UNKNOWN_MEMBER_ID]
            assert c.groups["g"].state == GroupState.PREPARING_REBALANCE
        finally:
            await b.stop()

    run(go())


def test_committed_offsets_and_the_group_survive_a_coordinator_move(tmp_path: Path) -> None:
    async def first() -> str:
        b = Broker(tmp_path)
        await b.start()
        c = b.coordinator
        try:
            member, gen = await join_and_sync(c, "g")
            errors = await c.handle_commit_offsets("g", member, gen, {
                ("t", 0): OffsetAndMetadata(10, 3, "m0", 111),
                ("t", 1): OffsetAndMetadata(20, 3, "x" * 5000, 111),  # metadata too large
            })
            assert errors == {("t", 0): 0, ("t", 1): E.OFFSET_METADATA_TOO_LARGE}
            # A commit from outside group management (generation -1) into another group.
            assert await c.handle_commit_offsets("simple", "", -1, {
                ("t", 1): OffsetAndMetadata(7, -1, "", 112)}) == {("t", 1): 0}
            assert await c.handle_commit_offsets("g", member, gen, {
                ("t", 0): OffsetAndMetadata(11, 3, "m1", 113)}) == {("t", 0): 0}
            assert c.handle_fetch_offsets("g", [("t", 0), ("t", 1)]) == (0, {
                ("t", 0): OffsetAndMetadata(11, 3, "m1", 113), ("t", 1): None})
            # Everything is in the log, acknowledged: the HW covers it.
            p = b.rm.core.partition(TP)
            assert p.high_watermark == p.log_end_offset > 0
            return member
        finally:
            await b.stop()

    async def second(member: str) -> None:
        # Another coordinator, on the same replica after a leader change (a higher epoch).
        b = Broker(tmp_path, leader_epoch=1)
        await b.start()
        c = b.coordinator
        try:
            assert c.handle_fetch_offsets("g", None) == (0, {
                ("t", 0): OffsetAndMetadata(11, 3, "m1", 113)})
            assert c.handle_fetch_offsets("simple", [("t", 1)]) == (0, {
                ("t", 1): OffsetAndMetadata(7, -1, "", 112)})
            # The group came back Stable at its generation: the member carries on.
            assert c.groups["g"].state == GroupState.STABLE
            assert c.handle_heartbeat("g", member, 1) == 0
            s = await c.handle_sync_group("g", 1, member, None, None, {})
            assert s.error == 0 and s.assignment == b"my-partitions"
            p = b.rm.core.partition(TP)
            loaded = load_partition(p.log.batches(0))
            assert set(loaded.groups) == {"g"} and set(loaded.offsets) == {"g", "simple"}
        finally:
            await b.stop()

    run(second(run(first())))


def test_offsets_expire_after_the_retention_and_empty_groups_are_forgotten(tmp_path: Path) -> None:
    now = [1_000_000]
    retention = 60_000

    async def go() -> None:
        b = Broker(tmp_path)
        b.coordinator = GroupCoordinator(1, b.rm, CoordinatorConfig(
            offsets_topic_num_partitions=1, group_initial_rebalance_delay_ms=0,
            offsets_retention_ms=retention), clock=lambda: now[0])
        await b.start()
        c = b.coordinator
        try:
            member, gen = await join_and_sync(c, "g")
            assert await c.handle_commit_offsets("g", member, gen, {
                ("t", 0): OffsetAndMetadata(5, -1, "", now[0])}) == {("t", 0): 0}
            assert await c.handle_commit_offsets("solo", "", -1, {
                ("t", 0): OffsetAndMetadata(9, -1, "", now[0])}) == {("t", 0): 0}
            now[0] += retention
            # "g" has a member: its offsets stay; the standalone commit expires.
            assert await c.cleanup_group_metadata() == 1
            assert c.handle_fetch_offsets("solo", [("t", 0)]) == (0, {("t", 0): None})
            assert c.handle_fetch_offsets("g", [("t", 0)])[1][("t", 0)] is not None
            assert c.handle_leave_group("g", [member]) == (0, [0])
            for _ in range(100):  # the emptied group's generation is written by the shell
                if c.groups["g"].state == GroupState.EMPTY:
                    break
                await asyncio.sleep(0.01)
            now[0] += retention - 1
            assert await c.cleanup_group_metadata() == 0
            now[0] += 1
            assert await c.cleanup_group_metadata() == 1
            assert "g" not in c.groups and c.handle_fetch_offsets("g", None) == (0, {})
            # The tombstones are in the log: a reload finds nothing.
            loaded = load_partition(b.rm.core.partition(TP).log.batches(0))
            assert loaded.offsets == {} and loaded.groups == {}
        finally:
            await b.stop()

    run(go())


def test_a_long_offsets_partition_loads_in_steps_to_its_last_commits(tmp_path: Path) -> None:
    async def commit_many() -> None:
        b = Broker(tmp_path)
        await b.start()
        try:
            for i in range(450):  # one batch each: the load yields to the loop on the way
                assert await b.coordinator.handle_commit_offsets(
                    "solo", "", -1, {("t", i % 3): OffsetAndMetadata(i)}) == {("t", i % 3): 0}
        finally:
            await b.stop()

    async def reload() -> None:
        b = Broker(tmp_path, leader_epoch=1)
        await b.start()
        try:
            _, found = b.coordinator.handle_fetch_offsets("solo", None)
            assert {tp: om.offset for tp, om in found.items()} == {
                ("t", 0): 447, ("t", 1): 448, ("t", 2): 449}
        finally:
            await b.stop()

    run(commit_many())
    run(reload())
