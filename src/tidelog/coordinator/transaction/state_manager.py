"""`TransactionStateManager`: the transactional ids whose `__transaction_state` partition this
broker leads (Kafka's `TransactionStateManager`).

The coordinator of a transactional id is the leader of partition
`abs(java_string_hash(id)) % transaction.state.log.num.partitions`; its *coordinator epoch* is
that partition's leader epoch, carried by every marker so that partition leaders refuse a
deposed coordinator's. `on_election` loads the partition from the local log (up to its log end
offset, as Kafka does; requests meanwhile get COORDINATOR_LOAD_IN_PROGRESS) and hands the
transactions found half-way (PrepareCommit / PrepareAbort) to `on_loaded`, which completes them;
`on_resignation` drops the partition's ids (NOT_COORDINATOR from then on).

`append` writes one transit with acks=all and applies it only if this broker is still the
coordinator at the same epoch when the write is acknowledged (Kafka's
`appendTransactionToLog`); a failed write drops the pending state.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tidelog.coordinator.group_coordinator import int_config, store_error
from tidelog.coordinator.offsets import partition_for
from tidelog.coordinator.partition_load import DEFAULT_LOAD_RETRY, LoadScan, load_partition
from tidelog.coordinator.transaction.driver import CoordinatorAppender, TaskHandle, TaskRunner
from tidelog.coordinator.transaction.log import (
    TRANSACTION_STATE_TOPIC_NAME,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from tidelog.coordinator.transaction.metadata import (
    TransactionMetadata,
    TransactionState,
    TxnTransitMetadata,
)
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records.builder import Record, build_batch
from tidelog.protocol.records.decoder import decode_records
from tidelog.replication.types import TopicPartition
from tidelog.shell.interfaces import Time

__all__ = ["TransactionConfig", "TransactionStateManager"]

logger = logging.getLogger(__name__)

E = ErrorCode


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    """Kafka's transaction coordinator settings (keys in the comments, Kafka's defaults)."""

    num_partitions: int = 50  # transaction.state.log.num.partitions
    replication_factor: int = 3  # transaction.state.log.replication.factor
    min_isr: int = 2  # transaction.state.log.min.isr
    segment_bytes: int = 100 * 1024 * 1024  # transaction.state.log.segment.bytes
    max_timeout_ms: int = 900_000  # transaction.max.timeout.ms
    abort_timed_out_interval_ms: int = 10_000  # transaction.abort.timed.out.transaction.cleanup.interval.ms
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms
    remove_expired_interval_ms: int = 3_600_000  # transaction.remove.expired.transaction.cleanup.interval.ms
    request_timeout_ms: int = 30_000  # request.timeout.ms (appends and markers)

    @classmethod
    def from_kafka_config(cls, config: Any) -> TransactionConfig:
        def get(key: str, default: int) -> int:
            return int_config(config, key, default)

        d = cls()
        return cls(
            num_partitions=get("transaction.state.log.num.partitions", d.num_partitions),
            replication_factor=get("transaction.state.log.replication.factor",
                                   d.replication_factor),
            min_isr=get("transaction.state.log.min.isr", d.min_isr),
            segment_bytes=get("transaction.state.log.segment.bytes", d.segment_bytes),
            max_timeout_ms=get("transaction.max.timeout.ms", d.max_timeout_ms),
            abort_timed_out_interval_ms=get(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                d.abort_timed_out_interval_ms),
            request_timeout_ms=get("request.timeout.ms", d.request_timeout_ms),
            transactional_id_expiration_ms=get("transactional.id.expiration.ms",
                                               d.transactional_id_expiration_ms),
            remove_expired_interval_ms=get(
                "transaction.remove.expired.transaction.cleanup.interval.ms",
                d.remove_expired_interval_ms),
        )


LoadedCallback = Callable[[int, int, list[TransactionMetadata]], None]


class _LoadedTransactions:
    """The latest transit of each transactional id read from a `__transaction_state` partition
    up to the log end at the load's start (a tombstone removes the id)."""

    def __init__(self) -> None:
        self.found: dict[str, TxnTransitMetadata] = {}
        self.skipped = 0  # records that could not be read (logged, never fatal)

    def add_batch(self, batch: Any, end_offset: int) -> bool:
        if batch.base_offset >= end_offset:
            return False
        if batch.is_control_batch:
            return True
        try:
            records = decode_records(batch)
        except ValueError:
            self.skipped += 1
            return True
        for rec in records:
            if rec.offset >= end_offset or rec.key is None:
                continue
            try:
                txn_id = decode_key(bytes(rec.key))
                value = decode_value(None if rec.value is None else bytes(rec.value))
            except ValueError:
                self.skipped += 1
                continue
            if value is None:
                self.found.pop(txn_id, None)
            else:
                self.found[txn_id] = value
        return True


