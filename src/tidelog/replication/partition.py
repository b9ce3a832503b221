"""Partition: one topic-partition hosted on this broker, as leader or follower (seeds 000, 001, 004).

State: assigned replicas (AR), the ISR (``isr``: committed, as last written to ZooKeeper; plus
``pending_isr``: a proposal in flight), leader, leader epoch, controller epoch, zk version (the
partition epoch), the leader epoch's start offset and, on the leader, a ``Replica`` per follower.

ISR changes follow seed 000's ``updateIsr`` as a compare-and-set: ``maybe_expand_isr`` /
``maybe_shrink_isr`` return a ``ProposeIsr`` (at most one in flight); the shell writes it to
ZooKeeper with the zk version as the expected version and reports back with
``on_isr_update_result``, which applies it. While a change is in flight the leader computes its
HW over the *maximal* ISR, current members plus any being added (KIP-497's rule; without it a
replica could join the ISR without the data below the HW). ``ReplicationConfig.maximal_isr=False``
switches to the naive rule (committed ISR only) for the simulator's counterexample.

HW (seed 001): leader HW = min LEO over the (maximal) ISR, never moving backwards, and (KIP-966)
not advancing while the ISR is smaller than min.insync.replicas.

min.insync.replicas is the topic's: the partition reads it from its log's ``LogConfig`` (the
topic's overrides over the broker's defaults, built by the LogManager and replaced on a config
change), as Kafka's Partition reads ``leaderLog.config.minInSyncReplicas``. A follower's HW is set by the
fetcher to min(own LEO, leader HW from the fetch response).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors, ReplicationError
from tidelog.replication.isr_policy import IsrLagPolicy, policy_for
from tidelog.replication.replica import Replica
from tidelog.replication.types import (
    UNDEFINED_EPOCH,
    EpochEndOffset,
    LeaderAndIsrPartitionState,
    ProposeIsr,
    TopicPartition,
)
from tidelog.storage.producer_state_manager import VerificationGuard
from tidelog.storage.transactions import AppendOrigin

# is_replica_eligible(broker_id, broker_epoch_of_its_last_fetch) -> bool  (KIP-841 / KIP-903)
EligibilityCheck = Callable[[int, "int | None"], bool]


def _unknown_broker_epoch() -> int:
    return -1


def _always_eligible(_broker_id: int, _broker_epoch: int | None) -> bool:
    return True


class Partition:
    def __init__(
        self,
        tp: TopicPartition,
        local_broker_id: int,
        log: Any,
        config: ReplicationConfig | None = None,
        *,
        policy: IsrLagPolicy | None = None,
        is_replica_eligible: EligibilityCheck | None = None,
        local_broker_epoch: Callable[[], int] | None = None,
    ) -> None:
        """``local_broker_epoch``: this broker's current registration (-1 while unknown)."""
        self.tp = tp
        self.local_broker_id = local_broker_id
        self.log = log  # storage.log.Log
        self.config = config or ReplicationConfig()
        self.policy = policy or policy_for(self.config)
        self.is_replica_eligible: EligibilityCheck = is_replica_eligible or _always_eligible
        self.local_broker_epoch: Callable[[], int] = local_broker_epoch or _unknown_broker_epoch
        self.assigned_replicas: tuple[int, ...] = ()
        # Kafka's assignmentState: during a reassignment (LeaderAndIsr v3+) the replicas of
        # `assigned_replicas` joining and leaving it (OngoingReassignmentState); else empty.
        self.adding_replicas: tuple[int, ...] = ()
        self.removing_replicas: tuple[int, ...] = ()
        self.isr: frozenset[int] = frozenset()
        self.pending_isr: frozenset[int] | None = None
        self.leader_id: int | None = None
        self.leader_epoch: int = UNDEFINED_EPOCH
        self.leader_epoch_start_offset: int | None = None
        self.controller_epoch: int = -1
        self.zk_version: int = -1
        self.remote_replicas: dict[int, Replica] = {}

    # ------------------------------------------------------------------ views
    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_broker_id

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr | self.pending_isr if self.pending_isr is not None else self.isr

    @property
    def high_watermark(self) -> int:
        return int(self.log.high_watermark)

    @property
    def log_end_offset(self) -> int:
        return int(self.log.log_end_offset)

    @property
    def last_stable_offset(self) -> int:
        """The LSO (KIP-98): where READ_COMMITTED consumers stop, min(first unstable offset, HW)."""
        return int(self.log.last_stable_offset)

    @property
    def high_watermark_caught_up(self) -> bool:
        """Whether a leader's HW has reached the start offset of its epoch. Before that it may be
        below a HW the previous leader already published: everything below the epoch start was
        in this log at the election, but the HW only moves as followers fetch (KIP-207)."""
        start = self.leader_epoch_start_offset
        return start is None or self.high_watermark >= start

    @property
    def min_insync_replicas(self) -> int:
        """The topic's min.insync.replicas (from the log's current config), capped at the number
        of assigned replicas: Kafka's `Partition.effectiveMinIsr`, so a topic of one replica with
        min.insync.replicas=2 still takes acks=all writes and commits them."""
        configured = int(self.log.config.min_insync_replicas)
        return min(configured, len(self.assigned_replicas)) if self.assigned_replicas else configured

    @property
    def log_start_offset(self) -> int:
        return int(self.log.log_start_offset)

    def __repr__(self) -> str:
        role = "leader" if self.is_leader else f"follower of {self.leader_id}"
        return (
            f"Partition({self.tp} on {self.local_broker_id}: {role}, epoch {self.leader_epoch}, "
            f"isr {sorted(self.isr)}"
            + (f" pending {sorted(self.pending_isr)}" if self.pending_isr is not None else "")
            + (f", adding {list(self.adding_replicas)} removing {list(self.removing_replicas)}"
               if self.is_reassigning else "")
            + f", LEO {self.log_end_offset}, HW {self.high_watermark})"
        )

    @property
    def is_reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    # ------------------------------------------------------------------ role changes
    def _update_assignment_and_isr(self, state: LeaderAndIsrPartitionState) -> None:
        self.assigned_replicas = tuple(state.replicas)
        self.adding_replicas = tuple(state.adding_replicas)
        self.removing_replicas = tuple(state.removing_replicas)
        for rid in list(self.remote_replicas):
            if rid not in self.assigned_replicas:
                del self.remote_replicas[rid]
        for rid in self.assigned_replicas:
            if rid != self.local_broker_id and rid not in self.remote_replicas:
                self.remote_replicas[rid] = Replica(rid)
        self.isr = frozenset(state.isr)
        self.pending_isr = None

    def make_leader(self, state: LeaderAndIsrPartitionState, now_ms: int) -> bool:
        """Become (or stay) leader per the controller's state. Returns whether the leader epoch is
        new. On a new epoch the log's epoch cache gets (epoch, LEO) at once (KIP-279), the epoch
        start offset is the LEO, and every follower's state is reset (LEO unknown until it
        fetches; ISR members get a full lag period)."""
        is_new_epoch = state.leader_epoch > self.leader_epoch
        leo = self.log_end_offset
        if is_new_epoch:
            # The epoch cache comes first: a log that failed an I/O refuses it, and that must
            # leave the partition as it was. Applying the new zk version before a failed write
            # let a leader of the old epoch win a compare-and-set with the new version (found
            # by the simulator, seed 9207).
            self.log.assign_epoch_start_offset(state.leader_epoch, leo)
        self.controller_epoch = state.controller_epoch
        self._update_assignment_and_isr(state)
        self.zk_version = state.zk_version
        self.leader_id = self.local_broker_id
        if is_new_epoch:
            self.leader_epoch = state.leader_epoch
            # After a restart in the same epoch the cache already holds its real start offset.
            latest = self.log.leader_epoch_cache.latest_entry
            self.leader_epoch_start_offset = (
                latest[1] if latest is not None and latest[0] == state.leader_epoch else leo
            )
            for replica in self.remote_replicas.values():
                # Resetting on every new epoch (Kafka: only on a new leader) is stricter: the HW
                # waits for a fetch in this epoch before counting a follower's LEO.
                replica.reset_replica_state(
                    now_ms, leo, is_new_leader=True, is_follower_in_sync=replica.broker_id in self.isr
                )
        self.maybe_increment_leader_hw()
        return is_new_epoch

    def make_follower(self, state: LeaderAndIsrPartitionState, now_ms: int) -> bool:
        """Become (or stay) a follower of ``state.leader``. Returns whether the leader or the
        leader epoch changed, i.e. whether the fetcher must restart from truncation (KAFKA-7164:
        also when the leader is the same broker in a new epoch)."""
        changed = state.leader_epoch > self.leader_epoch or state.leader != self.leader_id
        self.controller_epoch = state.controller_epoch
        self._update_assignment_and_isr(state)
        self.remote_replicas.clear()  # only a leader tracks followers
        self.zk_version = state.zk_version
        self.leader_id = state.leader
        if state.leader_epoch > self.leader_epoch:
            self.leader_epoch = state.leader_epoch
            self.leader_epoch_start_offset = None
        return changed

    def update_assignment(self, state: LeaderAndIsrPartitionState) -> None:
        """Same leader epoch, newer zk version: the controller changed AR/ISR only."""
        self.controller_epoch = state.controller_epoch
        self._update_assignment_and_isr(state)
        if not self.is_leader:
            self.remote_replicas.clear()
        self.zk_version = state.zk_version

    # ------------------------------------------------------------------ leader: produce
    def append_records_to_leader(self, records: Any, acks: int, now_ms: int,
                                 origin: AppendOrigin = AppendOrigin.CLIENT,
                                 verification_guard: VerificationGuard | None = None) -> Any:
        """Append as leader; returns the Log's ``LogAppendInfo``. Refuses with
        NOT_LEADER_OR_FOLLOWER when not the leader, and with NOT_ENOUGH_REPLICAS when acks=all and
        the ISR is smaller than min.insync.replicas (nothing is written then). Storage errors
        propagate. ``origin``: COORDINATOR for transaction markers and the coordinators' own
        records (the log validates them as Kafka's AppendOrigin.Coordinator).
        ``verification_guard``: the log's (KIP-890 transaction verification)."""
        if not self.is_leader:
            raise ReplicationError(Errors.NOT_LEADER_OR_FOLLOWER, f"{self.tp}: not the leader")
        min_isr = self.min_insync_replicas
        if acks == -1 and len(self.isr) < min_isr:
            raise ReplicationError(
                Errors.NOT_ENOUGH_REPLICAS,
                f"{self.tp}: ISR {sorted(self.isr)} < min.insync.replicas {min_isr}",
            )
        info = self.log.append_as_leader(records, self.leader_epoch, now_ms, origin,
                                         verification_guard)
        self.maybe_increment_leader_hw()  # an ISR of one commits at once
        return info

    def check_enough_replicas_reach_offset(self, required_offset: int) -> tuple[bool, Errors]:
        """For acks=all (seed 004's ``checkEnoughReplicasReachOffset``): (done, error).
        Done with NONE once the HW reached ``required_offset`` with enough replicas; done with
        NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR fell below min.insync.replicas; done with
        NOT_LEADER_OR_FOLLOWER after losing leadership; otherwise not done."""
        if not self.is_leader:
            return True, Errors.NOT_LEADER_OR_FOLLOWER
        min_isr = self.min_insync_replicas
        if self.high_watermark >= required_offset:
            if len(self.maximal_isr) >= min_isr:
                return True, Errors.NONE
            return True, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        if len(self.isr) < min_isr:
            return True, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return False, Errors.NONE

    # ------------------------------------------------------------------ leader: followers
    def check_current_leader_epoch(self, current_leader_epoch: int) -> Errors:
        """KIP-320 fencing of a request's current leader epoch (-1: the client sent none)."""
        if not self.config.fence_leader_epochs or current_leader_epoch == UNDEFINED_EPOCH:
            return Errors.NONE
        if current_leader_epoch < self.leader_epoch:
            return Errors.FENCED_LEADER_EPOCH
        if current_leader_epoch > self.leader_epoch:
            return Errors.UNKNOWN_LEADER_EPOCH
        return Errors.NONE

    def update_follower_fetch_state(
        self,
        replica_id: int,
        fetch_offset: int,
        log_start_offset: int,
        now_ms: int,
        leader_end_offset: int,
        broker_epoch: int | None = None,
    ) -> ProposeIsr | None:
        """Record a follower's fetch (its LEO is the fetch offset), then maybe expand the ISR and
        advance the HW. Returns an ISR proposal or None."""
        replica = self.remote_replicas.get(replica_id)
        if not self.is_leader or replica is None:
            raise ReplicationError(
                Errors.NOT_LEADER_OR_FOLLOWER,
                f"{self.tp}: replica {replica_id} is not a follower of this leader",
            )
        previous_leo = replica.log_end_offset
        replica.update_fetch_state(
            fetch_offset, log_start_offset, now_ms, leader_end_offset, broker_epoch
        )
        proposal = self.maybe_expand_isr(replica_id, now_ms)
        if proposal is not None or previous_leo != replica.log_end_offset:
            self.maybe_increment_leader_hw()
        return proposal

    def is_follower_in_sync_candidate(self, replica_id: int) -> bool:
        """Seed 000's expand rule plus KIP-320's: LEO >= leader HW and the follower has reached the
        start offset of the leader's current epoch (so it holds this epoch's history)."""
        replica = self.remote_replicas.get(replica_id)
        if replica is None or self.leader_epoch_start_offset is None:
            return False
        return (
            replica.log_end_offset >= self.high_watermark
            and replica.log_end_offset >= self.leader_epoch_start_offset
        )

    def maybe_expand_isr(self, replica_id: int, now_ms: int) -> ProposeIsr | None:
        if not self.is_leader or self.pending_isr is not None:
            return None
        if replica_id in self.isr or replica_id not in self.assigned_replicas:
            return None
        if not self.is_follower_in_sync_candidate(replica_id):
            return None
        replica = self.remote_replicas[replica_id]
        # KIP-841/903: never re-add a replica the shell reports offline, fenced or re-registered.
        if not self.is_replica_eligible(replica_id, replica.broker_epoch):
            return None
        return self._propose(self.isr | {replica_id})

    def get_out_of_sync_replicas(self, now_ms: int) -> set[int]:
        """Followers in the ISR the lag policy judges out of sync (stuck or slow, seed 000)."""
        leo = self.log_end_offset
        out: set[int] = set()
        for rid in self.isr:
            if rid == self.local_broker_id:
                continue
            replica = self.remote_replicas.get(rid)
            if replica is None or self.policy.is_out_of_sync(replica, leo, now_ms):
                out.add(rid)
        return out

    def maybe_shrink_isr(self, now_ms: int) -> ProposeIsr | None:
        if not self.is_leader or self.pending_isr is not None:
            return None
        out_of_sync = self.get_out_of_sync_replicas(now_ms)
        if not out_of_sync:
            return None
        return self._propose(self.isr - out_of_sync)

    def _propose(self, new_isr: frozenset[int]) -> ProposeIsr:
        self.pending_isr = frozenset(new_isr)
        members = tuple(sorted(new_isr))
        return ProposeIsr(
            tp=self.tp,
            leader=self.local_broker_id,
            leader_epoch=self.leader_epoch,
            new_isr=members,
            zk_version=self.zk_version,
            controller_epoch=self.controller_epoch,
            isr_with_broker_epochs=tuple((m, self._broker_epoch_of(m)) for m in members),
        )

    def _broker_epoch_of(self, broker_id: int) -> int:
        """Kafka's addBrokerEpochToIsr: the local broker's epoch, a follower's from its last
        fetch in this leadership, else -1 (not checked by the ISR writer)."""
        if broker_id == self.local_broker_id:
            return self.local_broker_epoch()
        replica = self.remote_replicas.get(broker_id)
        epoch = replica.broker_epoch if replica is not None else None
        return -1 if epoch is None else epoch

    def on_isr_update_result(
        self,
        ok: bool,
        new_zk_version: int,
        isr: Iterable[int],
        leader_epoch: int | None = None,
    ) -> bool:
        """The ZooKeeper CAS for the pending proposal came back. ok: apply ``isr`` and the new zk
        version; not ok (version conflict): drop the proposal, keep the committed ISR. A result for
        another proposal or epoch is ignored. Returns whether the HW moved."""
        if not self.is_leader or self.pending_isr is None:
            return False
        if leader_epoch is not None and leader_epoch != self.leader_epoch:
            return False
        written = frozenset(isr)
        if ok:
            if written != self.pending_isr:
                return False
            self.isr = written
            self.zk_version = new_zk_version
        self.pending_isr = None
        return self.maybe_increment_leader_hw()

    def maybe_increment_leader_hw(self) -> bool:
        """HW = min LEO over the maximal ISR (or the committed ISR with ``maximal_isr=False``);
        only ever moves forward; held while the ISR < min.insync.replicas (KIP-966)."""
        if not self.is_leader:
            return False
        members = self.maximal_isr if self.config.maximal_isr else self.isr
        if self.config.hw_requires_min_isr and len(members) < self.min_insync_replicas:
            return False
        new_hw = self.log_end_offset
        for rid in members:
            if rid == self.local_broker_id:
                continue
            replica = self.remote_replicas.get(rid)
            new_hw = min(new_hw, replica.log_end_offset if replica is not None else -1)
        if new_hw > self.high_watermark:
            self.log.update_high_watermark(new_hw)
            return True
        return False

    # ------------------------------------------------------------------ leader epochs
    def last_offset_for_leader_epoch(
        self, current_leader_epoch: int, leader_epoch: int, fetch_only_from_leader: bool = True
    ) -> EpochEndOffset:
        """OffsetsForLeaderEpoch (KIP-101/279): the largest epoch <= ``leader_epoch`` this log
        knows and its end offset; fenced by ``current_leader_epoch`` (KIP-320)."""
        error = self.check_current_leader_epoch(current_leader_epoch)
        if error != Errors.NONE:
            return EpochEndOffset(error)
        if fetch_only_from_leader and not self.is_leader:
            return EpochEndOffset(Errors.NOT_LEADER_OR_FOLLOWER)
        epoch, end_offset = self.log.end_offset_for_epoch(leader_epoch)
        return EpochEndOffset(Errors.NONE, epoch, end_offset)
