"""The classic consumer group state machine (Kafka 2.x `GroupMetadata` + the group half of
`GroupCoordinator`), pure: every method takes `now_ms` and returns what to do, nothing waits.

States (Kafka's names): Empty -> PreparingRebalance -> CompletingRebalance -> Stable, and Dead
(the group's offsets partition moved away). A rebalance:

1. A member joins (or leaves, or its session expires, or the leader rejoins with new metadata):
   the group goes to PreparingRebalance. Members already in the group have until the rebalance
   timeout (the largest of their `rebalance_timeout_ms`) to send JoinGroup again; the first
   rebalance of an Empty group waits `group.initial.rebalance.delay.ms` more, extended while new
   members keep arriving, up to the rebalance timeout (Kafka's InitialDelayedJoin).
2. When every member rejoined (or the time is up; the ones that did not are removed), the next
   generation starts in CompletingRebalance: the protocol all members support that most of them
   prefer is chosen, and the waiting JoinGroups are answered (the leader gets every member's
   subscription).
3. The leader's SyncGroup carries the assignment; the shell persists it (`store`) and, once it
   is written, every waiting SyncGroup gets its member's assignment: Stable.

Waiting requests are not held here: a `GroupDecision` names the member whose later answer the
caller waits for (`waiter`) and carries the answers due to earlier waiting requests (`joins`,
`syncs`). `tick(now_ms)` performs what time decides: session expiry, the end of the join phase,
forgetting member ids handed out with MEMBER_ID_REQUIRED that never came back.

Static membership (KIP-345, `group.instance.id`): a member with an instance id joins without the
MEMBER_ID_REQUIRED round trip; when it comes back (restarted) with no member id it takes over its
old member and assignment under a new member id, without a rebalance while the group is Stable
and its metadata is unchanged; requests still using the replaced member id get
FENCED_INSTANCE_ID. A static member leaves by session expiry or an explicit LeaveGroup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from tidelog.protocol.errors import ErrorCode

__all__ = [
    "NEW_MEMBER_JOIN_TIMEOUT_MS",
    "GroupDecision",
    "GroupMetadata",
    "GroupState",
    "JoinResult",
    "MemberMetadata",
    "MemberSummary",
    "SyncResult",
]

# Kafka's GroupCoordinator.NewMemberJoinTimeoutMs (KIP-394): a new member that never rejoins
# is dropped after this long, whatever its session timeout.
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000

NONE = int(ErrorCode.NONE)


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class JoinResult:
    """The answer to one JoinGroup. `members` is filled for the leader only."""

    error: int
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # (member id, instance id, metadata)


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True)
class GroupDecision:
    """What one call decided.

    `reply`: the caller's answer now (a JoinResult, SyncResult or an error code); when None the
    caller waits for the answer that a later decision gives `waiter`. `joins` / `syncs`: answers
    due to JoinGroup / SyncGroup requests waiting from earlier calls, by member id. `store`: the
    group's metadata must be written (with `assignment`, for `store_generation`), then
    `on_store_complete` called.
    """

    reply: JoinResult | SyncResult | int | None = None
    waiter: str | None = None
    joins: dict[str, JoinResult] = field(default_factory=dict)
    syncs: dict[str, SyncResult] = field(default_factory=dict)
    store: bool = False
    store_generation: int = -1
    assignment: dict[str, bytes] = field(default_factory=dict)


@dataclass(slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    awaiting_join: bool = False
    awaiting_sync: bool = False
    is_new: bool = False
    heartbeat_deadline_ms: int | None = None

    def metadata(self, protocol: str | None) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        return b""

    def matches(self, protocols: Sequence[tuple[str, bytes]]) -> bool:
        return [(n, bytes(m)) for n, m in protocols] == [(n, bytes(m)) for n, m in self.protocols]

    def vote(self, candidates: set[str]) -> str:
        """This member's preferred protocol among `candidates` (its list is in preference order)."""
        return next(name for name, _ in self.protocols if name in candidates)


@dataclass(frozen=True, slots=True)
class MemberSummary:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


