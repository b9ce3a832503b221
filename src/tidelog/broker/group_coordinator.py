"""A consumer group coordinator (Kafka's `GroupCoordinator`, classic protocol), so that clients
that `subscribe()` and commit offsets work against tidelog unchanged.

Simplifications, stated plainly:

- **Which broker coordinates a group**: Kafka uses the leader of the group's
  `__consumer_offsets` partition. tidelog has no offsets topic; the coordinator is the live
  broker at index `abs(hashCode(group)) % n` of the sorted live broker ids in the metadata cache,
  which every broker computes alike. When the live set changes, groups may move; a broker that is
  no longer a group's coordinator answers NOT_COORDINATOR and the clients find the new one.
- **Committed offsets live in ZooKeeper** (Kafka 0.8's layout,
  `/consumers/<group>/offsets/<topic>/<partition>`, here with a JSON value holding the offset,
  leader epoch and metadata), written before the commit is acknowledged and read on every
  OffsetFetch, so they survive coordinator moves and broker restarts.
- **Group membership is in memory** on the coordinator, as Kafka's (which rebuilds it from the
  offsets topic): after a coordinator move the members simply rejoin.

Membership follows Kafka's state machine: Empty -> PreparingRebalance (JoinGroup; new members
must first ask for a member id, JoinGroup v4+ MEMBER_ID_REQUIRED; the first rebalance of an empty
group waits `group.initial.rebalance.delay.ms`) -> CompletingRebalance (JoinGroup answered: the
leader gets every member's metadata) -> Stable (the leader's SyncGroup assignments handed out).
Heartbeats keep members alive (`session.timeout.ms`, bounded by the broker's
`group.min/max.session.timeout.ms`); a member that stops heartbeating, leaves, or does not rejoin
within the rebalance timeout is removed and the group rebalances.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import NodeExistsError, NoNodeError

from tidelog.broker.fetcher_manager import java_string_hash
from tidelog.broker.socket_server import RequestContext
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import describe_groups as m_dg
from tidelog.protocol.messages import find_coordinator as m_fc
from tidelog.protocol.messages import heartbeat as m_hb
from tidelog.protocol.messages import join_group as m_jg
from tidelog.protocol.messages import leave_group as m_lg
from tidelog.protocol.messages import list_groups as m_lgs
from tidelog.protocol.messages import offset_commit as m_oc
from tidelog.protocol.messages import offset_fetch as m_of
from tidelog.protocol.messages import sync_group as m_sg

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.broker.server import BrokerServer

__all__ = ["GroupCoordinator", "GroupState", "group_offsets_path"]

logger = logging.getLogger(__name__)

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"
GroupState = str

GROUP_KEY = 0
OFFSET_METADATA_MAX_SIZE = 4096  # Kafka's offset.metadata.max.bytes default
CONSUMERS_PATH = "/consumers"


def group_offsets_path(group_id: str, topic: str | None = None, partition: int | None = None) -> str:
    path = f"{CONSUMERS_PATH}/{group_id}/offsets"
    if topic is not None:
        path += f"/{topic}"
        if partition is not None:
            path += f"/{partition}"
    return path


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_future: asyncio.Future[Any] | None = None
    sync_future: asyncio.Future[Any] | None = None
    last_heartbeat: float = field(default_factory=time.monotonic)

    def metadata(self, protocol: str | None) -> bytes:
        return next((m for name, m in self.protocols if name == protocol), b"")

    @property
    def awaiting(self) -> bool:
        return any(f is not None and not f.done() for f in (self.join_future, self.sync_future))


@dataclass(slots=True)
class Group:
    group_id: str
    state: str = EMPTY
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation_id: int = 0
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)  # ids handed out by MEMBER_ID_REQUIRED
    timer: asyncio.TimerHandle | None = None
    initial_delay: bool = False

    def supports(self, protocol_type: str, protocols: Iterable[str]) -> bool:
        if not self.members:
            return True
        if protocol_type != self.protocol_type:
            return False
        common = self.candidates()
        return bool(common & set(protocols))

    def candidates(self) -> set[str]:
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str | None:
        """Kafka's selectProtocol: each member votes for its first supported candidate."""
        candidates = self.candidates()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next((name for name, _ in m.protocols if name in candidates), None)
            if choice is not None:
                votes[choice] = votes.get(choice, 0) + 1
        if not votes:
            return None
        return max(votes.items(), key=lambda kv: kv[1])[0]


