"""Both coordinators load their partition (``__consumer_offsets``, ``__transaction_state``)
with one retry policy: a read error is retried from the start, the partition is served only
once read whole, and after the last failed attempt requests get NOT_COORDINATOR (Kafka's
CoordinatorRuntime FAILED) instead of COORDINATOR_LOAD_IN_PROGRESS forever. The logs live on
a MemoryFileIO whose reads under a partition's directory fail a chosen number of times."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from tidelog.broker.replica_manager import BrokerReplicaManager
from tidelog.coordinator.group_coordinator import CoordinatorConfig, GroupCoordinator
from tidelog.coordinator.offsets import (
    GROUP_METADATA_TOPIC_NAME,
    OffsetAndMetadata,
    encode_offset_commit_key,
    encode_offset_commit_value,
)
from tidelog.coordinator.partition_load import LoadRetry
from tidelog.coordinator.transaction.asyncio_driver import AsyncioTasks, ReplicaManagerAppender
from tidelog.coordinator.transaction.log import (
    TRANSACTION_STATE_TOPIC_NAME,
    encode_key,
    encode_value,
)
from tidelog.coordinator.transaction.metadata import TransactionState, TxnTransitMetadata
from tidelog.coordinator.transaction.state_manager import TransactionConfig, TransactionStateManager
from tidelog.protocol.errors import ErrorCode as E
from tidelog.protocol.records.builder import Record, build_batch
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager
from tidelog.storage.transactions import AppendOrigin

T = TypeVar("T")
LOG_DIR = "/data"
OFFSETS_TP = TopicPartition(GROUP_METADATA_TOPIC_NAME, 0)
TXN_TP = TopicPartition(TRANSACTION_STATE_TOPIC_NAME, 0)
FAST_RETRY = LoadRetry(attempts=3, backoff_ms=1)


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 30))  # type: ignore[arg-type]


class FailingReads(MemoryFileIO):
    """Reads of files under `prefix` raise EIO while `read_failures` > 0 (one each)."""

    def __init__(self) -> None:
        super().__init__()
        self.prefix = "/nowhere/"
        self.read_failures = 0
        self.failed_reads = 0

    def _maybe_fail(self, path: str, write: bool = True) -> None:
        if not write and self.read_failures > 0 and path.startswith(self.prefix):
            self.read_failures -= 1
            self.failed_reads += 1
            raise OSError(errno.EIO, "injected read error", path)
        super()._maybe_fail(path, write)


class Broker:
    """Broker 1 leading `tp` alone on a FailingReads disk."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.disk = FailingReads()
        self.log_manager = LogManager([LOG_DIR], LogConfig(), self.disk, 0)
        self.rm = BrokerReplicaManager(1, self.log_manager, ReplicationConfig(), zk_client=None,
                                       endpoint_of=lambda _: None)
        self.rm.set_broker_epoch(1)
        result = self.rm.become_leader_or_follower(0, 1, 1, [LeaderAndIsrPartitionState(
            tp.topic, tp.partition, 1, 1, 0, (1,), 0, (1,), True)], {1})
        assert int(result.error) == 0

    async def append(self, key: bytes, value: bytes) -> None:
        batch = build_batch([Record(key=key, value=value)])
        results = await self.rm.append_records(-1, {self.tp: batch}, 5000,
                                               origin=AppendOrigin.COORDINATOR)
        assert results[self.tp].error == 0

    def fail_reads(self, count: int) -> None:
        self.disk.prefix = f"{LOG_DIR}/{self.tp.topic}-{self.tp.partition}/"
        self.disk.read_failures = count

    async def close(self) -> None:
        await self.rm.shutdown()
        self.log_manager.shutdown()


async def settled(error: Callable[[], int]) -> int:
    """The coordinator's answer once it no longer says COORDINATOR_LOAD_IN_PROGRESS."""
    for _ in range(1000):
        code = error()
        if code != E.COORDINATOR_LOAD_IN_PROGRESS:
            return code
        await asyncio.sleep(0.005)
    raise AssertionError("the partition is still loading")


# -- the transaction state manager ------------------------------------------------------------

class _FixedTime:
    def milliseconds(self) -> int:
        return 2000


def txn_state_manager(b: Broker, tasks: AsyncioTasks | None = None) -> TransactionStateManager:
    return TransactionStateManager(1, ReplicaManagerAppender(b.rm),
                                   TransactionConfig(num_partitions=1), _FixedTime(),
                                   tasks or AsyncioTasks())