class TransactionStateManager:
    def __init__(self, broker_id: int, appender: CoordinatorAppender, config: TransactionConfig,
                 time: Time, tasks: TaskRunner) -> None:
        """`appender`: this broker's appends as the coordinator, and the core loads read."""
        self.broker_id = broker_id
        self.appender = appender
        self.config = config
        self.time = time
        self.tasks = tasks
        self.transactions: dict[str, TransactionMetadata] = {}
        self.owned: dict[int, int] = {}  # partition -> coordinator epoch
        self.loading: dict[int, tuple[int, int]] = {}  # partition -> (epoch, load token)
        self._tokens = itertools.count()
        self.load_retry = DEFAULT_LOAD_RETRY
        self._loads: dict[int, TaskHandle] = {}  # partition -> its latest load
        self.on_loaded: LoadedCallback | None = None
        self.active = False

    # ------------------------------------------------------------------ ownership
    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.config.num_partitions)

    def get(self, transactional_id: str) -> tuple[int, int, TransactionMetadata | None]:
        """(error, coordinator epoch, metadata or None when the id is unknown)."""
        if not self.active:
            return int(E.COORDINATOR_NOT_AVAILABLE), -1, None
        p = self.partition_for(transactional_id)
        if p in self.loading:
            return int(E.COORDINATOR_LOAD_IN_PROGRESS), -1, None
        epoch = self.owned.get(p)
        if epoch is None:
            return int(E.NOT_COORDINATOR), -1, None
        return 0, epoch, self.transactions.get(transactional_id)

    def put_if_not_exists(self, metadata: TransactionMetadata) -> TransactionMetadata:
        return self.transactions.setdefault(metadata.transactional_id, metadata)

    def is_coordinator_at(self, transactional_id: str, coordinator_epoch: int) -> bool:
        return (self.active and self.owned.get(self.partition_for(transactional_id))
                == coordinator_epoch)

    def owned_transactions(self) -> Iterator[tuple[int, TransactionMetadata]]:
        """(coordinator epoch, metadata) of every id of a loaded partition."""
        for txn_id, md in self.transactions.items():
            epoch = self.owned.get(self.partition_for(txn_id))
            if epoch is not None:
                yield epoch, md

    def timed_out(self, now_ms: int) -> list[tuple[int, TransactionMetadata]]:
        """Ongoing transactions past their timeout with nothing pending (Kafka's
        `timedOutTransactions`)."""
        return [(epoch, md) for epoch, md in self.owned_transactions()
                if md.state == TransactionState.ONGOING and not md.pending_transition_in_progress
                and md.txn_start_timestamp + md.txn_timeout_ms < now_ms]

    def on_election(self, partition: int, leader_epoch: int) -> None:
        if partition in self.owned:
            if self.owned[partition] != leader_epoch:
                # A new leader epoch while still leader: load again under it, so that markers
                # carry the epoch partition leaders now expect.
                self.on_resignation(partition)
            else:
                return
        if partition in self.loading and self.loading[partition][0] == leader_epoch:
            return
        token = next(self._tokens)
        self.loading[partition] = (leader_epoch, token)
        self._loads[partition] = self.tasks.spawn(self._load(partition, leader_epoch, token))

    def on_resignation(self, partition: int) -> None:
        self.loading.pop(partition, None)
        if self.owned.pop(partition, None) is None:
            return
        for txn_id in [t for t in self.transactions if self.partition_for(t) == partition]:
            del self.transactions[txn_id]
        logger.info("unloaded transaction state partition %d", partition)

    async def shutdown(self) -> None:
        self.active = False
        for partition in list(self.owned) + list(self.loading):
            self.on_resignation(partition)
        for t in list(self._loads.values()):
            t.cancel()
        self._loads.clear()

    async def _load(self, partition: int, leader_epoch: int, token: int) -> None:
        tp = TopicPartition(TRANSACTION_STATE_TOPIC_NAME, partition)
        scan, loaded = await load_partition(
            self.appender.core, tp, lambda: self.loading.get(partition) == (leader_epoch, token),
            _LoadedTransactions, self.load_retry, self.tasks.sleep)
        if scan in (LoadScan.NOT_LEADER, LoadScan.FAILED):
            self.loading.pop(partition, None)
        if scan is not LoadScan.DONE:
            return
        found = loaded.found
        if loaded.skipped:
            logger.warning("transaction state partition %d: %d unreadable records skipped",
                           partition, loaded.skipped)
        pending: list[TransactionMetadata] = []
        for txn_id, transit in found.items():
            if self.partition_for(txn_id) != partition:
                continue
            md = TransactionMetadata.from_transit(txn_id, transit)
            self.transactions[txn_id] = md
            if md.state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
                pending.append(md)
        del self.loading[partition]
        self.owned[partition] = leader_epoch
        logger.info("loaded transaction state partition %d (coordinator epoch %d): %d ids, "
                    "%d to complete", partition, leader_epoch, len(found), len(pending))
        if self.on_loaded is not None and pending:
            self.on_loaded(partition, leader_epoch, pending)

    # ------------------------------------------------------------------ writes
    async def append(self, transactional_id: str, coordinator_epoch: int,
                     transit: TxnTransitMetadata) -> int:
        """Write `transit` (acks=all) and, once acknowledged, apply it to the metadata that
        prepared it. Returns an error code (0 when applied)."""
        md = self.transactions.get(transactional_id)
        if md is None or not self.is_coordinator_at(transactional_id, coordinator_epoch):
            return int(E.NOT_COORDINATOR)
        error = await self._write(transactional_id, coordinator_epoch, md,
                                  encode_value(transit))
        if not error:
            md.complete_transition_to(transit)
        return error

    async def remove_expired(self) -> list[str]:
        """Remove the ids with no transaction whose last update is older than
        `transactional.id.expiration.ms`: a tombstone each, then gone from memory (Kafka's
        `removeExpiredTransactionalIds`). Returns the ids removed."""
        horizon = self.time.milliseconds() - self.config.transactional_id_expiration_ms
        removed = []
        for epoch, md in list(self.owned_transactions()):
            if (md.state not in (TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT,
                                 TransactionState.COMPLETE_ABORT)
                    or md.pending_transition_in_progress
                    or md.txn_last_update_timestamp > horizon):
                continue
            md.prepare_dead()
            if not await self._write(md.transactional_id, epoch, md, None):
                del self.transactions[md.transactional_id]
                removed.append(md.transactional_id)
        return removed

    async def _write(self, transactional_id: str, coordinator_epoch: int,
                     md: TransactionMetadata, value: bytes | None) -> int:
        """Append one record for the id; 0 when acknowledged while this broker is still its
        coordinator at the same epoch with the same metadata (then the caller applies the
        change). A failed write drops the pending state."""
        tp = TopicPartition(TRANSACTION_STATE_TOPIC_NAME, self.partition_for(transactional_id))
        batch = build_batch([Record(key=encode_key(transactional_id), value=value)],
                            now_ms=self.time.milliseconds())
        try:
            results = await self.appender.append({tp: batch}, self.config.request_timeout_ms)
            r = results.get(tp)
            error = store_error(int(r.error)) if r is not None else int(E.UNKNOWN_SERVER_ERROR)
        except Exception as e:
            logger.warning("append to %s failed: %s", tp, e)
            error = int(E.UNKNOWN_SERVER_ERROR)
        still = (self.is_coordinator_at(transactional_id, coordinator_epoch)
                 and self.transactions.get(transactional_id) is md)
        if not still:
            # Deposed (or reloaded) meanwhile: the new coordinator reads the log itself.
            return int(E.NOT_COORDINATOR)
        if error:
            md.abort_pending()
        return error
