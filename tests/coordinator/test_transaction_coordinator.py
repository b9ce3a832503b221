"""The asyncio `TransactionCoordinator` over a real replica manager and real logs on disk (no
network: markers go to this broker's own partitions through `write_txn_markers`): a commit and
an abort end to end (the `__transaction_state` records, the markers in the data partition),
Kafka's error codes for bad input, zombie fencing, the timeout abort, a coordinator that loads
a partition left with a PrepareCommit completing that commit, and an idle id's expiration."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tidelog.broker.replica_manager import AsyncioScheduler, BrokerReplicaManager
from tidelog.broker.txn_apis import write_txn_markers
from tidelog.coordinator.transaction.asyncio_driver import (
    AsyncioTasks,
    ConnectionMarkerTransport,
    ReplicaManagerAppender,
)
from tidelog.coordinator.transaction.coordinator import TransactionCoordinator
from tidelog.coordinator.transaction.log import (
    TRANSACTION_STATE_TOPIC_NAME,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from tidelog.coordinator.transaction.metadata import TransactionState, TxnTransitMetadata
from tidelog.coordinator.transaction.state_manager import TransactionConfig
from tidelog.protocol.errors import ErrorCode as E
from tidelog.protocol.records.builder import Record, build_batch, build_values
from tidelog.protocol.records.decoder import decode_records, parse_end_transaction_marker
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition
from tidelog.storage.file_io import OsFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager
from tidelog.storage.transactions import AppendOrigin

T = TypeVar("T")
S = TransactionState
CONFIG = TransactionConfig(num_partitions=1, max_timeout_ms=60_000)
TXN_TP = TopicPartition(TRANSACTION_STATE_TOPIC_NAME, 0)
DATA = TopicPartition("orders", 0)


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 30))  # type: ignore[arg-type]


class Broker:
    """Broker 1 leading `__transaction_state-0` and `orders-0` alone, a coordinator on them."""

    def __init__(self, log_dir: Path, leader_epoch: int = 0) -> None:
        self.now = 1_000_000
        self.log_manager = LogManager([str(log_dir)], LogConfig(), OsFileIO(), 0)
        self.rm = BrokerReplicaManager(1, self.log_manager, ReplicationConfig(), zk_client=None,
                                       endpoint_of=lambda _: None)
        self.rm.set_broker_epoch(1)
        result = self.rm.become_leader_or_follower(0, 1, 1, [
            LeaderAndIsrPartitionState(tp.topic, tp.partition, 1, 1, leader_epoch, (1,), 0, (1,),
                                       True) for tp in (TXN_TP, DATA)], {1})
        assert int(result.error) == 0
        self.next_pid = 4000

        async def generate() -> int:
            self.next_pid += 1
            return self.next_pid

        self.tasks = AsyncioTasks()
        self.coordinator = TransactionCoordinator(
            1, ReplicaManagerAppender(self.rm), _LocalLeader(),
            ConnectionMarkerTransport(1, None, lambda req: write_txn_markers(
                self.rm, req, 5000, None)),
            generate, CONFIG, time=_TestClock(self), scheduler=AsyncioScheduler(),
            tasks=self.tasks)

    async def start(self, leader_epoch: int = 0) -> None:
        self.coordinator.startup()
        self.coordinator.state.on_election(0, leader_epoch)
        await until(lambda: not self.coordinator.state.get("t")[0], "the partition loaded")

    async def stop(self) -> None:
        await self.coordinator.shutdown()
        await self.tasks.cancel_all()
        await self.rm.shutdown()
        self.log_manager.shutdown()

    def records(self, tp: TopicPartition) -> list[tuple[bool, object]]:
        """(is control, decoded record) of every record of `tp`."""
        p = self.rm.core.partition(tp)
        return [(b.is_control_batch, r) for b in p.log.batches(0) for r in decode_records(b)]

    def states(self) -> list[TxnTransitMetadata | None]:
        out = []
        for _control, r in self.records(TXN_TP):
            assert decode_key(bytes(r.key)) == "t"  # type: ignore[attr-defined]
            value = r.value  # type: ignore[attr-defined]
            out.append(decode_value(None if value is None else bytes(value)))
        return out

    def markers(self) -> list[tuple[str, int, int]]:
        """(COMMIT/ABORT, producer epoch, coordinator epoch) of the markers in `orders-0`."""
        p = self.rm.core.partition(DATA)
        out = []
        for b in p.log.batches(0):
            if b.is_control_batch:
                for r in decode_records(b):
                    m = parse_end_transaction_marker(r)
                    out.append((m.control_type.name, b.producer_epoch, m.coordinator_epoch))
        return out


class _TestClock:
    """The coordinator's time: the test's `Broker.now`."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def milliseconds(self) -> int:
        return self.broker.now


