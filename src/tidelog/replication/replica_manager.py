"""ReplicaManager: the replication state of one broker, pure (seed 004).

A dict of ``Partition`` objects over the ``Log`` objects of a ``LogManager``, answering the
controller (LeaderAndIsr, StopReplica), producers (Produce), followers and consumers (Fetch,
OffsetsForLeaderEpoch, ListOffsets), plus the periodic tasks' logic (``isr-expiration``:
``maybe_shrink_isr``; ``highwatermark-checkpoint``: ``high_watermarks``). The shell decides when
things run and carries out the returned actions: ISR proposals for the controller (AlterPartition,
KIP-497: it writes them and announces them to every broker), fetcher changes, and the
completions of delayed produce/fetch requests (``poll_completed``).

Delayed operations are re-checked whenever a partition's LEO, HW, ISR or role changes (seed 000's
``tryCompleteDelayedRequests``); completions queue up and ``poll_completed(now_ms)`` returns them
together with the requests that timed out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidelog.protocol.records.batch import CorruptRecordError
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors, ReplicationError
from tidelog.replication.fetcher import FetchRequest
from tidelog.replication.follower_joins import FollowerJoins
from tidelog.replication.isr_policy import policy_for
from tidelog.replication.partition import Partition
from tidelog.replication.purgatory import (
    DelayedFetch,
    DelayedOperationPurgatory,
    DelayedProduce,
    FetchParams,
    FetchPartitionStatus,
    ProducePartitionStatus,
)
from tidelog.replication.replication_quota import should_throttle
from tidelog.replication.types import (
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    AddFetcher,
    CompleteFetch,
    Completion,
    EpochEndOffset,
    FetcherAction,
    FetchPartitionData,
    LeaderAndIsrPartitionState,
    ListOffsetsPartitionResult,
    ProducePartitionResult,
    ProposeIsr,
    RemoveFetcher,
    TopicPartition,
)
from tidelog.storage.epoch_cache import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from tidelog.storage.errors import OffsetOutOfRangeError, StorageError
from tidelog.storage.producer_state_manager import VerificationGuard
from tidelog.storage.transactions import AppendOrigin


@dataclass(frozen=True, slots=True)
class LeaderAndIsrResult:
    error: Errors
    partition_errors: dict[TopicPartition, Errors] = field(default_factory=dict)
    fetcher_actions: list[FetcherAction] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StopReplicaResult:
    error: Errors
    partition_errors: dict[TopicPartition, Errors] = field(default_factory=dict)
    fetcher_actions: list[FetcherAction] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ProduceOutcome:
    results: dict[TopicPartition, ProducePartitionResult] | None
    delayed: bool = False


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    results: dict[TopicPartition, FetchPartitionData] | None
    delayed: bool = False
    isr_proposals: tuple[ProposeIsr, ...] = ()


def _max_timestamp_batch(log: Any, start: int, limit: int) -> tuple[int, int] | None:
    """ListOffsets MAX_TIMESTAMP (KIP-734): (base offset, max timestamp) of the first batch
    below `limit` holding the largest timestamp, None when there is none."""
    best: tuple[int, int] | None = None
    for b in log.batches(start):
        if b.base_offset >= limit:
            break
        if best is None or b.max_timestamp > best[1]:
            best = (b.base_offset, b.max_timestamp)
    return best


def _error_of(exc: BaseException) -> Errors:
    if isinstance(exc, ReplicationError):
        return exc.error
    if isinstance(exc, CorruptRecordError):
        return Errors.CORRUPT_MESSAGE
    code = getattr(exc, "error_code", None)
    try:
        return Errors(code) if code is not None else Errors.UNKNOWN_SERVER_ERROR
    except ValueError:
        return Errors.UNKNOWN_SERVER_ERROR


def _as_bytes(records: Any) -> Any:
    # A view of a mutable buffer (one the log could change later) is copied before it leaves
    # here; a view of the immutable bytes a read returned (every FileHandle's read) and a
    # FileSlice (sendfile) pass through (no second copy of a fetch answer under the sendfile
    # size before the socket write).
    if type(records) is memoryview:
        return records if type(records.obj) is bytes else bytes(records)
    return bytes(records) if type(records) is bytearray else records


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        log_manager: Any,
        config: ReplicationConfig | None = None,
        *,
        broker_epoch: int = 0,
    ) -> None:
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self.log_manager = log_manager
        self.config = config or ReplicationConfig()
        self.controller_epoch = -1
        self.partitions: dict[TopicPartition, Partition] = {}
        # Partitions whose log failed during a role change: offline on this broker until it
        # restarts (Kafka takes the log dir offline), answering KAFKA_STORAGE_ERROR.
        self.offline_partitions: set[TopicPartition] = set()
        self._eligible: Mapping[int, int] | None = None
        self.produce_purgatory = DelayedOperationPurgatory("Produce")
        self.fetch_purgatory = DelayedOperationPurgatory("Fetch")
        self._completed: list[Completion] = []
        # An ordered set: the order partitions are re-checked in decides the order delayed
        # requests complete, which must not depend on string hashing (the simulator replays).
        self._dirty: dict[TopicPartition, None] = {}
        # Told of every partition that changed (records, HW, leadership, ISR, log start, a
        # follower's log start): the broker's fetch sessions read only those
        # (broker/fetch_session.py) and its DeleteRecords waiters re-check only those.
        self.partition_listeners: list[Callable[[TopicPartition], None]] = []
        # Followers joining partitions this broker just came to lead (follower_joins.py): their
        # held fetches are answered at once, and the broker's session fetches told through
        # on_followers_joining ({replica id: its new partitions}).
        self.follower_joins = FollowerJoins(self.config.replica_lag_time_max_ms)
        self.on_followers_joining: Callable[[Mapping[int, list[TopicPartition]]], None] | None \
            = None
        # tp -> the partition state in which every delayed produce watched on it was last tried
        self._produce_checked: dict[TopicPartition, tuple[Any, ...]] = {}
        self._draining = False

    # ------------------------------------------------------------------ lookups
    def partition(self, tp: TopicPartition) -> Partition | None:
        return self.partitions.get(tp)

    def _missing_error(self, tp: TopicPartition) -> Errors:
        if tp in self.offline_partitions:
            return Errors.KAFKA_STORAGE_ERROR
        return Errors.UNKNOWN_TOPIC_OR_PARTITION

    def _mark_offline(self, tp: TopicPartition, actions: list[FetcherAction]) -> None:
        """Stop hosting ``tp``: it neither leads, follows nor proposes ISR changes any more, so a
        half-failed role change can never act on ZooKeeper in a stale epoch."""
        self.partitions.pop(tp, None)
        self.offline_partitions.add(tp)
        actions.append(RemoveFetcher(tp))

    def logs_for_fetcher(self, tp: TopicPartition) -> Any:
        """The ``logs`` callable for ``ReplicaFetcher``: the log of a local follower, else None."""
        p = self.partitions.get(tp)
        return p.log if p is not None and not p.is_leader else None

    def leader_partitions(self) -> list[Partition]:
        return [p for p in self.partitions.values() if p.is_leader]

    def set_eligible_brokers(self, brokers: Mapping[int, int] | None) -> None:
        """Live, unfenced brokers and their broker epochs (KIP-841/903); None: all eligible."""
        self._eligible = dict(brokers) if brokers is not None else None

    def is_stale_broker_epoch(self, broker_epoch: int | None) -> bool:
        """KIP-380: a control request addressed to an earlier registration of this broker (None:
        the request carries no broker epoch). A newer epoch is fine: the controller may see the
        registration before the broker does."""
        return broker_epoch is not None and broker_epoch < self.broker_epoch

    def update_metadata(self, broker_epoch: int | None,
                        eligible_brokers: Mapping[int, int] | None) -> Errors:
        """UpdateMetadata's part for replication: the brokers that may join an ISR."""
        if self.is_stale_broker_epoch(broker_epoch):
            return Errors.STALE_BROKER_EPOCH
        self.set_eligible_brokers(eligible_brokers)
        return Errors.NONE

    def _is_replica_eligible(self, broker_id: int, broker_epoch: int | None) -> bool:
        """KIP-841: a live broker; KIP-903 (Kafka's isBrokerEpochIsrEligible): its last fetch
        came from its current registration, when both epochs are known. A fetch from a newer
        registration than the metadata names counts too (broker epochs, czxids, only grow: it
        re-registered since, and this fetch is its current process's); the controller checks
        the member's epoch against its registration on AlterPartition."""
        if self._eligible is None:
            return True
        epoch = self._eligible.get(broker_id)
        if epoch is None:
            return False
        return broker_epoch is None or epoch < 0 or broker_epoch >= epoch

    def _get_or_create_partition(self, tp: TopicPartition, is_new: bool) -> Partition:
        p = self.partitions.get(tp)
        if p is None:
            # Its HW is the checkpointed one the LogManager loaded with it.
            log = self.log_manager.get_or_create_log(tp.topic, tp.partition, is_new=is_new)
            p = Partition(
                tp, self.broker_id, log, self.config,
                policy=policy_for(self.config), is_replica_eligible=self._is_replica_eligible,
                local_broker_epoch=lambda: self.broker_epoch,
            )
            self.partitions[tp] = p
        return p

    # ------------------------------------------------------------------ controller requests
    def become_leader_or_follower(
        self,
        controller_id: int,
        controller_epoch: int,
        partition_states: Iterable[LeaderAndIsrPartitionState],
        live_leaders: Collection[int],
        now_ms: int,
        broker_epoch: int | None = None,
    ) -> LeaderAndIsrResult:
        """``broker_epoch``: the epoch of this broker's registration the controller addressed
        (KIP-380); a request meant for an earlier registration is refused."""
        if controller_epoch < self.controller_epoch:
            return LeaderAndIsrResult(Errors.STALE_CONTROLLER_EPOCH)
        if self.is_stale_broker_epoch(broker_epoch):
            return LeaderAndIsrResult(Errors.STALE_BROKER_EPOCH)
        self.controller_epoch = controller_epoch
        errors: dict[TopicPartition, Errors] = {}
        actions: list[FetcherAction] = []
        for state in partition_states:
            tp = state.tp
            if self.broker_id not in state.replicas:
                errors[tp] = Errors.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if tp in self.offline_partitions:
                errors[tp] = Errors.KAFKA_STORAGE_ERROR
                continue
            try:
                p = self._get_or_create_partition(tp, state.is_new)
            except StorageError as e:
                errors[tp] = _error_of(e)
                continue
            if state.leader_epoch < p.leader_epoch or (
                state.leader_epoch == p.leader_epoch and state.zk_version <= p.zk_version
            ):
                errors[tp] = Errors.STALE_CONTROLLER_EPOCH
                continue
            errors[tp] = Errors.NONE
            self._dirty[tp] = None
            try:
                if state.leader_epoch == p.leader_epoch:
                    p.update_assignment(state)  # same epoch, newer zk version: AR/ISR only
                elif state.leader == self.broker_id:
                    p.make_leader(state, now_ms)
                    actions.append(RemoveFetcher(tp))
                    self.follower_joins.started(tp, p.remote_replicas, now_ms)
                else:
                    changed = p.make_follower(state, now_ms)
                    if state.leader not in live_leaders:
                        actions.append(RemoveFetcher(tp))  # wait for a live leader
                    elif changed:
                        actions.append(RemoveFetcher(tp))
                        # Start from the HW, in Truncating: the fetcher finds the real
                        # truncation point (KIP-101/279) or truncates to it (pre-KIP-101).
                        actions.append(
                            AddFetcher(tp, state.leader, p.high_watermark, state.leader_epoch)
                        )
            except StorageError as e:
                errors[tp] = _error_of(e)
                self._mark_offline(tp, actions)
        self._wake_joining_followers(now_ms)
        self._drain(now_ms)
        return LeaderAndIsrResult(Errors.NONE, errors, actions)

    def _wake_joining_followers(self, now_ms: int) -> None:
        """Answer now the held fetches of followers that just got a partition here which those
        fetches do not name: their next fetch can carry it (follower_joins.py)."""
        started = self.follower_joins.take_started()
        if not started:
            return

        def lacks_new(op: Any) -> bool:
            if not isinstance(op, DelayedFetch):
                return False
            new = started.get(op.params.replica_id)
            return new is not None and any(tp not in op.params.partitions for tp in new)

        self._completed.extend(self.fetch_purgatory.force_complete(lacks_new, now_ms))
        if self.on_followers_joining is not None:
            self.on_followers_joining(started)

    def leads_for(self, tp: TopicPartition, replica_id: int) -> bool:
        """This broker leads ``tp`` and ``replica_id`` replicates it."""
        p = self.partitions.get(tp)
        return p is not None and p.is_leader and replica_id in p.remote_replicas

    def follower_fetch_wait_ms(self, replica_id: int, max_wait_ms: int,
                               fetching: Container[TopicPartition], now_ms: int) -> int:
        """How long to hold a fetch about to wait (follower_joins.py): ``max_wait_ms``, or a
        slice of it while ``replica_id`` joins a partition ``fetching`` lacks."""
        if replica_id < 0:
            return max_wait_ms
        return self.follower_joins.fetch_wait_ms(replica_id, max_wait_ms, fetching,
                                                 self.leads_for, now_ms)

    def stop_replicas(
        self,
        controller_id: int,
        controller_epoch: int,
        partitions: Mapping[TopicPartition, bool],
        now_ms: int,
        broker_epoch: int | None = None,
    ) -> StopReplicaResult:
        """``{tp: delete}``: stop fetching; with delete, drop the partition and its log."""
        if controller_epoch < self.controller_epoch:
            return StopReplicaResult(Errors.STALE_CONTROLLER_EPOCH)
        if self.is_stale_broker_epoch(broker_epoch):
            return StopReplicaResult(Errors.STALE_BROKER_EPOCH)
        self.controller_epoch = controller_epoch
        errors: dict[TopicPartition, Errors] = {}
        actions: list[FetcherAction] = []
        for tp, delete in partitions.items():
            if tp in self.offline_partitions:
                # Kafka ignores it: the log is in an offline dir, its files cannot be deleted
                # (a topic deletion waits for the broker's restart, as Kafka's controller does).
                errors[tp] = Errors.KAFKA_STORAGE_ERROR
                continue
            actions.append(RemoveFetcher(tp))
            errors[tp] = Errors.NONE
            if delete:
                self.partitions.pop(tp, None)
                try:
                    self.log_manager.delete_log(tp.topic, tp.partition, now_ms)
                except StorageError as e:
                    errors[tp] = _error_of(e)
            self._dirty[tp] = None
        self._drain(now_ms)
        return StopReplicaResult(Errors.NONE, errors, actions)

    def handle_log_dir_failure(self, log_dir: str, now_ms: int) -> list[FetcherAction]:
        """Kafka's ReplicaManager.handleLogDirFailure, the replication part: every partition
        whose log is in ``log_dir`` goes offline (no fetcher, no leadership, no ISR proposal;
        requests for it answer KAFKA_STORAGE_ERROR, delayed ones waiting on it complete so),
        then the LogManager takes the dir offline. Telling the controller and halting when no
        dir is left are the shell's."""
        actions: list[FetcherAction] = []
        for tp in sorted(self.partitions):
            if self.log_manager.log_dir_of.get(tp) == log_dir:
                self._mark_offline(tp, actions)
                self._dirty[tp] = None
        self.log_manager.handle_log_dir_failure(log_dir)
        self._drain(now_ms)
        return actions

    # ------------------------------------------------------------------ produce
    def append_records(
        self,
        acks: int,
        entries_per_partition: Mapping[TopicPartition, Any],
        timeout_ms: int,
        now_ms: int,
        request_key: Hashable | None = None,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        verification_guards: Mapping[TopicPartition, VerificationGuard] | None = None,
    ) -> ProduceOutcome:
        """``verification_guards`` (KIP-890): None, no verification required; else each
        partition's transactional batches need the guard given for it (SENTINEL if none)."""
        if acks not in (-1, 0, 1):
            return ProduceOutcome(
                {tp: ProducePartitionResult(Errors.INVALID_REQUIRED_ACKS) for tp in entries_per_partition}
            )
        results: dict[TopicPartition, ProducePartitionResult] = {}
        required: dict[TopicPartition, int] = {}
        for tp, records in entries_per_partition.items():
            p = self.partitions.get(tp)
            if p is None:
                results[tp] = ProducePartitionResult(self._missing_error(tp))
                continue
            try:
                info = p.append_records_to_leader(
                    records, acks, now_ms, origin, None if verification_guards is None
                    else verification_guards.get(tp, VerificationGuard.SENTINEL))
            except (ReplicationError, StorageError, CorruptRecordError) as e:
                results[tp] = ProducePartitionResult(_error_of(e))
                continue
            if info.valid_bytes == 0:  # nothing to append (empty records): Kafka answers offset -1
                results[tp] = ProducePartitionResult(Errors.NONE, -1, p.log_start_offset)
                continue
            results[tp] = ProducePartitionResult(
                Errors.NONE, info.first_offset, p.log_start_offset, info.log_append_time
            )
            required[tp] = info.last_offset + 1
            self._dirty[tp] = None
        outcome = ProduceOutcome(results)
        if acks == -1 and required:
            if request_key is None:
                raise ValueError("append_records(acks=-1) needs a request_key to answer later")
            statuses = {
                tp: ProducePartitionStatus(required.get(tp, -1), result, tp in required)
                for tp, result in results.items()
            }
            op = DelayedProduce(request_key, now_ms + timeout_ms, statuses, self._check_replicas)
            done = self.produce_purgatory.try_complete_else_watch(op, now_ms)
            outcome = (
                ProduceOutcome(dict(done.results)) if done is not None  # type: ignore[union-attr]
                else ProduceOutcome(None, delayed=True)
            )
        self._drain(now_ms)
        return outcome

    def _check_replicas(self, tp: TopicPartition, required_offset: int) -> tuple[bool, Errors]:
        p = self.partitions.get(tp)
        if p is None:  # Kafka's getPartitionOrError: an offline partition's log dir failed
            return True, (Errors.KAFKA_STORAGE_ERROR if tp in self.offline_partitions
                          else Errors.NOT_LEADER_OR_FOLLOWER)
        return p.check_enough_replicas_reach_offset(required_offset)

    # ------------------------------------------------------------------ fetch
    def fetch_messages(
        self,
        replica_id: int,
        fetch_max_wait_ms: int,
        fetch_min_bytes: int,
        fetch_max_bytes: int,
        partitions: Mapping[TopicPartition, tuple[int, ...]],
        now_ms: int,
        request_key: Hashable | None = None,
        broker_epoch: int | None = None,
        isolation_level: int = READ_UNCOMMITTED,
        fetch_only_leader: bool = True,
    ) -> FetchOutcome:
        """``isolation_level`` READ_COMMITTED: a consumer reads up to the LSO and gets the
        aborted transactions overlapping what it read (KIP-98). ``fetch_only_leader`` False: a
        consumer's Fetch v11+, which a follower answers too, up to its own HW (KIP-392); a
        fetch held at a follower completes when its wait ends."""
        params = FetchParams(
            replica_id, fetch_max_wait_ms, fetch_min_bytes, fetch_max_bytes, broker_epoch,
            {tp: FetchPartitionStatus(*args) for tp, args in partitions.items()},
            isolation_level, fetch_only_leader,
        )
        results, proposals, read_bytes, any_error = self._read_from_local_log(params, now_ms)
        if (
            fetch_max_wait_ms <= 0
            or not partitions
            or read_bytes >= fetch_min_bytes
            or any_error
            or request_key is None
        ):
            self._drain(now_ms)
            return FetchOutcome(results, False, tuple(proposals))
        # What this fetch's read changed (a follower's fetch state: the HW, the low watermark)
        # is re-checked before the fetch is watched, as Kafka's fetchMessages completes delayed
        # requests inside the read and only then calls tryCompleteElseWatch: watched first, the
        # fetch was tried again for each partition it changed, each try reading all of them
        # (a restarted follower's first fetch of N partitions: N^2 partition reads).
        self._drain(now_ms)
        wait_ms = self.follower_fetch_wait_ms(replica_id, fetch_max_wait_ms, params.partitions,
                                              now_ms)
        op = DelayedFetch(
            request_key, now_ms + wait_ms, params, self._readable_bytes, self._complete_fetch
        )
        done = self.fetch_purgatory.try_complete_else_watch(op, now_ms)
        self._drain(now_ms)
        if done is not None:
            assert isinstance(done, CompleteFetch)
            return FetchOutcome(dict(done.results), False, tuple(proposals) + done.isr_proposals)
        return FetchOutcome(None, True, tuple(proposals))

    def fetch(self, request: FetchRequest, now_ms: int, request_key: Hashable | None = None) -> FetchOutcome:
        """Serve a follower's ``FetchRequest`` dataclass (the simulator's shortcut)."""
        return self.fetch_messages(
            request.replica_id, request.max_wait_ms, request.min_bytes, request.max_bytes,
            request.fetch_args(), now_ms, request_key, request.broker_epoch,
        )

    def _leader_partition(self, tp: TopicPartition, current_leader_epoch: int,
                          require_leader: bool = True) -> Partition:
        """Kafka's localLogWithEpochOrThrow: the epoch checked, then (if required) the lead."""
        p = self.partitions.get(tp)
        if p is None:
            raise ReplicationError(self._missing_error(tp), str(tp))
        error = p.check_current_leader_epoch(current_leader_epoch)
        if error != Errors.NONE:
            raise ReplicationError(error, f"{tp}: request epoch {current_leader_epoch}, ours {p.leader_epoch}")
        if require_leader and not p.is_leader:
            raise ReplicationError(Errors.NOT_LEADER_OR_FOLLOWER, str(tp))
        return p

    @staticmethod
    def _diverging_epoch(p: Partition, st: FetchPartitionStatus,
                         log_start: int) -> tuple[int, int] | None:
        """Kafka's Partition.readRecords with a last fetched epoch (KIP-320/595): (the largest
        epoch <= the fetcher's last fetched epoch in this log, its end offset) when that epoch
        is older or ends before the fetch offset: the fetcher's log diverges from this one
        there. An epoch this log cannot place, or a fetch offset below the log start, is
        OFFSET_OUT_OF_RANGE (whether or not the epochs diverge)."""
        epoch, end_offset = p.log.end_offset_for_epoch(st.last_fetched_epoch)
        if epoch == UNDEFINED_EPOCH or end_offset == UNDEFINED_EPOCH_OFFSET \
                or st.fetch_offset < log_start:
            raise OffsetOutOfRangeError(st.fetch_offset, log_start, p.log_end_offset)
        if epoch < st.last_fetched_epoch or end_offset < st.fetch_offset:
            return epoch, end_offset
        return None

    def _read_from_local_log(
        self, params: FetchParams, now_ms: int, update_fetch_state: bool = True
    ) -> tuple[dict[TopicPartition, FetchPartitionData], list[ProposeIsr], int, bool]:
        """Read every partition; for a follower, record its fetch (ISR expand, HW) unless
        ``update_fetch_state`` is off (a held fetch completing: Kafka's DelayedFetch)."""
        is_follower = params.replica_id >= 0
        # Kafka's debugging replica id: any replica (leader or follower) answers with its own
        # HW (tools read a follower's HW this way), reading as a consumer does, up to that HW
        # (Kafka's FetchIsolation.of: -2 is a consumer id).
        debugging = params.replica_id == DEBUGGING_REPLICA_ID
        read_committed = params.isolation_level == READ_COMMITTED and not is_follower
        results: dict[TopicPartition, FetchPartitionData] = {}
        proposals: list[ProposeIsr] = []
        zero_copy = self.config.zero_copy_min_bytes
        limit = params.max_bytes
        min_one_message = True
        total = 0
        any_error = False
        low_watermark_moved: list[TopicPartition] = []
        for tp, st in params.partitions.items():
            try:
                # The epoch checked for every fetch, the debugging one's too (Kafka's
                # localLogWithEpochOrThrow); only the lead is not required of that one.
                p = self._leader_partition(tp, st.current_leader_epoch,
                                           require_leader=params.fetch_only_leader
                                           and not debugging)
                if is_follower and params.replica_id not in p.remote_replicas:
                    # Kafka's followerReplicaOrThrow: with an epoch that matches ours, the
                    # (replica, epoch) pair is not known yet (a replica being added): retriable.
                    raise ReplicationError(
                        Errors.UNKNOWN_LEADER_EPOCH if st.current_leader_epoch >= 0
                        else Errors.NOT_LEADER_OR_FOLLOWER,
                        f"{params.replica_id} not a replica of {tp}")
                if (not is_follower and not debugging and self.config.consumer_hw_guard
                        and p.is_leader and not p.high_watermark_caught_up):
                    # A consumer must never see the HW go back across a leader change.
                    raise ReplicationError(Errors.OFFSET_NOT_AVAILABLE, f"{tp}: HW not caught up yet")
                # Kafka answers with the HW as of the read, before this fetch moves it.
                hw = p.high_watermark
                lso = p.last_stable_offset
                leo = p.log_end_offset
                log_start = p.log_start_offset
                diverging = (self._diverging_epoch(p, st, log_start)
                             if st.last_fetched_epoch >= 0 else None)
                if diverging is not None:
                    # Kafka's Partition.readRecords: no read, and no follower fetch state (its
                    # log must be truncated first); answered at once, as Kafka's
                    # hasDivergingEpoch.
                    results[tp] = FetchPartitionData(Errors.NONE, hw, log_start, b"", lso,
                                                     diverging_epoch=diverging)
                    any_error = True
                    continue
                read_args = (st.fetch_offset, max(0, min(st.max_bytes, limit)),
                             None if is_follower else lso if read_committed else hw,
                             min_one_message)
                info = (p.log.read(*read_args) if zero_copy is None
                        else p.log.read_slice(*read_args, min_slice_bytes=zero_copy))
                aborted = (
                    tuple((t.producer_id, t.first_offset)
                          for t in p.log.aborted_transactions_for_read(info))
                    if read_committed else None
                )
            except OffsetOutOfRangeError:
                results[tp] = FetchPartitionData(Errors.OFFSET_OUT_OF_RANGE, p.high_watermark, p.log_start_offset)
                any_error = True
                continue
            except (ReplicationError, StorageError) as e:
                results[tp] = FetchPartitionData(_error_of(e))
                any_error = True
                continue
            records = info.records
            quota = self.config.leader_quota
            if is_follower and quota is not None and quota.is_throttled(tp):
                # Kafka's shouldLeaderThrottle: a replica out of the ISR gets no records of a
                # throttled partition while the leader's replication rate is over its bound.
                # The ISR here is the maximal one (KIP-497): the HW, and so every acks=all
                # producer, waits for a replica whose addition is pending.
                if should_throttle(quota, tp, params.replica_id in p.maximal_isr, now_ms):
                    records = b""
                quota.record(len(records), now_ms)
            size = len(records)
            if size:
                min_one_message = False
            limit -= size
            total += size
            results[tp] = FetchPartitionData(
                Errors.NONE, hw, log_start, _as_bytes(records), lso, aborted)
            if is_follower and update_fetch_state:
                before = p.high_watermark
                replica = p.remote_replicas[params.replica_id]
                start_before = replica.log_start_offset
                proposal = p.update_follower_fetch_state(
                    params.replica_id, st.fetch_offset, st.log_start_offset, now_ms, leo,
                    params.broker_epoch,
                )
                if proposal is not None:
                    proposals.append(proposal)
                if p.high_watermark != before:
                    self._dirty[tp] = None
                elif replica.log_start_offset != start_before:
                    low_watermark_moved.append(tp)
        # A follower's log start moving may raise the low watermark a DeleteRecords waits for
        # (Kafka's leaderLWIncremented -> tryCompleteDelayedRequests): the listeners are told,
        # not the held fetches, whose bytes do not depend on it (as after an ISR update that
        # moved no HW). A new leader's first fetch from each follower moves it (from unknown)
        # on every partition: each held fetch of the other follower, over all its partitions,
        # was tried again once per partition (3,333^2 partition checks per first fetch at
        # 10,000 partitions, RF=3: half a leader's CPU while the partitions were created).
        for tp in low_watermark_moved:
            for listener in self.partition_listeners:
                listener(tp)
        return results, proposals, total, any_error

    def _readable_bytes(self, params: FetchParams) -> tuple[int, bool]:
        """DelayedFetch's check, without side effects: (bytes readable, must complete now)."""
        is_follower = params.replica_id >= 0
        total = 0
        for tp, st in params.partitions.items():
            p = self.partitions.get(tp)
            if p is None or (params.fetch_only_leader and not p.is_leader):
                return total, True  # leadership moved: answer now (with the error)
            if p.check_current_leader_epoch(st.current_leader_epoch) != Errors.NONE:
                return total, True
            end = (p.log_end_offset if is_follower
                   else p.last_stable_offset if params.isolation_level == READ_COMMITTED
                   else p.high_watermark)
            if st.fetch_offset > p.log_end_offset or st.fetch_offset < p.log_start_offset:
                return total, True  # the log was truncated or moved: answer now
            if st.last_fetched_epoch >= 0:
                # Kafka's DelayedFetch case H: a diverging (or unplaceable) last fetched epoch
                # is answered now, for the fetcher to truncate.
                try:
                    if self._diverging_epoch(p, st, p.log_start_offset) is not None:
                        return total, True
                except OffsetOutOfRangeError:
                    return total, True
            if is_follower and should_throttle(self.config.leader_quota, tp,
                                               params.replica_id in p.maximal_isr, None):
                continue  # Kafka's DelayedFetch: a throttled partition's bytes do not count
            if st.fetch_offset < end:
                try:
                    info = p.log.read(st.fetch_offset, st.max_bytes, max_offset=None if is_follower else end)
                except (StorageError, OffsetOutOfRangeError):
                    return total, True
                total += len(info.records)
        return total, False

    def _complete_fetch(self, request_key: Hashable, params: FetchParams, now_ms: int) -> CompleteFetch:
        # As Kafka's DelayedFetch.onComplete: the follower's fetch was recorded when it arrived
        # (its offsets have not changed since); recording it again would only double the work
        # of every held fetch (an idle follower's, over all its partitions, twice a second).
        results, proposals, _, _ = self._read_from_local_log(params, now_ms,
                                                             update_fetch_state=False)
        return CompleteFetch(request_key, results, tuple(proposals))

    # ------------------------------------------------------------------ epochs and offsets
    def last_offset_for_leader_epoch(
        self, replica_id: int, partitions: Mapping[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, EpochEndOffset]:
        out: dict[TopicPartition, EpochEndOffset] = {}
        for tp, (current_leader_epoch, leader_epoch) in partitions.items():
            p = self.partitions.get(tp)
            if p is None:
                out[tp] = EpochEndOffset(self._missing_error(tp))
                continue
            try:
                out[tp] = p.last_offset_for_leader_epoch(current_leader_epoch, leader_epoch)
            except StorageError as e:
                out[tp] = EpochEndOffset(_error_of(e))
        return out

    def list_offsets(
        self,
        replica_id: int,
        partitions: Mapping[TopicPartition, tuple[int, int]],
        isolation_level: int = READ_UNCOMMITTED,
    ) -> dict[TopicPartition, ListOffsetsPartitionResult]:
        """Earliest, latest, or the first batch with a max timestamp >= a time (for consumers
        only below the HW, or the LSO with READ_COMMITTED; offset -1 when there is none)."""
        out: dict[TopicPartition, ListOffsetsPartitionResult] = {}
        for tp, (current_leader_epoch, timestamp) in partitions.items():
            try:
                p = self._leader_partition(tp, current_leader_epoch)
            except ReplicationError as e:
                out[tp] = ListOffsetsPartitionResult(e.error)
                continue
            if timestamp == EARLIEST_TIMESTAMP:
                offset = p.log_start_offset
            elif timestamp == LATEST_TIMESTAMP:
                if replica_id != CONSUMER_REPLICA_ID:
                    offset = p.log_end_offset
                else:
                    # KIP-207: a new leader whose HW has not reached its epoch start yet cannot
                    # say where committed data ends.
                    start = p.leader_epoch_start_offset
                    if start is not None and p.high_watermark < start:
                        out[tp] = ListOffsetsPartitionResult(Errors.OFFSET_NOT_AVAILABLE)
                        continue
                    offset = (p.last_stable_offset if isolation_level == READ_COMMITTED
                              else p.high_watermark)
            elif timestamp >= 0 or timestamp == MAX_TIMESTAMP:
                limit = (p.log_end_offset if replica_id != CONSUMER_REPLICA_ID
                         else p.last_stable_offset if isolation_level == READ_COMMITTED
                         else p.high_watermark)
                try:  # a disk error is the partition's answer (Kafka's fetchOffsetForTimestamp)
                    found = (_max_timestamp_batch(p.log, p.log_start_offset, limit)
                             if timestamp == MAX_TIMESTAMP
                             else p.log.offset_for_timestamp(timestamp))
                except StorageError as e:
                    out[tp] = ListOffsetsPartitionResult(_error_of(e))
                    continue
                if found is None or found[0] >= limit:
                    out[tp] = ListOffsetsPartitionResult(Errors.NONE)  # no offset, no epoch
                else:
                    out[tp] = ListOffsetsPartitionResult(Errors.NONE, found[0], p.leader_epoch, found[1])
                continue
            else:
                out[tp] = ListOffsetsPartitionResult(Errors.INVALID_REQUEST)
                continue
            out[tp] = ListOffsetsPartitionResult(Errors.NONE, offset, p.leader_epoch)
        return out

    # ------------------------------------------------------------------ ISR
    def maybe_shrink_isr(self, now_ms: int) -> list[ProposeIsr]:
        """The ``isr-expiration`` task over every led partition."""
        out: list[ProposeIsr] = []
        for p in self.partitions.values():
            proposal = p.maybe_shrink_isr(now_ms)
            if proposal is not None:
                out.append(proposal)
        return out

    def on_isr_update_result(
        self,
        tp: TopicPartition,
        ok: bool,
        new_zk_version: int,
        isr: Sequence[int],
        now_ms: int,
        leader_epoch: int | None = None,
    ) -> None:
        p = self.partitions.get(tp)
        if p is None or p.pending_isr is None:
            return
        hw_moved = p.on_isr_update_result(ok, new_zk_version, isr, leader_epoch)
        if hw_moved:
            self._dirty[tp] = None
        else:
            # What waits on the ISR itself (acks=all produce, the sessions' view) is told; the
            # held fetches only when the HW moved, as Kafka's Partition completes delayed
            # fetches after an ISR update only on a HW increment: a fetch's bytes do not
            # depend on the ISR, and a restarted follower's first fetch, held over all its
            # partitions, was tried again, reading each, at every one of its ISR additions.
            for listener in self.partition_listeners:
                listener(tp)
            self._check_delayed_produce(tp, now_ms)
        self._drain(now_ms)

    def mark_changed(self, tp: TopicPartition, now_ms: int) -> None:
        """Something of ``tp`` changed outside the core (DeleteRecords moved its log start)."""
        self._dirty[tp] = None
        self._drain(now_ms)

    def replay_follower_fetches(self, replica_id: int, partitions: Iterable[TopicPartition],
                                fetch_time_ms: int) -> None:
        """``replica_id`` fetched at ``fetch_time_ms`` without these partitions changing since
        its fetch last recorded them (same fetch offset, same leader LEO): record that fetch's
        time as `update_follower_fetch_state` would have (a fetch session does not read them)."""
        for tp in partitions:
            p = self.partitions.get(tp)
            if p is not None and p.is_leader:
                replica = p.remote_replicas.get(replica_id)
                if replica is not None:
                    replica.replay_fetch(fetch_time_ms)

    def high_watermarks(self) -> dict[TopicPartition, int]:
        """For the ``highwatermark-checkpoint`` task (``replication-offset-checkpoint``)."""
        return {tp: p.high_watermark for tp, p in self.partitions.items()}

    # ------------------------------------------------------------------ delayed operations
    def _drain(self, now_ms: int) -> None:
        """Re-check delayed operations of every partition that changed. A completed fetch reads
        again and may move a HW, which marks more partitions: loop until quiet."""
        if self._draining:
            return
        self._draining = True
        # In marking order, each pending partition once, as `next(iter(...))` and `del` one at a
        # time would, but in linear time: a dict keeps its deleted slots, so finding the first
        # key again after each deletion made a LeaderAndIsr of 10,000 partitions quadratic.
        # Marks made meanwhile go to a fresh dict; one for a partition still pending in this
        # round is taken back when its turn comes.
        batch: list[TopicPartition] = []
        taken = 0
        try:
            while self._dirty:
                batch = list(self._dirty)
                self._dirty = {}
                taken = 0
                while taken < len(batch):
                    tp = batch[taken]
                    taken += 1
                    self._dirty.pop(tp, None)
                    for listener in self.partition_listeners:
                        listener(tp)
                    self._check_delayed_produce(tp, now_ms)
                    self._completed.extend(self.fetch_purgatory.check_and_complete(tp, now_ms))
        finally:
            if taken < len(batch):  # an exception: the unchecked stay marked, in their order
                self._dirty = {**dict.fromkeys(batch[taken:]), **self._dirty}
            self._draining = False

    def _check_delayed_produce(self, tp: TopicPartition, now_ms: int) -> None:
        """Re-check the acks=all requests waiting on ``tp`` only if what they wait for changed
        (Kafka's Partition checks its produce purgatory only when the HW moved, and on ISR or
        leadership changes): a leader's append alone moves the LEO, and re-checking every
        pipelined request on each append would cost quadratic time."""
        if not self.produce_purgatory.is_watched(tp):
            self._produce_checked.pop(tp, None)
            return
        p = self.partitions.get(tp)
        state = None if p is None else (
            p, p.leader_id, p.high_watermark, p.isr, p.pending_isr, p.min_insync_replicas)
        if state is not None and self._produce_checked.get(tp) == state:
            return  # every request watched here was tried in this very state
        self._completed.extend(self.produce_purgatory.check_and_complete(tp, now_ms))
        if state is not None and self.produce_purgatory.is_watched(tp):
            self._produce_checked[tp] = state
        else:
            self._produce_checked.pop(tp, None)

    def poll_completed(self, now_ms: int) -> list[Completion]:
        """Delayed requests that are done (replicated, failed, or timed out by ``now_ms``)."""
        self._drain(now_ms)
        self._completed.extend(self.produce_purgatory.expire(now_ms))
        self._completed.extend(self.fetch_purgatory.expire(now_ms))
        self._drain(now_ms)
        out, self._completed = self._completed, []
        return out

    def next_deadline_ms(self) -> int | None:
        produce = self.produce_purgatory.next_deadline_ms()
        fetch = self.fetch_purgatory.next_deadline_ms()
        if produce is None or fetch is None:
            return fetch if produce is None else produce
        return min(produce, fetch)

    def has_pending_completions(self) -> bool:
        return bool(self._completed)