class GroupMetadata:
    """One consumer group: its members, generation, chosen protocol and state."""

    def __init__(
        self, group_id: str, now_ms: int, *, initial_rebalance_delay_ms: int = 3000
    ) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.state_timestamp_ms = now_ms
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, MemberMetadata] = {}
        # Member ids handed out with MEMBER_ID_REQUIRED, not yet back: id -> expiry deadline.
        self.pending_members: dict[str, int] = {}
        self.static_members: dict[str, str] = {}  # group instance id -> its current member id
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.new_member_added = False
        self.join_deadline_ms: int | None = None
        # While the first rebalance of an Empty group is delayed: how far it may still be
        # extended (None for an ordinary join phase, which ends when every member rejoined).
        self.initial_remaining_ms: int | None = None
        # The leader's assignment while it is being written.
        self.pending_assignment: dict[str, bytes] | None = None

    # ------------------------------------------------------------------ queries
    def __repr__(self) -> str:
        return (f"GroupMetadata({self.group_id!r}, {self.state.value}, generation "
                f"{self.generation_id}, {len(self.members)} members)")

    def is_(self, state: GroupState) -> bool:
        return self.state == state

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        if not candidates:
            raise ValueError(f"group {self.group_id}: no protocol supported by every member")
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = m.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])  # ties: the first voted for

    def supports_protocols(self, protocol_type: str, protocols: Sequence[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        candidates = self.candidate_protocols()
        return protocol_type == self.protocol_type and any(n in candidates for n, _ in protocols)

    def all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def next_deadline_ms(self) -> int | None:
        deadlines = [m.heartbeat_deadline_ms for m in self.members.values()
                     if m.heartbeat_deadline_ms is not None]
        deadlines.extend(self.pending_members.values())
        if self.join_deadline_ms is not None:
            deadlines.append(self.join_deadline_ms)
        return min(deadlines, default=None)

    def summary(self) -> tuple[str, str, str, list[MemberSummary]]:
        """(state, protocol type, protocol, members) as DescribeGroups reports them: metadata
        and assignments only once Stable (Kafka's `GroupMetadata.summary`)."""
        stable = self.state == GroupState.STABLE
        members = [
            MemberSummary(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                          m.metadata(self.protocol_name) if stable else b"",
                          m.assignment if stable else b"")
            for m in self.members.values()
        ]
        return (self.state.value, self.protocol_type or "",
                (self.protocol_name or "") if stable else "", members)

    def _join_result(self, member: MemberMetadata, error: int = NONE) -> JoinResult:
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if member.member_id == self.leader_id:
            members = tuple((m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                            for m in self.members.values())
        return JoinResult(error, member.member_id, self.generation_id, self.protocol_type,
                          self.protocol_name, self.leader_id or "", members)

    def _sync_result(self, assignment: bytes, error: int = NONE) -> SyncResult:
        return SyncResult(error, assignment, self.protocol_type, self.protocol_name)

    # ------------------------------------------------------------------ transitions
    def _transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp_ms = now_ms

    def _heartbeat(self, member: MemberMetadata, now_ms: int, timeout_ms: int | None = None) -> None:
        member.heartbeat_deadline_ms = now_ms + (timeout_ms or member.session_timeout_ms)

    def _add(self, member: MemberMetadata) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def _remove(self, member_id: str) -> None:
        m = self.members.pop(member_id, None)
        if m is not None and m.group_instance_id is not None \
                and self.static_members.get(m.group_instance_id) == member_id:
            del self.static_members[m.group_instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)

    def is_static_member_fenced(self, member_id: str, group_instance_id: str | None) -> bool:
        """A request naming an instance id whose member id is now another one (Kafka's
        `isStaticMemberFenced`)."""
        if group_instance_id is None:
            return False
        current = self.static_members.get(group_instance_id)
        return current is not None and current != member_id

    def _maybe_prepare_rebalance(self, now_ms: int, d: GroupDecision) -> None:
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(now_ms, d)
            # Kafka's tryCompleteElseWatch: a group left with no members completes at once.
            self._try_complete_join(now_ms, d)

    def _prepare_rebalance(self, now_ms: int, d: GroupDecision) -> None:
        if self.state == GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(int(ErrorCode.REBALANCE_IN_PROGRESS), d)
        if self.state == GroupState.EMPTY:
            delay = self.initial_rebalance_delay_ms
            self.join_deadline_ms = now_ms + delay
            self.initial_remaining_ms = max(self.rebalance_timeout_ms - delay, 0)
        else:
            self.join_deadline_ms = now_ms + self.rebalance_timeout_ms
            self.initial_remaining_ms = None
        self._transition(GroupState.PREPARING_REBALANCE, now_ms)

    def _reset_and_propagate_assignment_error(self, error: int, d: GroupDecision) -> None:
        for m in self.members.values():
            m.assignment = b""
            if m.awaiting_sync:
                m.awaiting_sync = False
                d.syncs[m.member_id] = self._sync_result(b"", error)
        self.pending_assignment = None

    def _try_complete_join(self, now_ms: int, d: GroupDecision) -> None:
        if self.state != GroupState.PREPARING_REBALANCE or self.join_deadline_ms is None:
            return
        if self.initial_remaining_ms is not None:
            if now_ms < self.join_deadline_ms:
                return
            if self.new_member_added and self.initial_remaining_ms > 0:
                self.new_member_added = False
                delay = min(self.initial_rebalance_delay_ms, self.initial_remaining_ms)
                self.join_deadline_ms = now_ms + delay
                self.initial_remaining_ms = max(self.initial_remaining_ms - delay, 0)
                return
        elif not (self.all_members_joined() or now_ms >= self.join_deadline_ms):
            return
        self._complete_join(now_ms, d)

    def _complete_join(self, now_ms: int, d: GroupDecision) -> None:
        for m in [m for m in self.members.values() if not m.awaiting_join]:
            self._remove(m.member_id)  # did not rejoin in time
        self.join_deadline_ms = None
        self.initial_remaining_ms = None
        self.new_member_added = False
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self._transition(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self._transition(GroupState.EMPTY, now_ms)
            # Kafka writes the empty group too, so that its generation survives a move.
            d.store = True
            d.store_generation = self.generation_id
            d.assignment = {}
        for m in self.members.values():
            d.joins[m.member_id] = self._join_result(m)
            m.awaiting_join = False
            m.is_new = False
            self._heartbeat(m, now_ms)

    def _remove_member_and_update_group(
        self, member: MemberMetadata, now_ms: int, d: GroupDecision
    ) -> None:
        # A waiting JoinGroup is answered first, so that a live client retries the join.
        if member.awaiting_join:
            d.joins[member.member_id] = JoinResult(int(ErrorCode.UNKNOWN_MEMBER_ID), "")
        if member.awaiting_sync:
            d.syncs[member.member_id] = self._sync_result(b"", int(ErrorCode.UNKNOWN_MEMBER_ID))
        self._remove(member.member_id)
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(now_ms, d)
        elif self.state == GroupState.PREPARING_REBALANCE:
            self._try_complete_join(now_ms, d)

    # ------------------------------------------------------------------ JoinGroup
    def join(
        self,
        *,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        require_known_member_id: bool,
        new_member_id: str,
        now_ms: int,
    ) -> GroupDecision:
        """A JoinGroup. `new_member_id` is the id to hand out if the caller has none yet.
        The caller already checked the session timeout's range and that it talks to the right
        coordinator."""
        d = GroupDecision()
        protos = [(n, bytes(m)) for n, m in protocols]
        if self.state == GroupState.DEAD:
            d.reply = JoinResult(int(ErrorCode.COORDINATOR_NOT_AVAILABLE), member_id)
            return d
        if not self.supports_protocols(protocol_type, protos):
            d.reply = JoinResult(int(ErrorCode.INCONSISTENT_GROUP_PROTOCOL), member_id)
            return d
        if not member_id and group_instance_id is not None \
                and group_instance_id in self.static_members:
            return self._replace_static_member(
                group_instance_id, new_member_id, client_id, client_host, session_timeout_ms,
                rebalance_timeout_ms, protos, now_ms)
        if member_id and self.is_static_member_fenced(member_id, group_instance_id):
            d.reply = JoinResult(int(ErrorCode.FENCED_INSTANCE_ID), member_id)
            return d
        if not member_id:
            if require_known_member_id and group_instance_id is None:
                # KIP-394: the id comes back with MEMBER_ID_REQUIRED; the member joins with it.
                self.pending_members[new_member_id] = now_ms + session_timeout_ms
                d.reply = JoinResult(int(ErrorCode.MEMBER_ID_REQUIRED), new_member_id)
                return d
            member_id = new_member_id
        elif member_id in self.pending_members:
            del self.pending_members[member_id]
        elif member_id not in self.members:
            d.reply = JoinResult(int(ErrorCode.UNKNOWN_MEMBER_ID), member_id)
            return d
        else:
            m = self.members[member_id]
            answer_now = (
                (self.state == GroupState.COMPLETING_REBALANCE and m.matches(protos))
                or (self.state == GroupState.STABLE and member_id != self.leader_id
                    and m.matches(protos))
            )
            if answer_now:
                # Nothing changed for this member: it gets the current generation again.
                self._heartbeat(m, now_ms)
                d.reply = self._join_result(m)
                return d
            m.protocols = protos
            m.rebalance_timeout_ms = rebalance_timeout_ms
            m.session_timeout_ms = session_timeout_ms
            m.client_id, m.client_host = client_id, client_host
            m.awaiting_join = True
            d.waiter = member_id
            self._maybe_prepare_rebalance(now_ms, d)
            self._try_complete_join(now_ms, d)
            return d
        # A new member.
        member = MemberMetadata(member_id, group_instance_id, client_id, client_host,
                                rebalance_timeout_ms, session_timeout_ms, protocol_type, protos,
                                awaiting_join=True, is_new=True)
        if self.state == GroupState.PREPARING_REBALANCE and self.generation_id == 0:
            self.new_member_added = True
        self._add(member)
        self._heartbeat(member, now_ms, NEW_MEMBER_JOIN_TIMEOUT_MS)
        d.waiter = member_id
        self._maybe_prepare_rebalance(now_ms, d)
        self._try_complete_join(now_ms, d)
        return d

    def _replace_static_member(
        self, instance_id: str, new_member_id: str, client_id: str, client_host: str,
        session_timeout_ms: int, rebalance_timeout_ms: int, protocols: list[tuple[str, bytes]],
        now_ms: int,
    ) -> GroupDecision:
        """A known static member came back without its member id (Kafka's
        `updateStaticMemberAndRebalance`): the old id is fenced, the member keeps its place."""
        d = GroupDecision()
        old_id = self.static_members[instance_id]
        m = self.members.pop(old_id)
        fenced = int(ErrorCode.FENCED_INSTANCE_ID)
        if m.awaiting_join:
            d.joins[old_id] = JoinResult(fenced, old_id)
            m.awaiting_join = False
        if m.awaiting_sync:
            d.syncs[old_id] = self._sync_result(b"", fenced)
            m.awaiting_sync = False
        m.member_id = new_member_id
        m.client_id, m.client_host = client_id, client_host
        m.session_timeout_ms, m.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        self.members[new_member_id] = m
        self.static_members[instance_id] = new_member_id
        if self.leader_id == old_id:
            self.leader_id = new_member_id
        if self.state == GroupState.STABLE and m.matches(protocols):
            # Nothing to reassign: the member resumes its assignment; the new id is written.
            self._heartbeat(m, now_ms)
            d.reply = JoinResult(NONE, new_member_id, self.generation_id, self.protocol_type,
                                 self.protocol_name, self.leader_id or "")
            d.store = True
            d.store_generation = self.generation_id
            d.assignment = {mid: mm.assignment for mid, mm in self.members.items()}
            return d
        m.protocols = protocols
        m.awaiting_join = True
        d.waiter = new_member_id
        self._maybe_prepare_rebalance(now_ms, d)
        self._try_complete_join(now_ms, d)
        return d

    # ------------------------------------------------------------------ SyncGroup
    def sync(
        self,
        *,
        member_id: str,
        generation_id: int,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
        now_ms: int,
        group_instance_id: str | None = None,
    ) -> GroupDecision:
        d = GroupDecision()
        if self.state == GroupState.DEAD:
            d.reply = self._sync_result(b"", int(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        elif self.is_static_member_fenced(member_id, group_instance_id):
            d.reply = self._sync_result(b"", int(ErrorCode.FENCED_INSTANCE_ID))
        elif member_id not in self.members:
            d.reply = self._sync_result(b"", int(ErrorCode.UNKNOWN_MEMBER_ID))
        elif generation_id != self.generation_id:
            d.reply = self._sync_result(b"", int(ErrorCode.ILLEGAL_GENERATION))
        elif ((protocol_type is not None and protocol_type != self.protocol_type)
              or (protocol_name is not None and protocol_name != self.protocol_name)):
            d.reply = self._sync_result(b"", int(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
        elif self.state == GroupState.PREPARING_REBALANCE:
            d.reply = self._sync_result(b"", int(ErrorCode.REBALANCE_IN_PROGRESS))
        elif self.state == GroupState.COMPLETING_REBALANCE:
            self.members[member_id].awaiting_sync = True
            d.waiter = member_id
            if member_id == self.leader_id and self.pending_assignment is None:
                # Members the leader left out get an empty assignment (Kafka does the same).
                assignment = {mid: bytes(assignments.get(mid, b"")) for mid in self.members}
                self.pending_assignment = assignment
                d.store = True
                d.store_generation = self.generation_id
                d.assignment = assignment
        elif self.state == GroupState.STABLE:
            m = self.members[member_id]
            self._heartbeat(m, now_ms)
            d.reply = self._sync_result(m.assignment)
        else:  # Empty: no members
            d.reply = self._sync_result(b"", int(ErrorCode.UNKNOWN_MEMBER_ID))
        return d

    def on_store_complete(self, generation_id: int, error: int, now_ms: int) -> GroupDecision:
        """The leader's assignment for `generation_id` was written (error 0) or not."""
        d = GroupDecision()
        assignment, self.pending_assignment = self.pending_assignment, None
        if (self.state != GroupState.COMPLETING_REBALANCE or generation_id != self.generation_id
                or assignment is None):
            return d  # the group moved on meanwhile
        if error:
            self._reset_and_propagate_assignment_error(error, d)
            self._maybe_prepare_rebalance(now_ms, d)
            return d
        for mid, m in self.members.items():
            m.assignment = assignment.get(mid, b"")
            if m.awaiting_sync:
                m.awaiting_sync = False
                d.syncs[mid] = self._sync_result(m.assignment)
                self._heartbeat(m, now_ms)
        self._transition(GroupState.STABLE, now_ms)
        return d

    # ------------------------------------------------------------------ Heartbeat / Leave
    def _current_member_error(self, member_id: str, generation_id: int,
                              group_instance_id: str | None) -> int:
        """Kafka's validateCurrentMember (a static member's id, then membership), then the
        generation: what Heartbeat and OffsetCommit check before the group's state."""
        if self.is_static_member_fenced(member_id, group_instance_id):
            return int(ErrorCode.FENCED_INSTANCE_ID)
        if member_id not in self.members:
            return int(ErrorCode.UNKNOWN_MEMBER_ID)
        if generation_id != self.generation_id:
            return int(ErrorCode.ILLEGAL_GENERATION)
        return NONE

    def heartbeat(self, member_id: str, generation_id: int, now_ms: int,
                  group_instance_id: str | None = None) -> int:
        if self.state == GroupState.DEAD:
            return int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        error = self._current_member_error(member_id, generation_id, group_instance_id)
        if error:
            return error
        self._heartbeat(self.members[member_id], now_ms)
        if self.state == GroupState.PREPARING_REBALANCE:
            return int(ErrorCode.REBALANCE_IN_PROGRESS)
        return NONE

    def leave(
        self, members: Sequence[str | tuple[str, str | None]], now_ms: int
    ) -> tuple[list[int], GroupDecision]:
        """LeaveGroup for each member (a member id, or (member id, instance id); a static
        member may leave by its instance id alone): its error code (in the order given), and
        what the departures decided."""
        d = GroupDecision()
        errors: list[int] = []
        for entry in members:
            given, instance_id = (entry, None) if isinstance(entry, str) else entry
            mid = given
            if instance_id is not None:
                current = self.static_members.get(instance_id)
                if current is None:
                    errors.append(int(ErrorCode.UNKNOWN_MEMBER_ID))
                    continue
                if given and given != current:
                    errors.append(int(ErrorCode.FENCED_INSTANCE_ID))
                    continue
                mid = current
            if self.state == GroupState.DEAD:
                errors.append(int(ErrorCode.COORDINATOR_NOT_AVAILABLE))
            elif mid in self.pending_members:
                del self.pending_members[mid]
                errors.append(NONE)
                self._try_complete_join(now_ms, d)
            elif mid not in self.members:
                errors.append(int(ErrorCode.UNKNOWN_MEMBER_ID))
            else:
                self._remove_member_and_update_group(self.members[mid], now_ms, d)
                errors.append(NONE)
        return errors, d

    # ------------------------------------------------------------------ OffsetCommit
    def validate_offset_commit(self, member_id: str, generation_id: int, now_ms: int,
                               group_instance_id: str | None = None) -> int:
        """May this member commit? Kafka's `validateOffsetCommit` then `doCommitOffsets`: the
        member and its generation first, the group's state after, so that a commit of an old
        generation during a rebalance is ILLEGAL_GENERATION (the consumer rejoins), not
        REBALANCE_IN_PROGRESS. A commit with no generation, member or instance id is one from
        outside group management (`assign()`): only an Empty group takes it."""
        if self.state == GroupState.DEAD:
            return int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if generation_id >= 0 or member_id or group_instance_id is not None:
            error = self._current_member_error(member_id, generation_id, group_instance_id)
            if error:
                return error
        elif self.state != GroupState.EMPTY:
            return int(ErrorCode.UNKNOWN_MEMBER_ID)
        if self.state == GroupState.COMPLETING_REBALANCE:
            return int(ErrorCode.REBALANCE_IN_PROGRESS)
        member = self.members.get(member_id)
        if member is not None:  # Stable or PreparingRebalance: the commit counts as a heartbeat
            self._heartbeat(member, now_ms)
        return NONE

    # ------------------------------------------------------------------ time
    def tick(self, now_ms: int) -> GroupDecision:
        """Expire sessions and pending member ids, end the join phase when its time is up."""
        d = GroupDecision()
        for mid, deadline in list(self.pending_members.items()):
            if now_ms >= deadline:
                del self.pending_members[mid]
        for m in list(self.members.values()):
            if m.member_id not in self.members:
                continue  # removed by an earlier expiry in this tick
            deadline = m.heartbeat_deadline_ms
            if deadline is None or now_ms < deadline:
                continue
            # Kafka's shouldKeepAlive: a rejoining member is kept until the join phase ends,
            # one waiting for the leader's assignment until the sync ends.
            if (m.awaiting_join and not m.is_new) or m.awaiting_sync:
                m.heartbeat_deadline_ms = None
                continue
            self._remove_member_and_update_group(m, now_ms, d)
        self._try_complete_join(now_ms, d)
        return d

    # ------------------------------------------------------------------ coordinator moves
    def mark_dead(self) -> GroupDecision:
        """The offsets partition of this group moved away: every waiting request is answered
        NOT_COORDINATOR, so that clients find the new coordinator."""
        d = GroupDecision()
        err = int(ErrorCode.NOT_COORDINATOR)
        for m in self.members.values():
            if m.awaiting_join:
                d.joins[m.member_id] = JoinResult(err, m.member_id)
            if m.awaiting_sync:
                d.syncs[m.member_id] = SyncResult(err)
        self.state = GroupState.DEAD
        self.join_deadline_ms = None
        self.pending_members.clear()
        for m in self.members.values():
            m.heartbeat_deadline_ms = None
        return d

    @classmethod
    def loaded(
        cls,
        group_id: str,
        *,
        protocol_type: str,
        generation_id: int,
        protocol_name: str | None,
        leader_id: str | None,
        members: Sequence[MemberMetadata],
        now_ms: int,
        initial_rebalance_delay_ms: int = 3000,
    ) -> GroupMetadata:
        """A group read back from its offsets partition: Stable with its members (each given a
        fresh session), or Empty (Kafka's `GroupMetadataManager.loadGroup`)."""
        g = cls(group_id, now_ms, initial_rebalance_delay_ms=initial_rebalance_delay_ms)
        g.protocol_type = protocol_type or None
        g.generation_id = generation_id
        g.protocol_name = protocol_name
        for m in members:
            g.members[m.member_id] = m
            if m.group_instance_id is not None:
                g.static_members[m.group_instance_id] = m.member_id
            g._heartbeat(m, now_ms)
        g.leader_id = leader_id if leader_id in g.members else next(iter(g.members), None)
        g.state = GroupState.STABLE if g.members else GroupState.EMPTY
        return g