class _LocalLeader:
    """The metadata cache as the marker channel asks it: broker 1 leads every partition."""

    def partition(self, tp: TopicPartition) -> object:
        return tp

    def contains_topic(self, topic: str) -> bool:
        return True

    def leader_of(self, tp: TopicPartition) -> int:
        return 1


async def until(cond: Callable[[], object], what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def with_started_broker(tmp_path: Path, body: Callable[[Broker], Awaitable[None]]) -> None:
    """Run `body` against a started Broker, stopped afterwards whatever happened."""

    async def go() -> None:
        b = Broker(tmp_path)
        await b.start()
        try:
            await body(b)
        finally:
            await b.stop()

    run(go())


async def produce_transactional(b: Broker, pid: int, epoch: int, seq: int = 0) -> None:
    batch = build_values([b"v1", b"v2"], producer_id=pid, producer_epoch=epoch,
                         base_sequence=seq, transactional=True)
    results = await b.rm.append_records(-1, {DATA: batch}, 5000)
    assert results[DATA].error == 0


async def begin(b: Broker, timeout_ms: int = 30_000) -> tuple[int, int]:
    r = await b.coordinator.handle_init_producer_id("t", timeout_ms)
    assert r.error == 0
    assert await b.coordinator.handle_add_partitions("t", r.producer_id, r.producer_epoch,
                                                     [DATA]) == 0
    await produce_transactional(b, r.producer_id, r.producer_epoch)
    return r.producer_id, r.producer_epoch


def test_a_commit_is_logged_marked_and_completed(tmp_path: Path) -> None:
    async def body(b: Broker) -> None:
        pid, epoch = await begin(b)
        assert (pid, epoch) == (4001, 0)
        assert await b.coordinator.handle_end_transaction("t", pid, epoch, True) == 0
        md = b.coordinator.state.transactions["t"]
        await until(lambda: md.state == S.COMPLETE_COMMIT, "CompleteCommit")
        assert [s.txn_state for s in b.states() if s] == [
            S.EMPTY, S.ONGOING, S.PREPARE_COMMIT, S.COMPLETE_COMMIT]
        assert b.states()[2].topic_partitions == {DATA}  # type: ignore[union-attr]
        assert b.markers() == [("COMMIT", 0, 0)]
        # Committing again answers as the completed commit did; aborting it is refused.
        assert await b.coordinator.handle_end_transaction("t", pid, epoch, True) == 0
        assert await b.coordinator.handle_end_transaction(
            "t", pid, epoch, False) == E.INVALID_TXN_STATE

    with_started_broker(tmp_path, body)


def test_kafkas_errors_for_bad_input(tmp_path: Path) -> None:
    async def body(b: Broker) -> None:
        c = b.coordinator
        assert (await c.handle_init_producer_id("t", 60_001)).error == \
            E.INVALID_TRANSACTION_TIMEOUT  # beyond transaction.max.timeout.ms
        assert (await c.handle_init_producer_id("t", 0)).error == E.INVALID_TRANSACTION_TIMEOUT
        assert (await c.handle_init_producer_id("", 1000)).error == E.INVALID_REQUEST
        assert await c.handle_end_transaction("nobody", 1, 0, True) == \
            E.INVALID_PRODUCER_ID_MAPPING
        r = await c.handle_init_producer_id("t", 1000)
        # EndTxn with no transaction begun.
        assert await c.handle_end_transaction("t", r.producer_id, r.producer_epoch,
                                              True) == E.INVALID_TXN_STATE
        assert await c.handle_add_partitions("t", r.producer_id + 1, r.producer_epoch,
                                             [DATA]) == E.INVALID_PRODUCER_ID_MAPPING
        assert await c.handle_add_partitions("t", r.producer_id, r.producer_epoch + 1,
                                             [DATA]) == E.PRODUCER_FENCED

    with_started_broker(tmp_path, body)


def test_a_new_producer_fences_the_old_one_and_aborts_its_transaction(tmp_path: Path) -> None:
    async def body(b: Broker) -> None:
        c = b.coordinator
        pid, epoch = await begin(b)
        # The new instance's InitProducerId aborts the open transaction under a bumped epoch
        # and asks it to retry; the retry gets the epoch after that.
        assert (await c.handle_init_producer_id("t", 30_000)).error == \
            E.CONCURRENT_TRANSACTIONS
        md = c.state.transactions["t"]
        await until(lambda: md.state == S.COMPLETE_ABORT, "CompleteAbort")
        assert b.markers() == [("ABORT", 1, 0)]
        r = await c.handle_init_producer_id("t", 30_000)
        assert (r.error, r.producer_id, r.producer_epoch) == (0, pid, 2)
        # The zombie is refused everywhere.
        assert await c.handle_add_partitions("t", pid, epoch, [DATA]) == E.PRODUCER_FENCED
        assert await c.handle_end_transaction("t", pid, epoch, True) == E.PRODUCER_FENCED
        zombie = build_values([b"z"], producer_id=pid, producer_epoch=epoch, base_sequence=1,
                              transactional=True)
        assert (await b.rm.append_records(-1, {DATA: zombie}, 5000))[DATA].error == \
            E.INVALID_PRODUCER_EPOCH
        # KIP-360: the current producer bumps its own epoch; a stale one is fenced.
        r2 = await c.handle_init_producer_id("t", 30_000, (pid, 2))
        assert (r2.error, r2.producer_epoch) == (0, 3)
        assert (await c.handle_init_producer_id("t", 30_000, (pid, 1))).error == \
            E.PRODUCER_FENCED

    with_started_broker(tmp_path, body)


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(
        tmp_path: Path) -> None:
    async def body(b: Broker) -> None:
        c = b.coordinator
        pid, epoch = await begin(b, timeout_ms=5000)
        b.now += 5000
        assert await c.abort_timed_out_transactions() == []  # not past it yet
        b.now += 1
        assert await c.abort_timed_out_transactions() == ["t"]
        md = c.state.transactions["t"]
        await until(lambda: md.state == S.COMPLETE_ABORT, "CompleteAbort")
        assert (md.producer_epoch, b.markers()) == (1, [("ABORT", 1, 0)])
        assert await c.handle_end_transaction("t", pid, epoch, True) == E.PRODUCER_FENCED

    with_started_broker(tmp_path, body)


@pytest.mark.parametrize(("prepared_state", "complete", "marker"), [
    (S.PREPARE_COMMIT, S.COMPLETE_COMMIT, "COMMIT"),
    (S.PREPARE_ABORT, S.COMPLETE_ABORT, "ABORT"),
])
def test_a_new_coordinator_completes_a_transaction_found_prepared_in_the_log(
        tmp_path: Path, prepared_state: TransactionState, complete: TransactionState,
        marker: str) -> None:
    """The old coordinator wrote PrepareCommit (PrepareAbort) and died before any marker: the
    coordinator that loads the partition (a new leader epoch) sends the markers and writes
    CompleteCommit (CompleteAbort)."""

    async def go() -> None:
        b = Broker(tmp_path, leader_epoch=3)
        try:
            await produce_transactional(b, 77, 5)
            prepared = TxnTransitMetadata(77, -1, 5, -1, 30_000, prepared_state,
                                          frozenset({DATA}), b.now - 10, b.now - 5)
            batch = build_batch([Record(key=encode_key("t"), value=encode_value(prepared))])
            assert (await b.rm.append_records(-1, {TXN_TP: batch}, 5000,
                                              origin=AppendOrigin.COORDINATOR))[TXN_TP].error == 0
            await b.start(leader_epoch=3)
            md = b.coordinator.state.transactions["t"]
            await until(lambda: md.state == complete, complete.kafka_name)
            assert b.markers() == [(marker, 5, 3)]  # the new coordinator epoch
            assert [s.txn_state for s in b.states() if s][-1] == complete
            # The log's last stable offset is past the transaction now.
            p = b.rm.core.partition(DATA)
            assert p.last_stable_offset == p.log_end_offset
        finally:
            await b.stop()

    run(go())


def test_an_idle_transactional_id_expires_with_a_tombstone(tmp_path: Path) -> None:
    async def body(b: Broker) -> None:
        c = b.coordinator
        pid, epoch = await begin(b)
        expiration = c.config.transactional_id_expiration_ms
        b.now += expiration + 1
        assert await c.state.remove_expired() == []  # a transaction is open: kept
        assert await c.handle_end_transaction("t", pid, epoch, False) == 0
        md = c.state.transactions["t"]
        await until(lambda: md.state == S.COMPLETE_ABORT, "CompleteAbort")
        b.now += expiration - 1  # the abort updated it: not yet
        assert await c.state.remove_expired() == []
        b.now += 1  # Kafka's horizon: last update <= now - transactional.id.expiration.ms
        assert await c.state.remove_expired() == ["t"]
        assert c.state.get("t") == (0, 0, None) and b.states()[-1] is None  # the tombstone
        # A reloaded partition does not know the id either; a new producer starts over.
        c.state.on_resignation(0)
        c.state.on_election(0, 0)
        await until(lambda: not c.state.get("t")[0], "the partition reloaded")
        assert c.state.get("t") == (0, 0, None)
        r = await c.handle_init_producer_id("t", 1000)
        assert (r.error, r.producer_epoch) == (0, 0) and r.producer_id != pid

    with_started_broker(tmp_path, body)