class GroupCoordinator:
    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        cfg = server.config
        self.min_session_timeout_ms = cfg.get("group.min.session.timeout.ms")
        self.max_session_timeout_ms = cfg.get("group.max.session.timeout.ms")
        self.initial_rebalance_delay_ms = cfg.get("group.initial.rebalance.delay.ms")
        self.groups: dict[str, Group] = {}
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ life cycle
    def register(self, apis: Any) -> None:
        for key, handler in (
            (ApiKey.FIND_COORDINATOR, self.handle_find_coordinator),
            (ApiKey.JOIN_GROUP, self.handle_join_group),
            (ApiKey.SYNC_GROUP, self.handle_sync_group),
            (ApiKey.HEARTBEAT, self.handle_heartbeat),
            (ApiKey.LEAVE_GROUP, self.handle_leave_group),
            (ApiKey.OFFSET_COMMIT, self.handle_offset_commit),
            (ApiKey.OFFSET_FETCH, self.handle_offset_fetch),
            (ApiKey.LIST_GROUPS, self.handle_list_groups),
            (ApiKey.DESCRIBE_GROUPS, self.handle_describe_groups),
        ):
            apis.register_handler(key, handler)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._expire_loop(),
                                                            name="group-heartbeat-expiration")

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        for group in self.groups.values():
            self._fail_waiters(group, ErrorCode.NOT_COORDINATOR)
        self.groups.clear()

    # ------------------------------------------------------------------ coordinator choice
    def coordinator_for(self, group_id: str) -> int:
        alive = self.server.metadata_cache.alive_broker_ids()
        if not alive:
            return self.server.broker_id
        h = java_string_hash(group_id)
        h = 0 if h == -(2**31) else abs(h)
        return alive[h % len(alive)]

    def is_coordinator(self, group_id: str) -> bool:
        return self.coordinator_for(group_id) == self.server.broker_id

    # ------------------------------------------------------------------ expiry
    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            try:
                self._expire(time.monotonic())
            except Exception:
                logger.exception("group heartbeat expiration failed")

    def _expire(self, now: float) -> None:
        for group_id, group in list(self.groups.items()):
            if not self.is_coordinator(group_id):
                # The group moved to another broker: its members will find the new coordinator.
                self._fail_waiters(group, ErrorCode.NOT_COORDINATOR)
                del self.groups[group_id]
                continue
            expired = [
                m for m in group.members.values()
                if not m.awaiting and now - m.last_heartbeat > m.session_timeout_ms / 1000
            ]
            for m in expired:
                logger.info("group %s: member %s expired (no heartbeat for %d ms)", group_id,
                            m.member_id, m.session_timeout_ms)
                self._remove_member(group, m.member_id)
            if group.state == EMPTY and not group.members and not group.pending:
                del self.groups[group_id]  # its committed offsets stay in ZooKeeper

    # ------------------------------------------------------------------ state machine
    def _fail_waiters(self, group: Group, error: int) -> None:
        for m in group.members.values():
            for fut in (m.join_future, m.sync_future):
                if fut is not None and not fut.done():
                    fut.set_result(error)
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None

    def _remove_member(self, group: Group, member_id: str) -> None:
        m = group.members.pop(member_id, None)
        if m is None:
            return
        for fut in (m.join_future, m.sync_future):
            if fut is not None and not fut.done():
                fut.set_result(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state in (STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(group)
        elif group.state == PREPARING_REBALANCE:
            self._maybe_complete_join(group)
        if not group.members and group.state != PREPARING_REBALANCE:
            group.state = EMPTY

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state == COMPLETING_REBALANCE:
            for m in group.members.values():
                m.assignment = b""
                if m.sync_future is not None and not m.sync_future.done():
                    m.sync_future.set_result(ErrorCode.REBALANCE_IN_PROGRESS)
        initial = group.state == EMPTY and self.initial_rebalance_delay_ms > 0
        group.state = PREPARING_REBALANCE
        group.initial_delay = initial
        timeout_ms = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        delay_ms = min(self.initial_rebalance_delay_ms, timeout_ms) if initial else timeout_ms
        if group.timer is not None:
            group.timer.cancel()
        loop = asyncio.get_running_loop()
        group.timer = loop.call_later(max(0, delay_ms) / 1000, self._on_rebalance_timer, group)
        logger.info("group %s: preparing to rebalance (generation %d)", group.group_id,
                    group.generation_id)

    def _on_rebalance_timer(self, group: Group) -> None:
        group.timer = None
        group.initial_delay = False
        if group.state == PREPARING_REBALANCE:
            self._complete_join(group)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state != PREPARING_REBALANCE or group.initial_delay:
            return
        if all(m.join_future is not None and not m.join_future.done()
               for m in group.members.values()):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        # Members that did not rejoin within the rebalance timeout leave the group.
        for member_id in [mid for mid, m in group.members.items()
                          if m.join_future is None or m.join_future.done()]:
            group.members.pop(member_id)
        group.generation_id += 1
        if not group.members:
            group.state = EMPTY
            group.protocol_name = None
            group.leader_id = None
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.state = COMPLETING_REBALANCE
        logger.info("group %s: generation %d with %d members, protocol %s", group.group_id,
                    group.generation_id, len(group.members), group.protocol_name)
        for m in group.members.values():
            assert m.join_future is not None
            m.join_future.set_result(ErrorCode.NONE)

    # ------------------------------------------------------------------ FindCoordinator
    async def handle_find_coordinator(self, ctx: RequestContext, request: m_fc.FindCoordinatorRequest) -> Any:
        keys = request.coordinator_keys if ctx.api_version >= 4 else [request.key]
        results = []
        for key in keys:
            if request.key_type != GROUP_KEY:
                results.append((key, ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1))
                continue
            if not key:
                results.append((key, ErrorCode.INVALID_REQUEST, -1, "", -1))
                continue
            node = self.coordinator_for(key)
            if node == self.server.broker_id:
                host, port = self.server.advertised_endpoint_for(ctx.listener_name)
            else:
                ep = self.server.metadata_cache.brokers.get(node)
                addr = ep.for_listener(ctx.listener_name) if ep is not None else None
                if addr is None:
                    results.append((key, ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1))
                    continue
                host, port = addr
            results.append((key, ErrorCode.NONE, node, host, port))
        if ctx.api_version >= 4:
            return m_fc.FindCoordinatorResponse(coordinators=[
                m_fc.Coordinator(key=k, node_id=n, host=h, port=p, error_code=e, error_message=None)
                for k, e, n, h, p in results
            ])
        _, e, n, h, p = results[0]
        return m_fc.FindCoordinatorResponse(error_code=e, error_message=None, node_id=n, host=h, port=p)

    # ------------------------------------------------------------------ JoinGroup
    @staticmethod
    def _join_error(error: int, member_id: str = "", version: int = 0) -> m_jg.JoinGroupResponse:
        # protocol_name is nullable from v7 only.
        return m_jg.JoinGroupResponse(error_code=error, generation_id=-1,
                                      protocol_name=None if version >= 7 else "",
                                      leader="", member_id=member_id)

    async def handle_join_group(self, ctx: RequestContext, request: m_jg.JoinGroupRequest) -> Any:
        version = ctx.api_version
        if not request.group_id:
            return self._join_error(ErrorCode.INVALID_GROUP_ID, request.member_id, version)
        if not self.is_coordinator(request.group_id):
            return self._join_error(ErrorCode.NOT_COORDINATOR, request.member_id, version)
        if not (self.min_session_timeout_ms <= request.session_timeout_ms <= self.max_session_timeout_ms):
            return self._join_error(ErrorCode.INVALID_SESSION_TIMEOUT, request.member_id, version)
        protocols = [(p.name, bytes(p.metadata)) for p in request.protocols]
        if not protocols or not request.protocol_type:
            return self._join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, request.member_id, version)
        group = self.groups.get(request.group_id)
        if group is None:
            if request.member_id:
                return self._join_error(ErrorCode.UNKNOWN_MEMBER_ID, request.member_id, version)
            group = self.groups[request.group_id] = Group(request.group_id)
        if not group.supports(request.protocol_type, [name for name, _ in protocols]):
            return self._join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, request.member_id, version)
        rebalance_timeout = request.rebalance_timeout_ms if version >= 1 and request.rebalance_timeout_ms > 0 \
            else request.session_timeout_ms
        member_id = request.member_id
        if not member_id:
            member_id = f"{ctx.header.client_id or 'client'}-{uuid.uuid4()}"
            if version >= 4:
                # KIP-394: the client must come back with this id, so no member is ever lost.
                group.pending.add(member_id)
                return self._join_error(ErrorCode.MEMBER_ID_REQUIRED, member_id, version)
        elif member_id in group.pending:
            group.pending.discard(member_id)
        elif member_id not in group.members:
            return self._join_error(ErrorCode.UNKNOWN_MEMBER_ID, member_id, version)
        member = group.members.get(member_id)
        if member is None:
            member = Member(member_id, request.group_instance_id, ctx.header.client_id or "",
                            ctx.client_host, request.session_timeout_ms, rebalance_timeout,
                            request.protocol_type, protocols)
            group.members[member_id] = member
            if group.protocol_type is None or len(group.members) == 1:
                group.protocol_type = request.protocol_type
        else:
            member.protocols = protocols
            member.session_timeout_ms = request.session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout
        member.last_heartbeat = time.monotonic()
        if member.join_future is not None and not member.join_future.done():
            member.join_future.set_result(ErrorCode.REBALANCE_IN_PROGRESS)  # a duplicate join
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        member.join_future = fut
        if group.state in (EMPTY, STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        error = await fut
        member.last_heartbeat = time.monotonic()
        if error != ErrorCode.NONE:
            return self._join_error(error, member_id, version)
        is_leader = group.leader_id == member_id
        return m_jg.JoinGroupResponse(
            error_code=0, generation_id=group.generation_id, protocol_type=group.protocol_type,
            protocol_name=group.protocol_name, leader=group.leader_id or "", member_id=member_id,
            members=[
                m_jg.JoinGroupResponseMember(m.member_id, m.group_instance_id,
                                             m.metadata(group.protocol_name))
                for m in group.members.values()
            ] if is_leader else [],
        )

    # ------------------------------------------------------------------ SyncGroup
    async def handle_sync_group(self, ctx: RequestContext, request: m_sg.SyncGroupRequest) -> Any:
        def error(code: int) -> m_sg.SyncGroupResponse:
            return m_sg.SyncGroupResponse(error_code=code, assignment=b"")

        if not self.is_coordinator(request.group_id):
            return error(ErrorCode.NOT_COORDINATOR)
        group = self.groups.get(request.group_id)
        if group is None or request.member_id not in group.members:
            return error(ErrorCode.UNKNOWN_MEMBER_ID)
        if request.generation_id != group.generation_id:
            return error(ErrorCode.ILLEGAL_GENERATION)
        if group.state == PREPARING_REBALANCE:
            return error(ErrorCode.REBALANCE_IN_PROGRESS)
        member = group.members[request.member_id]
        member.last_heartbeat = time.monotonic()
        if group.state == COMPLETING_REBALANCE:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            member.sync_future = fut
            if request.member_id == group.leader_id:
                given = {a.member_id: bytes(a.assignment) for a in request.assignments}
                for m in group.members.values():
                    m.assignment = given.get(m.member_id, b"")
                group.state = STABLE
                for m in group.members.values():
                    if m.sync_future is not None and not m.sync_future.done():
                        m.sync_future.set_result(ErrorCode.NONE)
            code = await fut
            member.last_heartbeat = time.monotonic()
            if code != ErrorCode.NONE:
                return error(code)
        return m_sg.SyncGroupResponse(error_code=0, protocol_type=group.protocol_type,
                                      protocol_name=group.protocol_name,
                                      assignment=member.assignment)

    # ------------------------------------------------------------------ Heartbeat / LeaveGroup
    async def handle_heartbeat(self, ctx: RequestContext, request: m_hb.HeartbeatRequest) -> Any:
        if not self.is_coordinator(request.group_id):
            return m_hb.HeartbeatResponse(error_code=ErrorCode.NOT_COORDINATOR)
        group = self.groups.get(request.group_id)
        if group is None or request.member_id not in group.members:
            return m_hb.HeartbeatResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID)
        group.members[request.member_id].last_heartbeat = time.monotonic()
        if request.generation_id != group.generation_id:
            return m_hb.HeartbeatResponse(error_code=ErrorCode.ILLEGAL_GENERATION)
        if group.state == PREPARING_REBALANCE:
            return m_hb.HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS)
        return m_hb.HeartbeatResponse(error_code=0)

    async def handle_leave_group(self, ctx: RequestContext, request: m_lg.LeaveGroupRequest) -> Any:
        ids = [m.member_id for m in request.members] if ctx.api_version >= 3 else [request.member_id]
        if not self.is_coordinator(request.group_id):
            return m_lg.LeaveGroupResponse(error_code=ErrorCode.NOT_COORDINATOR)
        group = self.groups.get(request.group_id)
        results = []
        for member_id in ids:
            if group is None or member_id not in group.members:
                results.append(m_lg.MemberResponse(member_id, None, ErrorCode.UNKNOWN_MEMBER_ID))
                continue
            logger.info("group %s: member %s left", request.group_id, member_id)
            self._remove_member(group, member_id)
            results.append(m_lg.MemberResponse(member_id, None, 0))
        if ctx.api_version >= 3:
            return m_lg.LeaveGroupResponse(error_code=0, members=results)
        return m_lg.LeaveGroupResponse(error_code=results[0].error_code)

    # ------------------------------------------------------------------ offsets
    def _zk(self) -> Any:
        return self.server.zk_client.kazoo

    def _write_offsets(self, group_id: str, offsets: dict[tuple[str, int], tuple[int, int, str | None]]) -> None:
        zk = self._zk()
        now = int(time.time() * 1000)
        for (topic, partition), (offset, epoch, metadata) in offsets.items():
            path = group_offsets_path(group_id, topic, partition)
            data = json.dumps({"version": 1, "offset": offset, "leader_epoch": epoch,
                               "metadata": metadata, "commit_timestamp": now}).encode()
            try:
                zk.set(path, data)
            except NoNodeError:
                try:
                    zk.create(path, data, makepath=True)
                except NodeExistsError:
                    zk.set(path, data)

    def _read_offsets(
        self, group_id: str, wanted: dict[str, list[int]] | None
    ) -> dict[str, dict[int, tuple[int, int, str | None]]]:
        zk = self._zk()
        out: dict[str, dict[int, tuple[int, int, str | None]]] = {}
        if wanted is None:
            try:
                topics = zk.get_children(group_offsets_path(group_id))
            except NoNodeError:
                return out
            wanted = {}
            for t in topics:
                try:
                    wanted[t] = sorted(int(p) for p in zk.get_children(group_offsets_path(group_id, t))
                                       if p.isdigit())
                except NoNodeError:
                    continue
        for topic, partitions in wanted.items():
            for p in partitions:
                try:
                    data, _ = zk.get(group_offsets_path(group_id, topic, p))
                except NoNodeError:
                    continue
                try:
                    obj = json.loads(data.decode())
                    out.setdefault(topic, {})[p] = (int(obj["offset"]), int(obj.get("leader_epoch", -1)),
                                                    obj.get("metadata"))
                except (ValueError, KeyError, TypeError):
                    logger.warning("ignoring an unreadable committed offset at %s",
                                   group_offsets_path(group_id, topic, p))
        return out

    async def handle_offset_commit(self, ctx: RequestContext, request: m_oc.OffsetCommitRequest) -> Any:
        def respond(codes: dict[tuple[str, int], int]) -> m_oc.OffsetCommitResponse:
            return m_oc.OffsetCommitResponse(topics=[
                m_oc.OffsetCommitResponseTopic(t.name, [
                    m_oc.OffsetCommitResponsePartition(p.partition_index, codes[(t.name, p.partition_index)])
                    for p in t.partitions])
                for t in request.topics
            ])

        keys = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]

        def all_(code: int) -> m_oc.OffsetCommitResponse:
            return respond(dict.fromkeys(keys, code))

        if not request.group_id:
            return all_(ErrorCode.INVALID_GROUP_ID)
        if not self.is_coordinator(request.group_id):
            return all_(ErrorCode.NOT_COORDINATOR)
        group = self.groups.get(request.group_id)
        generation = request.generation_id_or_member_epoch
        if generation < 0:
            # A "simple" commit (assign-based consumers, admin tools): only for an empty group.
            if group is not None and group.members:
                return all_(ErrorCode.ILLEGAL_GENERATION)
        else:
            if group is None or request.member_id not in group.members:
                return all_(ErrorCode.UNKNOWN_MEMBER_ID)
            if generation != group.generation_id:
                return all_(ErrorCode.ILLEGAL_GENERATION)
            if group.state == COMPLETING_REBALANCE:
                return all_(ErrorCode.REBALANCE_IN_PROGRESS)
            group.members[request.member_id].last_heartbeat = time.monotonic()
        codes: dict[tuple[str, int], int] = {}
        offsets: dict[tuple[str, int], tuple[int, int, str | None]] = {}
        cache = self.server.metadata_cache
        for t in request.topics:
            parts = cache.topic_partitions(t.name)
            for p in t.partitions:
                key = (t.name, p.partition_index)
                if p.partition_index not in parts:
                    codes[key] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif p.committed_metadata is not None and len(p.committed_metadata) > OFFSET_METADATA_MAX_SIZE:
                    codes[key] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                else:
                    offsets[key] = (p.committed_offset, p.committed_leader_epoch, p.committed_metadata)
        if offsets:
            try:
                await asyncio.to_thread(self._write_offsets, request.group_id, offsets)
                codes.update(dict.fromkeys(offsets, ErrorCode.NONE))
            except Exception as e:
                logger.warning("group %s: committing offsets failed: %s", request.group_id, e)
                codes.update(dict.fromkeys(offsets, ErrorCode.COORDINATOR_NOT_AVAILABLE))
        return respond(codes)

    async def handle_offset_fetch(self, ctx: RequestContext, request: m_of.OffsetFetchRequest) -> Any:
        version = ctx.api_version
        requested = request.topics
        if not self.is_coordinator(request.group_id):
            if version >= 2:
                return m_of.OffsetFetchResponse(error_code=ErrorCode.NOT_COORDINATOR)
            return m_of.OffsetFetchResponse(topics=[
                m_of.OffsetFetchResponseTopic(t.name, [
                    m_of.OffsetFetchResponsePartition(i, -1, -1, "", ErrorCode.NOT_COORDINATOR)
                    for i in t.partition_indexes])
                for t in requested or []
            ])
        wanted = None if requested is None else {t.name: list(t.partition_indexes) for t in requested}
        try:
            found = await asyncio.to_thread(self._read_offsets, request.group_id, wanted)
        except Exception as e:
            logger.warning("group %s: reading offsets failed: %s", request.group_id, e)
            return m_of.OffsetFetchResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        if wanted is None:
            wanted = {t: sorted(ps) for t, ps in found.items()}
        topics = []
        for topic, partitions in wanted.items():
            parts = []
            for p in partitions:
                offset, epoch, metadata = found.get(topic, {}).get(p, (-1, -1, ""))
                parts.append(m_of.OffsetFetchResponsePartition(p, offset, epoch, metadata or "", 0))
            topics.append(m_of.OffsetFetchResponseTopic(topic, parts))
        return m_of.OffsetFetchResponse(topics=topics, error_code=0)

    # ------------------------------------------------------------------ ListGroups / DescribeGroups
    async def handle_list_groups(self, ctx: RequestContext, request: m_lgs.ListGroupsRequest) -> Any:
        wanted = {s.lower() for s in request.states_filter} if ctx.api_version >= 4 else set()
        return m_lgs.ListGroupsResponse(error_code=0, groups=[
            m_lgs.ListedGroup(g.group_id, g.protocol_type or "", g.state)
            for g in self.groups.values()
            if self.is_coordinator(g.group_id) and (not wanted or g.state.lower() in wanted)
        ])

    async def handle_describe_groups(self, ctx: RequestContext, request: m_dg.DescribeGroupsRequest) -> Any:
        out = []
        for group_id in request.groups:
            if not self.is_coordinator(group_id):
                out.append(m_dg.DescribedGroup(error_code=ErrorCode.NOT_COORDINATOR, group_id=group_id))
                continue
            g = self.groups.get(group_id)
            if g is None:
                out.append(m_dg.DescribedGroup(error_code=0, group_id=group_id, group_state=DEAD))
                continue
            stable = g.state == STABLE
            out.append(m_dg.DescribedGroup(
                error_code=0, group_id=group_id, group_state=g.state,
                protocol_type=g.protocol_type or "",
                protocol_data=(g.protocol_name or "") if stable else "",
                members=[
                    m_dg.DescribedGroupMember(
                        m.member_id, m.group_instance_id, m.client_id, m.client_host,
                        m.metadata(g.protocol_name) if stable else b"",
                        m.assignment if stable else b"")
                    for m in g.members.values()
                ],
            ))
        return m_dg.DescribeGroupsResponse(groups=out)
