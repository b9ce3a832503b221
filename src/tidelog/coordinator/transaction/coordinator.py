"""`TransactionCoordinator`: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
the timeout abort and the completion of transactions (Kafka's `TransactionCoordinator`, 3.x
semantics with KIP-360's epoch bumps).

Every request is checked against the transactional id's metadata, a transition is prepared
(`TransactionMetadata.prepare_*`), written to `__transaction_state` (`TransactionStateManager
.append`), and only then applied and answered. EndTxn answers once PrepareCommit/PrepareAbort is
in the log; the markers then go out (`TransactionMarkerChannel`) and CompleteCommit /
CompleteAbort is written when every partition has its marker. A coordinator that loads a
partition completes the prepared transactions it finds there; Ongoing ones past their
`transaction.timeout.ms` are aborted under a bumped epoch, which fences their producer.

Errors below their API's PRODUCER_FENCED version become INVALID_PRODUCER_EPOCH in the handlers
(`broker/txn_apis.py`), as Kafka's KafkaApis does.

The coordinator is driver-independent (driver.py): a `Time`, a `Scheduler` for its periodic
jobs, a `TaskRunner` for its coroutines, a `CoordinatorAppender`, a `MarkerTransport` and the
partition leaders. The asyncio broker and the simulator (sim/txn_node.py) each supply them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tidelog.coordinator.transaction.driver import (
    CoordinatorAppender,
    MarkerTransport,
    PartitionLeaders,
    TaskHandle,
    TaskRunner,
)
from tidelog.coordinator.transaction.marker_channel import TransactionMarkerChannel
from tidelog.coordinator.transaction.metadata import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    IllegalTransitionError,
    TransactionMetadata,
    TransactionState,
    TxnTransitMetadata,
    is_epoch_exhausted,
)
from tidelog.coordinator.transaction.state_manager import (
    TransactionConfig,
    TransactionStateManager,
)
from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import TopicPartition
from tidelog.shell.interfaces import Scheduler, Time

__all__ = ["InitProducerIdResult", "TransactionCoordinator"]

logger = logging.getLogger(__name__)

E = ErrorCode
S = TransactionState
_COMPLETE_RETRY_MS = 500


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    error: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


class TransactionCoordinator:
    def __init__(
        self,
        broker_id: int,
        appender: CoordinatorAppender,
        metadata_cache: PartitionLeaders,
        transport: MarkerTransport,
        generate_producer_id: Callable[[], Awaitable[int]],
        config: TransactionConfig | None = None,
        *,
        time: Time,
        scheduler: Scheduler,
        tasks: TaskRunner,
    ) -> None:
        """`generate_producer_id`: an async callable returning a new producer id."""
        self.broker_id = broker_id
        self.config = config or TransactionConfig()
        self.time = time
        self.scheduler = scheduler
        self.tasks = tasks
        self.state = TransactionStateManager(broker_id, appender, self.config, time, tasks)
        self.state.on_loaded = self._on_loaded
        self.markers = TransactionMarkerChannel(broker_id, metadata_cache, transport, tasks)
        self.cache = metadata_cache
        self._generate_producer_id = generate_producer_id
        self._periodic: list[Any] = []
        self._running_jobs: set[str] = set()

    def clock(self) -> int:
        return self.time.milliseconds()

    # ------------------------------------------------------------------ life cycle
    def startup(self) -> None:
        self.state.active = True
        self._periodic = [
            self.scheduler.schedule(
                "transaction-abort", lambda: self._run_job(self.abort_timed_out_transactions),
                self.config.abort_timed_out_interval_ms, self.config.abort_timed_out_interval_ms),
            self.scheduler.schedule(
                "transactionalId-expiration", lambda: self._run_job(self.state.remove_expired),
                self.config.remove_expired_interval_ms, self.config.remove_expired_interval_ms),
        ]

    async def shutdown(self) -> None:
        for periodic in self._periodic:
            periodic.cancel()
        await self.state.shutdown()
        await self.markers.close()

    def _spawn(self, coro: Any) -> TaskHandle:
        return self.tasks.spawn(coro)

    def _run_job(self, job: Callable[[], Any]) -> None:
        """A periodic job, skipped while its previous run is still going (appends can take up
        to request.timeout.ms, longer than the period)."""
        name = job.__name__
        if name in self._running_jobs:
            return
        self._running_jobs.add(name)

        async def run() -> None:
            try:
                await job()
            except Exception:
                logger.exception("transaction coordinator task %s failed", name)
            finally:
                self._running_jobs.discard(name)

        self._spawn(run())

    # ------------------------------------------------------------------ InitProducerId
    def validate_timeout(self, timeout_ms: int) -> bool:
        return 0 < timeout_ms <= self.config.max_timeout_ms

    async def handle_init_producer_id(
        self, transactional_id: str, timeout_ms: int,
        expected: tuple[int, int] | None = None,
    ) -> InitProducerIdResult:
        """`expected`: (producer id, epoch) a KIP-360 client sends to bump its own epoch."""
        if not transactional_id:
            return InitProducerIdResult(int(E.INVALID_REQUEST))
        if not self.validate_timeout(timeout_ms):
            return InitProducerIdResult(int(E.INVALID_TRANSACTION_TIMEOUT))
        error, coordinator_epoch, md = self.state.get(transactional_id)
        if error:
            return InitProducerIdResult(error)
        if md is None:
            try:
                producer_id = await self._generate_producer_id()
            except Exception as e:
                logger.warning("allocating a producer id failed: %s", e)
                return InitProducerIdResult(int(E.COORDINATOR_NOT_AVAILABLE))
            error, coordinator_epoch, md = self.state.get(transactional_id)
            if error:
                return InitProducerIdResult(error)
            if md is None:
                md = self.state.put_if_not_exists(TransactionMetadata(
                    transactional_id, producer_id, NO_PRODUCER_ID, NO_PRODUCER_EPOCH,
                    NO_PRODUCER_EPOCH, timeout_ms, S.EMPTY, txn_last_update_timestamp=self.clock()))
        prepared = await self._prepare_init(md, timeout_ms, expected)
        if isinstance(prepared, int):
            return InitProducerIdResult(prepared)
        if prepared.txn_state == S.PREPARE_EPOCH_FENCE:
            # Abort the ongoing transaction under the bumped epoch; the client retries and
            # gets the epoch after that (Kafka never returns the fencing epoch).
            error = await self._end_transaction(transactional_id, prepared.producer_id,
                                                prepared.producer_epoch, commit=False,
                                                from_client=False)
            return InitProducerIdResult(error or int(E.CONCURRENT_TRANSACTIONS))
        error = await self.state.append(transactional_id, coordinator_epoch, prepared)
        if error:
            return InitProducerIdResult(error)
        logger.info("initialized transactional id %s: producer id %d, epoch %d",
                    transactional_id, prepared.producer_id, prepared.producer_epoch)
        return InitProducerIdResult(0, prepared.producer_id, prepared.producer_epoch)

    async def _prepare_init(self, md: TransactionMetadata, timeout_ms: int,
                            expected: tuple[int, int] | None) -> TxnTransitMetadata | int:
        """Kafka's `prepareInitProducerIdTransit`."""
        if md.pending_transition_in_progress:
            return int(E.CONCURRENT_TRANSACTIONS)
        if expected is not None and not (
                md.producer_epoch == NO_PRODUCER_EPOCH or expected[0] == md.producer_id
                or (expected[0] == md.last_producer_id and is_epoch_exhausted(expected[1]))):
            return int(E.PRODUCER_FENCED)
        if md.state in (S.PREPARE_ABORT, S.PREPARE_COMMIT):
            return int(E.CONCURRENT_TRANSACTIONS)
        if md.state == S.ONGOING:
            return md.prepare_fence_producer_epoch()
        if md.state not in (S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT):
            raise IllegalTransitionError(f"{md.transactional_id} found in {md.state.kafka_name}")
        if md.is_producer_epoch_exhausted and (expected is None
                                               or expected[1] == md.producer_epoch):
            try:
                new_id = await self._generate_producer_id()
            except Exception as e:
                logger.warning("allocating a producer id failed: %s", e)
                return int(E.COORDINATOR_NOT_AVAILABLE)
            if md.pending_transition_in_progress:
                return int(E.CONCURRENT_TRANSACTIONS)
            return md.prepare_producer_id_rotation(new_id, timeout_ms, self.clock(),
                                                   expected is not None)
        result = md.prepare_increment_producer_epoch(
            timeout_ms, expected[1] if expected is not None else None, self.clock())
        if isinstance(result, str):
            return int(E.PRODUCER_FENCED)
        return result

    # ------------------------------------------------------------------ AddPartitionsToTxn
    async def handle_add_partitions(self, transactional_id: str, producer_id: int,
                                    producer_epoch: int, partitions: Iterable[TopicPartition]
                                    ) -> int:
        """One error for all partitions (the handler fans it out as Kafka does)."""
        if not transactional_id:
            return int(E.INVALID_REQUEST)
        error, coordinator_epoch, md = self.state.get(transactional_id)
        if error:
            return error
        if md is None:
            return int(E.INVALID_PRODUCER_ID_MAPPING)
        if md.producer_id != producer_id:
            return int(E.INVALID_PRODUCER_ID_MAPPING)
        if md.producer_epoch != producer_epoch:
            return int(E.PRODUCER_FENCED)
        if md.pending_transition_in_progress:
            return int(E.CONCURRENT_TRANSACTIONS)
        if md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return int(E.CONCURRENT_TRANSACTIONS)
        added = set(partitions)
        if md.state == S.ONGOING and added <= md.topic_partitions:
            return 0  # nothing new to write
        transit = md.prepare_add_partitions(added, self.clock())
        return await self.state.append(transactional_id, coordinator_epoch, transit)

    def handle_verify_partitions(self, transactional_id: str, producer_id: int,
                                 producer_epoch: int, partitions: Iterable[TopicPartition]
                                 ) -> dict[TopicPartition, int]:
        """KIP-890 (Kafka's handleVerifyPartitionsInTransaction, AddPartitionsToTxn v4
        verify_only from a partition leader): NONE for each partition in the producer's
        transaction, TRANSACTION_ABORTABLE for the others (as Kafka 3.9 answers; the leader
        tells the producer INVALID_TXN_STATE). A pending transition is not checked: the
        leader's verification guard settles a race with the marker at append."""
        wanted = list(partitions)
        if not transactional_id:
            return dict.fromkeys(wanted, int(E.INVALID_REQUEST))
        error, _, md = self.state.get(transactional_id)
        if not error:
            if md is None or md.producer_id != producer_id:
                error = int(E.INVALID_PRODUCER_ID_MAPPING)
            elif md.producer_epoch != producer_epoch:
                error = int(E.PRODUCER_FENCED)
            elif md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                error = int(E.CONCURRENT_TRANSACTIONS)
            else:
                return {tp: 0 if tp in md.topic_partitions else int(E.TRANSACTION_ABORTABLE)
                        for tp in wanted}
        return dict.fromkeys(wanted, error)

    # ------------------------------------------------------------------ EndTxn
    async def handle_end_transaction(self, transactional_id: str, producer_id: int,
                                     producer_epoch: int, commit: bool) -> int:
        return await self._end_transaction(transactional_id, producer_id, producer_epoch,
                                           commit, from_client=True)

    async def _end_transaction(self, transactional_id: str, producer_id: int,
                               producer_epoch: int, commit: bool, *, from_client: bool) -> int:
        """Kafka's `endTransaction`: PrepareCommit/PrepareAbort written, then the markers."""
        if not transactional_id:
            return int(E.INVALID_REQUEST)
        error, coordinator_epoch, md = self.state.get(transactional_id)
        if error:
            return error
        if md is None or md.producer_id != producer_id:
            return int(E.INVALID_PRODUCER_ID_MAPPING)
        # A client must match the epoch exactly; the coordinator itself aborts at a bumped one.
        if (from_client and producer_epoch != md.producer_epoch) or \
                producer_epoch < md.producer_epoch:
            return int(E.PRODUCER_FENCED)
        if md.pending_transition_in_progress and md.pending_state != S.PREPARE_EPOCH_FENCE:
            return int(E.CONCURRENT_TRANSACTIONS)
        is_epoch_fence = False
        if md.state == S.ONGOING:
            if not commit and md.pending_state == S.PREPARE_EPOCH_FENCE:
                is_epoch_fence = True
                md.pending_state = None
                md.producer_epoch = producer_epoch
                md.last_producer_epoch = NO_PRODUCER_EPOCH
            transit = md.prepare_abort_or_commit(S.PREPARE_COMMIT if commit else S.PREPARE_ABORT,
                                                 self.clock())
        elif md.state == S.COMPLETE_COMMIT:
            return 0 if commit else int(E.INVALID_TXN_STATE)
        elif md.state == S.COMPLETE_ABORT:
            return 0 if not commit else int(E.INVALID_TXN_STATE)
        elif md.state == S.PREPARE_COMMIT:
            return int(E.CONCURRENT_TRANSACTIONS) if commit else int(E.INVALID_TXN_STATE)
        elif md.state == S.PREPARE_ABORT:
            return int(E.CONCURRENT_TRANSACTIONS) if not commit else int(E.INVALID_TXN_STATE)
        elif md.state == S.EMPTY:
            return int(E.INVALID_TXN_STATE)
        else:
            raise IllegalTransitionError(f"{transactional_id} found in {md.state.kafka_name}")
        error = await self.state.append(transactional_id, coordinator_epoch, transit)
        if error:
            if is_epoch_fence and self.state.is_coordinator_at(transactional_id,
                                                               coordinator_epoch):
                md.has_failed_epoch_fence = True
            return error
        # The prepare record is in the log: answer now, complete in the background.
        if md.producer_id != producer_id or md.producer_epoch != producer_epoch:
            return int(E.PRODUCER_FENCED)
        if md.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return int(E.INVALID_TXN_STATE)
        self._start_completion(coordinator_epoch, md)
        return 0

    def _start_completion(self, coordinator_epoch: int, md: TransactionMetadata) -> None:
        commit = md.state == S.PREPARE_COMMIT
        complete = md.prepare_complete(self.clock())
        self._spawn(self._complete(coordinator_epoch, md, commit, complete))

    async def _complete(self, coordinator_epoch: int, md: TransactionMetadata, commit: bool,
                        complete: TxnTransitMetadata) -> None:
        """Send the markers, then write CompleteCommit/CompleteAbort (retried until written
        or the coordinatorship is lost)."""
        txn_id = md.transactional_id

        def still() -> bool:
            return (self.state.is_coordinator_at(txn_id, coordinator_epoch)
                    and self.state.transactions.get(txn_id) is md)

        delivered = await self.markers.deliver(md.producer_id, md.producer_epoch, commit,
                                               coordinator_epoch, md.topic_partitions, still)
        if not delivered:
            return
        while still():
            error = await self.state.append(txn_id, coordinator_epoch, complete)
            if error in (0, E.NOT_COORDINATOR):
                return
            # Kafka retries the complete write on any other error: it must land eventually.
            md.pending_state = complete.txn_state
            await self.tasks.sleep(_COMPLETE_RETRY_MS)

    def _on_loaded(self, partition: int, coordinator_epoch: int,
                   pending: list[TransactionMetadata]) -> None:
        """A loaded partition's prepared transactions are completed by this coordinator."""
        for md in pending:
            if md.pending_transition_in_progress:
                continue
            logger.info("completing %s of %s (producer %d) after loading partition %d",
                        md.state.kafka_name, md.transactional_id, md.producer_id, partition)
            self._start_completion(coordinator_epoch, md)

    # ------------------------------------------------------------------ timeouts
    async def abort_timed_out_transactions(self) -> list[str]:
        """Abort every Ongoing transaction past its timeout under a bumped epoch (Kafka's
        `abortTimedOutTransactions`); returns the ids whose abort was written."""
        aborted: list[str] = []
        for _epoch, md in self.state.timed_out(self.clock()):
            if md.pending_transition_in_progress:
                continue
            fence = md.prepare_fence_producer_epoch()
            logger.info("aborting transaction of %s (producer %d): timed out after %d ms",
                        md.transactional_id, md.producer_id, md.txn_timeout_ms)
            error = await self._end_transaction(md.transactional_id, fence.producer_id,
                                                fence.producer_epoch, commit=False,
                                                from_client=False)
            if error:
                logger.info("timeout abort of %s: error %d", md.transactional_id, error)
                if md.pending_state == S.PREPARE_EPOCH_FENCE:
                    md.abort_pending()
            else:
                aborted.append(md.transactional_id)
        return aborted

    # ------------------------------------------------------------------ describe / list
    def describe(self, transactional_id: str) -> tuple[int, TransactionMetadata | None]:
        error, _epoch, md = self.state.get(transactional_id)
        if error:
            return error, None
        if md is None:
            return int(E.TRANSACTIONAL_ID_NOT_FOUND), None
        return 0, md

    def list_transactions(self, states: set[TransactionState] | None,
                          producer_ids: set[int] | None, min_duration_ms: int
                          ) -> tuple[int, list[TransactionMetadata]]:
        if not self.state.active:
            return int(E.COORDINATOR_NOT_AVAILABLE), []
        if self.state.loading:
            return int(E.COORDINATOR_LOAD_IN_PROGRESS), []
        now = self.clock()
        out = []
        for _epoch, md in self.state.owned_transactions():
            if states is not None and md.state not in states:
                continue
            if producer_ids is not None and md.producer_id not in producer_ids:
                continue
            if md.state == S.DEAD:
                continue  # being expired
            if min_duration_ms >= 0 and now - md.txn_start_timestamp <= min_duration_ms:
                continue
            out.append(md)
        return 0, out
