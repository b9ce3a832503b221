"""TxnOffsetCommit in the group coordinator (KIP-98/KIP-447) over a real replica manager:
offsets written in a producer's transaction are invisible until its COMMIT marker lands on the
offsets partition (an ABORT drops them); a coordinator loading the partition applies the
committed ones and keeps an open transaction's offsets pending; KIP-447's member checks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from tidelog.broker.replica_manager import BrokerReplicaManager
from tidelog.broker.txn_apis import write_txn_markers
from tidelog.coordinator.group_coordinator import CoordinatorConfig, GroupCoordinator
from tidelog.coordinator.offsets import GROUP_METADATA_TOPIC_NAME, OffsetAndMetadata
from tidelog.protocol.errors import ErrorCode as E
from tidelog.protocol.messages import write_txn_markers as m_wtm
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition
from tidelog.storage.file_io import OsFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager
from tidelog.storage.producer_state_manager import VerificationGuard

T = TypeVar("T")
CONFIG = CoordinatorConfig(offsets_topic_num_partitions=1, group_initial_rebalance_delay_ms=0)
OM = OffsetAndMetadata(42, -1, "", 1000)


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 30))  # type: ignore[arg-type]


class Broker:
    def __init__(self, log_dir: Path) -> None:
        self.log_manager = LogManager([str(log_dir)], LogConfig(), OsFileIO(), 0)
        self.rm = BrokerReplicaManager(1, self.log_manager, ReplicationConfig(), zk_client=None,
                                       endpoint_of=lambda _: None)
        self.rm.set_broker_epoch(1)
        result = self.rm.become_leader_or_follower(0, 1, 1, [LeaderAndIsrPartitionState(
            GROUP_METADATA_TOPIC_NAME, 0, 1, 1, 0, (1,), 0, (1,), True)], {1})
        assert int(result.error) == 0
        self.coordinator = self.new_coordinator()

    def new_coordinator(self) -> GroupCoordinator:
        return GroupCoordinator(1, self.rm, CONFIG)

    async def start(self, c: GroupCoordinator) -> None:
        c.startup()
        c.on_election(0, 0)
        for _ in range(100):
            if not c.coordinator_error("g"):
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the offsets partition was not loaded")

    async def marker(self, producer_id: int, commit: bool) -> None:
        r = await write_txn_markers(self.rm, m_wtm.WriteTxnMarkersRequest(markers=[
            m_wtm.WritableTxnMarker(producer_id=producer_id, producer_epoch=0,
                                    transaction_result=commit, coordinator_epoch=0, topics=[
                                        m_wtm.WritableTxnMarkerTopic(GROUP_METADATA_TOPIC_NAME,
                                                                     [0])])]),
            5000, self.coordinator.handle_txn_completion)
        assert r.markers[0].topics[0].partitions[0].error_code == 0

    async def stop(self) -> None:
        await self.coordinator.shutdown()
        await self.rm.shutdown()
        self.log_manager.shutdown()


def committed(c: GroupCoordinator) -> object:
    return c.handle_fetch_offsets("g", [("t", 0)])[1][("t", 0)]


def test_transactional_offsets_are_visible_at_commit_and_dropped_at_abort(
        tmp_path: Path) -> None:
    async def go() -> None:
        b = Broker(tmp_path)
        c = b.coordinator
        await b.start(c)
        try:
            assert await c.handle_txn_commit_offsets("g", 7, 0, "", -1, None,
                                                     {("t", 0): OM}) == {("t", 0): 0}
            assert committed(c) is None and c.pending_txn.has_pending("g", ("t", 0))
            await b.marker(7, commit=True)
            assert committed(c) == OM and not c.pending_txn.has_pending("g")
            later = OffsetAndMetadata(50, -1, "", 2000)
            assert await c.handle_txn_commit_offsets("g", 8, 0, "", -1, None,
                                                     {("t", 0): later}) == {("t", 0): 0}
            await b.marker(8, commit=False)
            assert committed(c) == OM  # the aborted offset never shows
            # An open transaction at a reload stays pending; the committed one is loaded.
            assert await c.handle_txn_commit_offsets("g", 9, 0, "", -1, None,
                                                     {("t", 0): later}) == {("t", 0): 0}
            await c.shutdown()
            b.coordinator = c = b.new_coordinator()
            await b.start(c)
            assert committed(c) == OM and c.pending_txn.has_pending("g", ("t", 0))
            await b.marker(9, commit=True)
            assert committed(c) == later
        finally:
            await b.stop()

    run(go())


def test_kip_447_member_checks(tmp_path: Path) -> None:
    async def go() -> None:
        b = Broker(tmp_path)
        c = b.coordinator
        await b.start(c)
        try:
            assert await c.handle_txn_commit_offsets("g", 7, 0, "nobody", -1, None,
                                                     {("t", 0): OM}) == {
                ("t", 0): E.UNKNOWN_MEMBER_ID}
            assert await c.handle_txn_commit_offsets("g", 7, 0, "", 3, None,
                                                     {("t", 0): OM}) == {
                ("t", 0): E.ILLEGAL_GENERATION}
            assert await c.handle_txn_commit_offsets("", 7, 0, "", -1, None,
                                                     {("t", 0): OM}) == {
                ("t", 0): E.INVALID_GROUP_ID}
        finally:
            await b.stop()

    run(go())


def test_kip_890_verification_before_the_append(tmp_path: Path) -> None:
    """The offsets are appended only once the transaction coordinator verified the offsets
    partition, presenting the guard made when the verification started: an ABORT marker
    written meanwhile drops it and the commit is refused; a coordinator that could not be
    asked answers as Kafka's maybeConvertOffsetCommitError."""
    async def go() -> None:
        b = Broker(tmp_path)
        c = b.coordinator
        await b.start(c)
        log = b.rm.core.partition(TopicPartition(GROUP_METADATA_TOPIC_NAME, 0)).log
        try:
            async def unreachable(tp: TopicPartition) -> tuple[int, VerificationGuard]:
                return int(E.NETWORK_EXCEPTION), log.maybe_start_transaction_verification(7, 0)
            assert await c.handle_txn_commit_offsets("g", 7, 0, "", -1, None, {("t", 0): OM},
                                                     unreachable) == {
                ("t", 0): E.COORDINATOR_LOAD_IN_PROGRESS}

            async def aborted_meanwhile(tp: TopicPartition) -> tuple[int, VerificationGuard]:
                guard = log.maybe_start_transaction_verification(7, 0)
                await b.marker(7, commit=False)
                return 0, guard
            end = log.log_end_offset
            assert await c.handle_txn_commit_offsets("g", 7, 0, "", -1, None, {("t", 0): OM},
                                                     aborted_meanwhile) == {
                ("t", 0): E.INVALID_TXN_STATE}
            assert log.log_end_offset == end + 1  # the marker only
            assert not c.pending_txn.has_pending("g")

            async def verified(tp: TopicPartition) -> tuple[int, VerificationGuard]:
                return 0, log.maybe_start_transaction_verification(8, 0)
            assert await c.handle_txn_commit_offsets("g", 8, 0, "", -1, None, {("t", 0): OM},
                                                     verified) == {("t", 0): 0}
            await b.marker(8, commit=True)
            assert committed(c) == OM
        finally:
            await b.stop()

    run(go())