async def txn_state_after_load(read_failures: int) -> tuple[TransactionStateManager, Broker]:
    b = Broker(TXN_TP)
    transit = TxnTransitMetadata(77, -1, 5, -1, 30_000, TransactionState.ONGOING,
                                 frozenset({TopicPartition("orders", 0)}), 1000, 1005)
    await b.append(encode_key("t"), encode_value(transit))
    state = txn_state_manager(b)
    state.active = True
    state.load_retry = FAST_RETRY
    b.fail_reads(read_failures)
    state.on_election(0, 0)
    return state, b


@pytest.mark.parametrize("read_failures", [1, FAST_RETRY.attempts - 1])
def test_the_transaction_state_load_retries_a_failed_read(read_failures: int) -> None:
    async def go() -> None:
        state, b = await txn_state_after_load(read_failures)
        try:
            assert await settled(lambda: state.get("t")[0]) == 0
            assert b.disk.failed_reads == read_failures
            _, epoch, md = state.get("t")
            assert epoch == 0 and md is not None
            assert (md.producer_id, md.producer_epoch, md.state) == (77, 5,
                                                                     TransactionState.ONGOING)
        finally:
            await state.shutdown()
            await b.close()

    run(go())


def test_the_transaction_state_load_gives_up_with_not_coordinator() -> None:
    async def go() -> None:
        state, b = await txn_state_after_load(FAST_RETRY.attempts)
        try:
            assert await settled(lambda: state.get("t")[0]) == E.NOT_COORDINATOR
            assert b.disk.failed_reads == FAST_RETRY.attempts
            assert state.transactions == {}
            # The next leadership loads it again.
            state.on_election(0, 1)
            assert await settled(lambda: state.get("t")[0]) == 0
            assert state.get("t")[1] == 1
        finally:
            await state.shutdown()
            await b.close()

    run(go())


# -- the group coordinator --------------------------------------------------------------------

async def groups_after_load(read_failures: int) -> tuple[GroupCoordinator, Broker]:
    b = Broker(OFFSETS_TP)
    await b.append(encode_offset_commit_key("g", "orders", 0),
                   encode_offset_commit_value(OffsetAndMetadata(42, commit_timestamp_ms=1000)))
    c = GroupCoordinator(1, b.rm, CoordinatorConfig(offsets_topic_num_partitions=1))
    c.startup()
    c.load_retry = FAST_RETRY
    b.fail_reads(read_failures)
    c.on_election(0, 0)
    return c, b


@pytest.mark.parametrize("read_failures", [1, FAST_RETRY.attempts - 1])
def test_the_group_load_retries_a_failed_read(read_failures: int) -> None:
    async def go() -> None:
        c, b = await groups_after_load(read_failures)
        try:
            assert await settled(lambda: c.coordinator_error("g")) == 0
            assert b.disk.failed_reads == read_failures
            assert c.offsets["g"][("orders", 0)].offset == 42
        finally:
            await c.shutdown()
            await b.close()

    run(go())


def test_the_group_load_gives_up_with_not_coordinator() -> None:
    async def go() -> None:
        c, b = await groups_after_load(FAST_RETRY.attempts)
        try:
            assert await settled(lambda: c.coordinator_error("g")) == E.NOT_COORDINATOR
            assert b.disk.failed_reads == FAST_RETRY.attempts
            assert "g" not in c.offsets
            c.on_election(0, 1)
            assert await settled(lambda: c.coordinator_error("g")) == 0
            assert c.offsets["g"][("orders", 0)].offset == 42
        finally:
            await c.shutdown()
            await b.close()

    run(go())


def test_a_load_superseded_while_waiting_to_retry_stops() -> None:
    """A resignation during the wait before the next attempt ends the load: no further read."""

    async def go() -> None:
        b = Broker(TXN_TP)
        await b.append(encode_key("t"), encode_value(TxnTransitMetadata(
            77, -1, 5, -1, 30_000, TransactionState.EMPTY, frozenset(), 1000, 1005)))
        tasks = AsyncioTasks()
        state = txn_state_manager(b, tasks)
        state.active = True
        state.load_retry = LoadRetry(attempts=3, backoff_ms=50)
        b.fail_reads(1)
        state.on_election(0, 0)
        try:
            for _ in range(1000):
                if b.disk.failed_reads:
                    break
                await asyncio.sleep(0.001)
            state.on_resignation(0)
            await tasks.join()
            assert state.get("t")[0] == E.NOT_COORDINATOR and state.transactions == {}
            assert b.disk.failed_reads == 1
        finally:
            await state.shutdown()
            await b.close()

    run(go())


def test_the_retry_policy_waits_longer_each_attempt_and_stops_at_the_last() -> None:
    retry = LoadRetry(attempts=3, backoff_ms=100)
    assert [retry.delay_ms(n) for n in (1, 2, 3)] == [100, 200, None]
