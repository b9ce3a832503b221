"""`GroupCoordinator`: the asyncio shell around the pure group state machine (Kafka 2.x's
`GroupCoordinator` + `GroupMetadataManager`).

It owns the groups whose offsets partition (`partition_for(group_id)`) this broker leads:
`on_election(partition, leader_epoch)` loads that partition's offsets and group metadata from
the local log (requests for its groups meanwhile get COORDINATOR_LOAD_IN_PROGRESS);
`on_resignation(partition)` drops them, answering every waiting request NOT_COORDINATOR so that
clients look the coordinator up again.

It performs what `GroupMetadata` decides: waiting JoinGroup / SyncGroup requests are futures
resolved when a decision carries their answer; the leader's assignment (and an emptied group)
is written to `__consumer_offsets` with acks=all before the members get it; a ticker task calls
`tick` at the groups' next deadlines (sessions, the join phase, pending member ids). Committed
offsets are written with acks=all (`offsets.commit.timeout.ms`) and only then become visible to
OffsetFetch. Everything runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tidelog.coordinator.group import (
    GroupDecision,
    GroupMetadata,
    GroupState,
    JoinResult,
    MemberMetadata,
    MemberSummary,
    SyncResult,
)
from tidelog.coordinator.offsets import (
    GROUP_METADATA_TOPIC_NAME,
    GroupMetadataSnapshot,
    LoadedPartition,
    MemberSnapshot,
    OffsetAndMetadata,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    expired_offsets,
    partition_for,
)
from tidelog.coordinator.partition_load import DEFAULT_LOAD_RETRY, LoadScan, load_partition
from tidelog.coordinator.txn_offsets import PendingTxnOffsets
from tidelog.protocol.errors import ErrorCode, error_name
from tidelog.protocol.messages import consumer_protocol_subscription as m_cps
from tidelog.protocol.records.builder import Record, build_batch
from tidelog.replication.types import TopicPartition
from tidelog.storage.producer_state_manager import VerificationGuard
from tidelog.storage.transactions import AppendOrigin

__all__ = ["CoordinatorConfig", "GroupCoordinator"]

logger = logging.getLogger(__name__)

E = ErrorCode
# KIP-890: the transaction verification of an offsets partition: (error, the guard the append
# presents; SENTINEL when the transaction is already open on the partition).
TransactionVerifier = Callable[[TopicPartition], Awaitable[tuple[int, VerificationGuard]]]
# The longest a ticker sleep lasts with nothing due (new deadlines wake it earlier).
_MAX_TICK_S = 0.5


def _wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Kafka's group coordinator settings (keys in the comments, Kafka's defaults)."""

    offsets_topic_num_partitions: int = 50  # offsets.topic.num.partitions
    offsets_topic_replication_factor: int = 3  # offsets.topic.replication.factor
    offsets_topic_segment_bytes: int = 100 * 1024 * 1024  # offsets.topic.segment.bytes
    group_initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    group_min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    group_max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    offsets_commit_timeout_ms: int = 5000  # offsets.commit.timeout.ms
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600_000  # offsets.retention.check.interval.ms

    @classmethod
    def from_kafka_config(cls, config: Any) -> CoordinatorConfig:
        def get(key: str, default: int) -> int:
            return int_config(config, key, default)

        d = cls()
        return cls(
            offsets_topic_num_partitions=get("offsets.topic.num.partitions",
                                             d.offsets_topic_num_partitions),
            offsets_topic_replication_factor=get("offsets.topic.replication.factor",
                                                 d.offsets_topic_replication_factor),
            offsets_topic_segment_bytes=get("offsets.topic.segment.bytes",
                                            d.offsets_topic_segment_bytes),
            group_initial_rebalance_delay_ms=get("group.initial.rebalance.delay.ms",
                                                 d.group_initial_rebalance_delay_ms),
            group_min_session_timeout_ms=get("group.min.session.timeout.ms",
                                             d.group_min_session_timeout_ms),
            group_max_session_timeout_ms=get("group.max.session.timeout.ms",
                                             d.group_max_session_timeout_ms),
            offset_metadata_max_bytes=get("offset.metadata.max.bytes",
                                          d.offset_metadata_max_bytes),
            offsets_commit_timeout_ms=get("offsets.commit.timeout.ms",
                                          d.offsets_commit_timeout_ms),
            offsets_retention_ms=get("offsets.retention.minutes",
                                     d.offsets_retention_ms // 60_000) * 60_000,
            offsets_retention_check_interval_ms=get("offsets.retention.check.interval.ms",
                                                    d.offsets_retention_check_interval_ms),
        )


def int_config(config: Any, key: str, default: int) -> int:
    """A broker key's value as an int (`default` when the config lacks it)."""
    try:
        v = config.get(key)
    except (KeyError, ValueError):
        return default
    return default if v is None else int(v)


def _offset_store_error(error: int) -> int:
    """An append or transaction verification error as OffsetCommit and TxnOffsetCommit report
    it (Kafka's `GroupMetadataManager.maybeConvertOffsetCommitError`)."""
    if error == E.NETWORK_EXCEPTION:
        # a verification that could not reach the transaction coordinator: retried by old
        # clients without a coordinator lookup
        return int(E.COORDINATOR_LOAD_IN_PROGRESS)
    if error in (E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_ENOUGH_REPLICAS,
                 E.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
        return int(E.COORDINATOR_NOT_AVAILABLE)
    if error in (E.NOT_LEADER_OR_FOLLOWER, E.KAFKA_STORAGE_ERROR):
        return int(E.NOT_COORDINATOR)
    if error in (E.MESSAGE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE, E.INVALID_FETCH_SIZE):
        return int(E.INVALID_COMMIT_OFFSET_SIZE)
    return error


def store_error(error: int) -> int:
    """An append error as SyncGroup reports it (Kafka's `GroupMetadataManager.storeGroup`), and
    the transaction coordinator (its `appendTransactionToLog`)."""
    if error in (E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_ENOUGH_REPLICAS,
                 E.NOT_ENOUGH_REPLICAS_AFTER_APPEND, E.REQUEST_TIMED_OUT):
        return int(E.COORDINATOR_NOT_AVAILABLE)
    if error in (E.NOT_LEADER_OR_FOLLOWER, E.KAFKA_STORAGE_ERROR):
        return int(E.NOT_COORDINATOR)
    return int(E.UNKNOWN_SERVER_ERROR) if error else 0


class GroupCoordinator:
    def __init__(
        self,
        broker_id: int,
        replica_manager: Any,
        config: CoordinatorConfig | None = None,
        *,
        clock: Callable[[], int] = _wall_ms,
    ) -> None:
        """`replica_manager`: the broker's `BrokerReplicaManager` (its `core.partition(tp)` and
        `append_records(acks, {tp: batch}, timeout_ms)` are used)."""
        self.broker_id = broker_id
        self.rm = replica_manager
        self.config = config or CoordinatorConfig()
        self.clock = clock
        self.groups: dict[str, GroupMetadata] = {}
        self.offsets: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = {}
        self.owned: dict[int, int] = {}  # loaded offsets partition -> its leader epoch
        # Offsets partition being loaded -> (its leader epoch, the load's token): a load that
        # finds another token there was superseded and stops.
        self.loading: dict[int, tuple[int, int]] = {}
        self._load_tokens = itertools.count()
        self.load_retry = DEFAULT_LOAD_RETRY
        self._waiters: dict[tuple[str, str, str], asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._cleaner: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self.pending_txn = PendingTxnOffsets()  # TxnOffsetCommit offsets awaiting their marker
        self.active = False

    # ------------------------------------------------------------------ life cycle
    def startup(self) -> None:
        loop = asyncio.get_running_loop()
        self._ticker = loop.create_task(self._run_ticker())
        self._cleaner = loop.create_task(self._run_cleaner())
        self.active = True

    async def shutdown(self) -> None:
        self.active = False
        for partition in list(self.owned) + list(self.loading):
            self.on_resignation(partition)
        for task in (self._ticker, self._cleaner):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for t in list(self._tasks):
            t.cancel()
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    # ------------------------------------------------------------------ ownership
    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.config.offsets_topic_num_partitions)

    def coordinator_error(self, group_id: str) -> int:
        """0 when this broker serves `group_id` now, else Kafka's error for why not."""
        if not self.active:
            return int(E.COORDINATOR_NOT_AVAILABLE)
        p = self.partition_for(group_id)
        if p in self.loading:
            return int(E.COORDINATOR_LOAD_IN_PROGRESS)
        if p not in self.owned:
            return int(E.NOT_COORDINATOR)
        return 0

    def on_election(self, partition: int, leader_epoch: int) -> None:
        """This broker became leader of offsets partition `partition`: load it."""
        if self.owned.get(partition) is not None:
            self.owned[partition] = max(self.owned[partition], leader_epoch)
            return
        if partition in self.loading:
            return
        token = next(self._load_tokens)
        self.loading[partition] = (leader_epoch, token)
        self._spawn(self._load(partition, leader_epoch, token))

    def on_resignation(self, partition: int) -> None:
        """This broker no longer leads offsets partition `partition`: drop its groups."""
        self.loading.pop(partition, None)
        if self.owned.pop(partition, None) is None:
            return
        for group_id in [g for g in self.groups if self.partition_for(g) == partition]:
            group = self.groups.pop(group_id)
            self._apply(group, group.mark_dead())
        for group_id in [g for g in self.offsets if self.partition_for(g) == partition]:
            del self.offsets[group_id]
        self.pending_txn.drop_groups(lambda g: self.partition_for(g) == partition)
        logger.info("unloaded offsets partition %d", partition)

    async def _load(self, partition: int, leader_epoch: int, token: int) -> None:
        tp = TopicPartition(GROUP_METADATA_TOPIC_NAME, partition)
        scan, loaded = await load_partition(
            self.rm.core, tp, lambda: self.loading.get(partition) == (leader_epoch, token),
            lambda: LoadedPartition({}, {}), self.load_retry)
        if scan in (LoadScan.NOT_LEADER, LoadScan.FAILED):
            self.loading.pop(partition, None)
        if scan is not LoadScan.DONE:
            return
        if loaded.skipped:
            logger.warning("offsets partition %d: %d unreadable records skipped", partition,
                           loaded.skipped)
        now = self.clock()
        for group_id, offsets in loaded.offsets.items():
            if self.partition_for(group_id) == partition:
                self.offsets[group_id] = offsets
        for producer_id, txn_offsets in loaded.pending_txn.items():
            for key, om in txn_offsets.items():
                if self.partition_for(key.group) == partition:
                    self.pending_txn.add(key.group, producer_id, {(key.topic, key.partition): om})
        for group_id, snap in loaded.groups.items():
            if self.partition_for(group_id) != partition:
                continue
            members = [
                MemberMetadata(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                               m.rebalance_timeout_ms, m.session_timeout_ms, snap.protocol_type,
                               [(snap.protocol_name or "", m.subscription)], m.assignment)
                for m in snap.members
            ]
            self.groups[group_id] = GroupMetadata.loaded(
                group_id, protocol_type=snap.protocol_type, generation_id=snap.generation_id,
                protocol_name=snap.protocol_name, leader_id=snap.leader_id, members=members,
                now_ms=now, initial_rebalance_delay_ms=self.config.group_initial_rebalance_delay_ms)
        del self.loading[partition]
        self.owned[partition] = leader_epoch
        self._kick()
        logger.info("loaded offsets partition %d (epoch %d): %d groups, offsets of %d groups",
                    partition, leader_epoch, len(loaded.groups), len(loaded.offsets))

    # ------------------------------------------------------------------ plumbing
    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _kick(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _wait(self, group_id: str, member_id: str, kind: str) -> asyncio.Future[Any]:
        key = (group_id, member_id, kind)
        old = self._waiters.get(key)
        if old is not None and not old.done():
            # The member asked again (its client gave up on the first request).
            old.set_result(JoinResult(int(E.REBALANCE_IN_PROGRESS), member_id) if kind == "join"
                           else SyncResult(int(E.REBALANCE_IN_PROGRESS)))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[key] = fut
        return fut

    def _resolve(self, group_id: str, member_id: str, kind: str, result: Any) -> None:
        fut = self._waiters.pop((group_id, member_id, kind), None)
        if fut is not None and not fut.done():
            fut.set_result(result)

    def _apply(self, group: GroupMetadata, d: GroupDecision) -> None:
        for mid, jr in d.joins.items():
            self._resolve(group.group_id, mid, "join", jr)
        for mid, sr in d.syncs.items():
            self._resolve(group.group_id, mid, "sync", sr)
        if d.store:
            self._spawn(self._store_group(group, d.store_generation, dict(d.assignment)))
        self._kick()

    async def _await_answer(self, fut: asyncio.Future[Any], timeout_ms: int, error: Any) -> Any:
        done, _ = await asyncio.wait({fut}, timeout=timeout_ms / 1000)
        if not done:
            return error
        result = fut.result()
        return error if result is None else result

    async def _append(self, partition: int, records: list[Record],
                      producer: tuple[int, int] | None = None,
                      verification_guards: Mapping[TopicPartition, VerificationGuard] | None
                      = None) -> int:
        """`producer`: (id, epoch) of the transaction a TxnOffsetCommit belongs to; its batch
        is transactional and appended as the coordinator's (no sequence check, Kafka's
        AppendOrigin.Coordinator), presenting `verification_guards` (KIP-890)."""
        tp = TopicPartition(GROUP_METADATA_TOPIC_NAME, partition)
        if producer is None:
            batch = build_batch(records, now_ms=self.clock())
        else:
            batch = build_batch(records, now_ms=self.clock(), producer_id=producer[0],
                                producer_epoch=producer[1], base_sequence=0, transactional=True)
        try:
            results = await self.rm.append_records(-1, {tp: batch},
                                                   self.config.offsets_commit_timeout_ms,
                                                   origin=AppendOrigin.COORDINATOR,
                                                   verification_guards=verification_guards)
        except Exception as e:
            logger.warning("append to %s failed: %s", tp, e)
            return int(E.UNKNOWN_SERVER_ERROR)
        r = results.get(tp)
        return int(r.error) if r is not None else int(E.UNKNOWN_SERVER_ERROR)

    async def _store_group(self, group: GroupMetadata, generation: int,
                           assignment: dict[str, bytes]) -> None:
        snap = GroupMetadataSnapshot(
            protocol_type=group.protocol_type or "",
            generation_id=generation,
            protocol_name=group.protocol_name,
            leader_id=group.leader_id,
            current_state_timestamp_ms=group.state_timestamp_ms,
            members=tuple(
                MemberSnapshot(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                               m.rebalance_timeout_ms, m.session_timeout_ms,
                               m.metadata(group.protocol_name), assignment.get(m.member_id, b""))
                for m in group.members.values()
            ),
        )
        record = Record(key=encode_group_metadata_key(group.group_id),
                        value=encode_group_metadata_value(snap))
        error = store_error(await self._append(self.partition_for(group.group_id), [record]))
        if error:
            logger.info("group %s: writing generation %d failed: %s", group.group_id, generation,
                        error_name(error))
        if self.groups.get(group.group_id) is group:
            self._apply(group, group.on_store_complete(generation, error, self.clock()))

    async def _run_ticker(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = self.clock()
            next_due: int | None = None
            for group in list(self.groups.values()):
                due = group.next_deadline_ms()
                if due is not None and due <= now:
                    self._apply(group, group.tick(now))
                    due = group.next_deadline_ms()
                if due is not None and (next_due is None or due < next_due):
                    next_due = due
            # Sleep until the next deadline or a change (`_kick`). A plain future, not
            # wait_for: cancelling wait_for can hang in Python 3.11 when the awaited task
            # completes at the same moment. Nothing else runs during the ticks above, so no
            # change is missed by creating it here.
            self._wake = loop.create_future()
            sleep_s = _MAX_TICK_S if next_due is None else min(
                _MAX_TICK_S, max(0.005, (next_due - self.clock()) / 1000))
            timer = loop.call_later(sleep_s, self._kick)
            try:
                await self._wake
            finally:
                timer.cancel()

    async def _run_cleaner(self) -> None:
        """Kafka's `delete-expired-group-metadata` task."""
        while True:
            await asyncio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            try:
                await self.cleanup_group_metadata()
            except Exception as e:  # next round retries; never kills the task
                logger.warning("expiring committed offsets failed: %s", e)

    async def cleanup_group_metadata(self) -> int:
        """Expire committed offsets (`expired_offsets`) with tombstones in the offsets topic,
        and forget Empty groups left with no offsets (a tombstone for their metadata too).
        Returns how many offsets expired."""
        now = self.clock()
        expired_count = 0
        for group_id in list(self.offsets.keys() | self.groups.keys()):
            partition = self.partition_for(group_id)
            if partition not in self.owned:
                continue
            group = self.groups.get(group_id)
            offsets = self.offsets.get(group_id, {})
            empty = group is None or group.state == GroupState.EMPTY
            expired = expired_offsets(
                offsets, group_is_empty=empty,
                has_protocol_type=group is not None and group.protocol_type is not None,
                empty_since_ms=group.state_timestamp_ms if group is not None else now,
                retention_ms=self.config.offsets_retention_ms, now_ms=now)
            drop_group = empty and len(expired) == len(offsets) and group is not None
            if not expired and not drop_group:
                continue
            records = [Record(key=encode_offset_commit_key(group_id, t, p), value=None)
                       for t, p in expired]
            if drop_group:
                records.append(Record(key=encode_group_metadata_key(group_id), value=None))
            epoch = self.owned.get(partition)
            if await self._append(partition, records):
                continue  # not written: try again next round
            if self.owned.get(partition) != epoch:
                continue
            for tp in expired:
                offsets.pop(tp, None)
            if not offsets:
                self.offsets.pop(group_id, None)
            expired_count += len(expired)
            current = self.groups.get(group_id)
            if drop_group and current is group and group.state == GroupState.EMPTY:
                del self.groups[group_id]
                self._apply(group, group.mark_dead())
        if expired_count:
            logger.info("expired %d committed offsets", expired_count)
        return expired_count

    # ------------------------------------------------------------------ JoinGroup
    async def handle_join_group(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        require_known_member_id: bool,
        client_id: str,
        client_host: str,
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
    ) -> JoinResult:
        if not group_id:
            return JoinResult(int(E.INVALID_GROUP_ID), member_id)
        error = self.coordinator_error(group_id)
        if error:
            return JoinResult(error, member_id)
        cfg = self.config
        if not cfg.group_min_session_timeout_ms <= session_timeout_ms <= cfg.group_max_session_timeout_ms:
            return JoinResult(int(E.INVALID_SESSION_TIMEOUT), member_id)
        now = self.clock()
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return JoinResult(int(E.UNKNOWN_MEMBER_ID), member_id)
            group = self.groups[group_id] = GroupMetadata(
                group_id, now, initial_rebalance_delay_ms=cfg.group_initial_rebalance_delay_ms)
        d = group.join(
            member_id=member_id, group_instance_id=group_instance_id, client_id=client_id,
            client_host=client_host, session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms, protocol_type=protocol_type,
            protocols=protocols, require_known_member_id=require_known_member_id,
            new_member_id=f"{client_id}-{uuid.uuid4()}", now_ms=now,
        )
        fut = self._wait(group_id, d.waiter, "join") if d.waiter is not None else None
        self._apply(group, d)
        if d.reply is not None or fut is None:
            assert isinstance(d.reply, JoinResult)
            return d.reply
        # Bounded: the join phase ends by the rebalance timeout (the first one of an Empty
        # group may be extended up to it past the initial delay); a margin on top.
        bound = (max(rebalance_timeout_ms, group.rebalance_timeout_ms)
                 + cfg.group_initial_rebalance_delay_ms + 30_000)
        return await self._await_answer(fut, bound, JoinResult(int(E.REBALANCE_IN_PROGRESS),
                                                               d.waiter or member_id))

    # ------------------------------------------------------------------ SyncGroup
    async def handle_sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
        group_instance_id: str | None = None,
    ) -> SyncResult:
        if not group_id:
            return SyncResult(int(E.INVALID_GROUP_ID))
        error = self.coordinator_error(group_id)
        if error:
            return SyncResult(error)
        group = self.groups.get(group_id)
        if group is None:
            return SyncResult(int(E.UNKNOWN_MEMBER_ID))
        d = group.sync(member_id=member_id, generation_id=generation_id,
                       protocol_type=protocol_type, protocol_name=protocol_name,
                       assignments=dict(assignments), now_ms=self.clock(),
                       group_instance_id=group_instance_id)
        fut = self._wait(group_id, d.waiter, "sync") if d.waiter is not None else None
        self._apply(group, d)
        if d.reply is not None or fut is None:
            assert isinstance(d.reply, SyncResult)
            return d.reply
        bound = group.rebalance_timeout_ms + self.config.offsets_commit_timeout_ms + 30_000
        return await self._await_answer(fut, bound, SyncResult(int(E.REBALANCE_IN_PROGRESS)))

    # ------------------------------------------------------------------ Heartbeat / Leave
    def handle_heartbeat(self, group_id: str, member_id: str, generation_id: int,
                         group_instance_id: str | None = None) -> int:
        if not group_id:
            return int(E.INVALID_GROUP_ID)
        error = self.coordinator_error(group_id)
        if error:
            return error
        group = self.groups.get(group_id)
        if group is None:
            return int(E.UNKNOWN_MEMBER_ID)
        return group.heartbeat(member_id, generation_id, self.clock(), group_instance_id)

    def handle_leave_group(
        self, group_id: str, members: Sequence[str | tuple[str, str | None]]
    ) -> tuple[int, list[int]]:
        """(group-level error, the error of each member in order). A member is a member id or
        (member id, group instance id)."""
        if not group_id:
            return int(E.INVALID_GROUP_ID), []
        error = self.coordinator_error(group_id)
        if error:
            return error, []
        group = self.groups.get(group_id)
        if group is None:
            return 0, [int(E.UNKNOWN_MEMBER_ID)] * len(members)
        errors, d = group.leave(members, self.clock())
        self._apply(group, d)
        return 0, errors

    # ------------------------------------------------------------------ offsets
    async def handle_commit_offsets(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        offsets: Mapping[tuple[str, int], OffsetAndMetadata],
        group_instance_id: str | None = None,
    ) -> dict[tuple[str, int], int]:
        """Commit; an error code per (topic, partition)."""

        def all_(error: int) -> dict[tuple[str, int], int]:
            return {tp: error for tp in offsets}

        error = int(E.INVALID_GROUP_ID) if not group_id else self.coordinator_error(group_id)
        if error:
            return all_(error)
        now = self.clock()
        group = self.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                # A commit from a generation of a group that does not exist (any more).
                return all_(int(E.ILLEGAL_GENERATION))
            group = self.groups[group_id] = GroupMetadata(
                group_id, now, initial_rebalance_delay_ms=self.config.group_initial_rebalance_delay_ms)
        error = group.validate_offset_commit(member_id, generation_id, now, group_instance_id)
        if error:
            return all_(error)
        results, written = await self._store_offsets(group_id, offsets)
        if written:
            self.offsets.setdefault(group_id, {}).update(written)
        return results

    async def _store_offsets(
        self, group_id: str, offsets: Mapping[tuple[str, int], OffsetAndMetadata],
        producer: tuple[int, int] | None = None,
        verification_guards: Mapping[TopicPartition, VerificationGuard] | None = None,
    ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], OffsetAndMetadata]]:
        """Write the offsets whose metadata fits `offset.metadata.max.bytes` to the group's
        offsets partition (in `producer`'s transaction, if given): (an error per partition,
        the offsets written while this broker still owns the partition)."""
        results: dict[tuple[str, int], int] = {}
        records: list[Record] = []
        accepted: dict[tuple[str, int], OffsetAndMetadata] = {}
        for (topic, partition), om in offsets.items():
            if len(om.metadata.encode()) > self.config.offset_metadata_max_bytes:
                results[(topic, partition)] = int(E.OFFSET_METADATA_TOO_LARGE)
                continue
            accepted[(topic, partition)] = om
            records.append(Record(key=encode_offset_commit_key(group_id, topic, partition),
                                  value=encode_offset_commit_value(om)))
        if not records:
            return results, {}
        partition = self.partition_for(group_id)
        epoch = self.owned.get(partition)
        error = _offset_store_error(await self._append(partition, records, producer,
                                                       verification_guards))
        for tp in accepted:
            results[tp] = error
        return results, accepted if not error and self.owned.get(partition) == epoch else {}

    async def handle_txn_commit_offsets(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        offsets: Mapping[tuple[str, int], OffsetAndMetadata],
        verify: TransactionVerifier | None = None,
    ) -> dict[tuple[str, int], int]:
        """TxnOffsetCommit (Kafka's `handleTxnCommitOffsets` / `doTxnCommitOffsets`, KIP-447's
        member checks): the offsets are written in the producer's transaction and become
        visible when its COMMIT marker lands (`handle_txn_completion`). `verify` (KIP-890,
        None when transaction verification is off): asks whether the transaction includes
        the group's offsets partition before the member checks and the append, as Kafka's
        `maybeStartTransactionVerificationForPartition`."""

        def all_(error: int) -> dict[tuple[str, int], int]:
            return {tp: error for tp in offsets}

        error = int(E.INVALID_GROUP_ID) if not group_id else self.coordinator_error(group_id)
        if error:
            return all_(error)
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = GroupMetadata(
                group_id, self.clock(),
                initial_rebalance_delay_ms=self.config.group_initial_rebalance_delay_ms)
        guards: dict[TopicPartition, VerificationGuard] | None = None
        if verify is not None:
            tp = TopicPartition(GROUP_METADATA_TOPIC_NAME, self.partition_for(group_id))
            error, guard = await verify(tp)
            if error:
                return all_(_offset_store_error(error))
            guards = {} if guard is VerificationGuard.SENTINEL else {tp: guard}
        if group.state == GroupState.DEAD:
            return all_(int(E.COORDINATOR_NOT_AVAILABLE))
        if group.is_static_member_fenced(member_id, group_instance_id):
            return all_(int(E.FENCED_INSTANCE_ID))
        if member_id and member_id not in group.members:
            return all_(int(E.UNKNOWN_MEMBER_ID))
        if generation_id >= 0 and generation_id != group.generation_id:
            return all_(int(E.ILLEGAL_GENERATION))
        results, written = await self._store_offsets(group_id, offsets,
                                                     (producer_id, producer_epoch), guards)
        if written:
            self.pending_txn.add(group_id, producer_id, written)
        return results

    def handle_txn_completion(self, producer_id: int, partitions: set[int], commit: bool) -> None:
        """A COMMIT/ABORT marker of `producer_id` was written to these offsets partitions:
        its transactional offsets become committed, or are dropped (Kafka's
        `GroupMetadataManager.handleTxnCompletion`)."""
        done = self.pending_txn.complete(
            producer_id, lambda g: self.partition_for(g) in partitions, commit)
        for group_id, offsets in done.items():
            self.offsets.setdefault(group_id, {}).update(offsets)

    def handle_fetch_offsets(
        self, group_id: str, partitions: Sequence[tuple[str, int]] | None
    ) -> tuple[int, dict[tuple[str, int], OffsetAndMetadata | None]]:
        """(error, committed offset per partition; None = nothing committed). `partitions`
        None: every partition the group committed."""
        error = self.coordinator_error(group_id)
        if error:
            return error, {}
        stored = self.offsets.get(group_id, {})
        if partitions is None:
            return 0, dict(stored)
        return 0, {tp: stored.get(tp) for tp in partitions}

    # ------------------------------------------------------------------ DeleteGroups / OffsetDelete
    def _group_status_error(self, group_id: str | None, *, allow_empty: bool) -> int:
        """Kafka's `validateGroupStatus` (DeleteGroups accepts the empty group id, OffsetDelete
        does not)."""
        if group_id is None or (not group_id and not allow_empty):
            return int(E.INVALID_GROUP_ID)
        return self.coordinator_error(group_id)

    async def handle_delete_groups(self, group_ids: Sequence[str]) -> dict[str, int]:
        """Kafka's `handleDeleteGroups`: an Empty group (or one with only committed offsets) is
        removed with its offsets, and tombstones for them and for its metadata are appended to
        its offsets partition; a group with members is NON_EMPTY_GROUP, an unknown or Dead one
        GROUP_ID_NOT_FOUND."""
        errors: dict[str, int] = {}
        deleted: list[str] = []
        for group_id in group_ids:
            error = self._group_status_error(group_id, allow_empty=True)
            if error:
                errors[group_id] = error
                continue
            group = self.groups.get(group_id)
            if group is None or group.state == GroupState.DEAD:
                if group is None and group_id in self.offsets:
                    deleted.append(group_id)  # offsets only: a group using Kafka for storage
                else:
                    errors[group_id] = int(E.GROUP_ID_NOT_FOUND)
            elif group.state == GroupState.EMPTY:
                deleted.append(group_id)
            else:
                errors[group_id] = int(E.NON_EMPTY_GROUP)
        for group_id in deleted:
            group = self.groups.pop(group_id, None)
            offsets = self.offsets.pop(group_id, {})
            records = [Record(key=encode_offset_commit_key(group_id, t, p), value=None)
                       for t, p in offsets]
            if group is not None:
                records += self._bury(group)
            await self._write_tombstones(group_id, records)
            errors[group_id] = 0
        if deleted:
            logger.info("deleted groups %s", ", ".join(deleted))
        return errors

    def _bury(self, group: GroupMetadata) -> list[Record]:
        """Mark a removed group Dead; the tombstone of its metadata record, if it has one (Kafka
        writes none for a group that never had a generation: offsets storage only)."""
        self._apply(group, group.mark_dead())
        if group.generation_id > 0:
            return [Record(key=encode_group_metadata_key(group.group_id), value=None)]
        return []

    async def _write_tombstones(self, group_id: str, records: list[Record]) -> None:
        """Append a group's tombstones to its offsets partition. One lost here only leaves the
        group to be loaded again by the next leader, as in Kafka (which does not wait for
        replication either way)."""
        if not records:
            return
        error = await self._append(self.partition_for(group_id), records)
        if error:
            logger.warning("group %s: writing its tombstones failed: %s", group_id,
                           error_name(error))

    async def handle_delete_offsets(
        self, group_id: str, partitions: Sequence[tuple[str, int]]
    ) -> tuple[int, dict[tuple[str, int], int]]:
        """Kafka's `handleDeleteOffsets`: (group error, error per partition). An Empty group
        loses the offsets asked for; a consumer group with members keeps those of the topics it
        subscribes to (GROUP_SUBSCRIBED_TO_TOPIC) and loses the others; any other group with
        members is NON_EMPTY_GROUP. Tombstones go to the offsets partition. An Empty group left
        without offsets is gone with them (Kafka's cleanupGroupMetadata)."""
        error = self._group_status_error(group_id, allow_empty=False)
        if error:
            return error, {}
        group = self.groups.get(group_id)
        if group is None and group_id in self.offsets:
            eligible = list(partitions)
            results: dict[tuple[str, int], int] = {}
        elif group is None or group.state == GroupState.DEAD:
            return int(E.GROUP_ID_NOT_FOUND), {}
        elif group.state == GroupState.EMPTY:
            eligible, results = list(partitions), {}
        elif group.protocol_type == "consumer":
            subscribed = subscribed_topics(group)
            eligible = [tp for tp in partitions
                        if subscribed is not None and tp[0] not in subscribed]
            results = {tp: int(E.GROUP_SUBSCRIBED_TO_TOPIC) for tp in partitions
                       if tp not in eligible}
        else:
            return int(E.NON_EMPTY_GROUP), {}
        offsets = self.offsets.get(group_id, {})
        removed = [tp for tp in eligible if offsets.pop(tp, None) is not None]
        if not offsets:
            self.offsets.pop(group_id, None)
        records = [Record(key=encode_offset_commit_key(group_id, t, p), value=None)
                   for t, p in removed]
        if group is not None and group.state == GroupState.EMPTY and not offsets:
            # Kafka's cleanupGroupMetadata: an Empty group left without offsets is Dead, and
            # its metadata goes too (when it had a generation).
            del self.groups[group_id]
            records += self._bury(group)
        await self._write_tombstones(group_id, records)
        for tp in eligible:
            results[tp] = 0
        return 0, results

    # ------------------------------------------------------------------ ListGroups / DescribeGroups
    def handle_list_groups(self) -> tuple[int, list[tuple[str, str, str]]]:
        """(error, [(group id, protocol type, state)]) for the groups coordinated here."""
        if not self.active:
            return int(E.COORDINATOR_NOT_AVAILABLE), []
        if self.loading:  # Kafka answers nothing until every partition here is loaded
            return int(E.COORDINATOR_LOAD_IN_PROGRESS), []
        return 0, [(g.group_id, g.protocol_type or "", g.state.value)
                   for g in self.groups.values() if g.state != GroupState.DEAD]

    def handle_describe_group(
        self, group_id: str
    ) -> tuple[int, tuple[str, str, str, list[MemberSummary]]]:
        error = self.coordinator_error(group_id)
        if error:
            return error, ("", "", "", [])
        group = self.groups.get(group_id)
        if group is None:
            return 0, (GroupState.DEAD.value, "", "", [])
        return 0, group.summary()


def subscribed_topics(group: GroupMetadata) -> set[str] | None:
    """Kafka's `GroupMetadata.computeSubscribedTopics`: the topics the members of a consumer
    group subscribe to, from their metadata for the chosen protocol; None when it cannot be
    known (not a consumer group, no protocol chosen, unreadable metadata): then every topic
    counts as subscribed."""
    if group.protocol_type != "consumer" or group.protocol_name is None:
        return None
    topics: set[str] = set()
    for member in group.members.values():
        data = member.metadata(group.protocol_name)
        try:
            if len(data) < 2:
                return None
            version = min(int.from_bytes(data[:2], "big", signed=True), 3)
            if version < 0:
                return None
            sub, _ = m_cps.decode_data(version, data, 2)
        except Exception:  # noqa: BLE001 - Kafka treats any unreadable subscription alike
            return None
        topics.update(sub.topics)
    return topics
