"""A simulated ZooKeeper: znodes with versions (compare-and-set), ephemeral znodes owned by
sessions, session expiry, sequential znodes and one-shot watches delivered as scheduled events.

Only what Kafka's ZooKeeper mode uses is modelled: `/brokers/ids/<id>` ephemeral registrations
(their creation zxid is the broker epoch), `/brokers/topics/<t>/partitions/<p>/state` written
with the zk version as a compare-and-set (seed 000's `updateIsr`), `/isr_change_notification/`
and `/log_dir_event_notification/` sequential znodes, `/controller_epoch` and the KIP-966 marks.

Above the raw znode operations it implements `controller.zk_interface.ZooKeeperClient`, the
interface `KafkaZkClient` implements over kazoo, with the same znode layout and JSON encodings
(zk_data.py): the controller's execute loop (controller/executor.py) runs unchanged on both. A
ZooKeeper transaction is one step here (the simulator runs one event at a time), so a write
fenced by the controller epoch checks /controller_epoch's version and writes in one go.

The session clock is the scheduler's: a session expires when no request or ping arrived for
`timeout_ms`; its ephemeral znodes are then deleted and their watches fire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from uuid import UUID

from tidelog.controller import zk_data
from tidelog.controller.reassignment import (
    REASSIGN_PARTITIONS_PATH,
    decode_reassign_partitions,
    encode_reassign_partitions,
)
from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch, TopicPartitionT
from tidelog.controller.zk_interface import (
    ControllerMovedError,
    KafkaZkReads,
    NoTopicError,
    ZkClientError,
    ZnodeVersionError,
)
from tidelog.sim.clock import Scheduler


class ZkCode(Enum):
    OK = "ok"
    NO_NODE = "no_node"
    NODE_EXISTS = "node_exists"
    BAD_VERSION = "bad_version"
    SESSION_EXPIRED = "session_expired"


@dataclass(slots=True)
class Stat:
    version: int
    czxid: int
    mzxid: int
    ephemeral_owner: int  # 0 for a persistent znode


@dataclass(slots=True)
class ZNode:
    data: Any
    stat: Stat


@dataclass(slots=True)
class Session:
    session_id: int
    timeout_ms: int
    last_seen_ms: int
    expired: bool = False
    ephemerals: set[str] = field(default_factory=set)


WatchCallback = Callable[[str, str], None]  # (event type, path)


class SimZooKeeper(KafkaZkReads):
    def __init__(self, scheduler: Scheduler, tick_ms: int = 100, watch_delay_ms: int = 1) -> None:
        self.scheduler = scheduler
        self.zxid = 0
        self.nodes: dict[str, ZNode] = {"/": ZNode(None, Stat(0, 0, 0, 0))}
        self.sessions: dict[int, Session] = {}
        self._next_session = 0x1000
        self._seq_counters: dict[str, int] = {}
        self._data_watches: dict[str, list[WatchCallback]] = {}
        self._child_watches: dict[str, list[WatchCallback]] = {}
        self.watch_delay_ms = watch_delay_ms
        self.tick_ms = tick_ms
        self.expired_sessions: list[int] = []
        self._ticking = False

    def start(self) -> None:
        """Start the periodic session-expiry check."""
        if not self._ticking:
            self._ticking = True
            self.scheduler.schedule(self.tick_ms, self._tick)

    def _tick(self) -> None:
        self.expire_sessions()
        self.scheduler.schedule(self.tick_ms, self._tick)

    # -- sessions ------------------------------------------------------------------------
    def create_session(self, timeout_ms: int) -> int:
        self._next_session += 1
        sid = self._next_session
        self.sessions[sid] = Session(sid, timeout_ms, self.scheduler.now_ms)
        return sid

    def touch(self, session_id: int) -> bool:
        """A request or ping from the session's client; False when the session is gone."""
        s = self.sessions.get(session_id)
        if s is None or s.expired:
            return False
        s.last_seen_ms = self.scheduler.now_ms
        return True

    def session_alive(self, session_id: int) -> bool:
        s = self.sessions.get(session_id)
        return s is not None and not s.expired

    def expire_sessions(self) -> list[int]:
        now = self.scheduler.now_ms
        gone = [s for s in self.sessions.values()
                if not s.expired and now - s.last_seen_ms > s.timeout_ms]
        for s in gone:
            self.expire(s.session_id)
        return [s.session_id for s in gone]

    def expire(self, session_id: int) -> None:
        s = self.sessions.get(session_id)
        if s is None or s.expired:
            return
        s.expired = True
        self.expired_sessions.append(session_id)
        for path in sorted(s.ephemerals):
            if path in self.nodes:
                self._delete(path)
        s.ephemerals.clear()

    def close_session(self, session_id: int) -> None:
        self.expire(session_id)

    # -- reads ---------------------------------------------------------------------------
    def get(self, path: str, watch: WatchCallback | None = None) -> tuple[Any, Stat] | None:
        if watch is not None:
            self._data_watches.setdefault(path, []).append(watch)
        node = self.nodes.get(path)
        return None if node is None else (node.data, node.stat)

    def exists(self, path: str, watch: WatchCallback | None = None) -> Stat | None:
        got = self.get(path, watch)
        return None if got is None else got[1]

    def get_children(self, path: str, watch: WatchCallback | None = None) -> list[str]:
        if watch is not None:
            self._child_watches.setdefault(path, []).append(watch)
        prefix = path.rstrip("/") + "/"
        return sorted(p[len(prefix):] for p in self.nodes
                      if p.startswith(prefix) and "/" not in p[len(prefix):])

    # -- writes --------------------------------------------------------------------------
    def create(self, path: str, data: Any = None, *, session_id: int = 0,
               sequential: bool = False, make_parents: bool = True) -> tuple[ZkCode, str]:
        if session_id and not self.touch(session_id):
            return ZkCode.SESSION_EXPIRED, path
        if sequential:
            n = self._seq_counters.get(path, 0)
            self._seq_counters[path] = n + 1
            path = f"{path}{n:010d}"
        if path in self.nodes:
            return ZkCode.NODE_EXISTS, path
        parent = path.rsplit("/", 1)[0] or "/"
        if parent not in self.nodes:
            if not make_parents:
                return ZkCode.NO_NODE, path
            self.create(parent, None)
        self.zxid += 1
        self.nodes[path] = ZNode(data, Stat(0, self.zxid, self.zxid, session_id))
        if session_id:
            self.sessions[session_id].ephemerals.add(path)
        self._fire(self._data_watches, path, "created")
        self._fire(self._child_watches, parent, "child")
        return ZkCode.OK, path

    def set_data(self, path: str, data: Any, version: int = -1, *,
                 session_id: int = 0) -> tuple[ZkCode, Stat | None]:
        """Compare-and-set when `version` >= 0: succeeds only if the znode is at `version`."""
        if session_id and not self.touch(session_id):
            return ZkCode.SESSION_EXPIRED, None
        node = self.nodes.get(path)
        if node is None:
            return ZkCode.NO_NODE, None
        if version >= 0 and node.stat.version != version:
            return ZkCode.BAD_VERSION, node.stat
        self.zxid += 1
        node.data = data
        node.stat = Stat(node.stat.version + 1, node.stat.czxid, self.zxid,
                         node.stat.ephemeral_owner)
        self._fire(self._data_watches, path, "changed")
        return ZkCode.OK, node.stat

    def delete(self, path: str, version: int = -1, *, session_id: int = 0) -> ZkCode:
        if session_id and not self.touch(session_id):
            return ZkCode.SESSION_EXPIRED
        node = self.nodes.get(path)
        if node is None:
            return ZkCode.NO_NODE
        if version >= 0 and node.stat.version != version:
            return ZkCode.BAD_VERSION
        self._delete(path)
        return ZkCode.OK

    def _delete(self, path: str) -> None:
        node = self.nodes.pop(path)
        self.zxid += 1
        owner = node.stat.ephemeral_owner
        if owner and owner in self.sessions:
            self.sessions[owner].ephemerals.discard(path)
        self._fire(self._data_watches, path, "deleted")
        self._fire(self._child_watches, path.rsplit("/", 1)[0] or "/", "child")

    def _fire(self, table: dict[str, list[WatchCallback]], path: str, event: str) -> None:
        watchers = table.pop(path, None)
        if watchers:
            for cb in watchers:
                self.scheduler.schedule(self.watch_delay_ms, cb, event, path)

    # -- controller.zk_interface.ZooKeeperClient -----------------------------------------------
    def _check_controller_epoch(self, expected_epoch_zk_version: int | None) -> None:
        if expected_epoch_zk_version is None:
            return
        node = self.nodes.get(zk_data.CONTROLLER_EPOCH_PATH)
        if node is None or node.stat.version != expected_epoch_zk_version:
            raise ControllerMovedError(
                f"{zk_data.CONTROLLER_EPOCH_PATH} version is no longer"
                f" {expected_epoch_zk_version}: another controller was elected")

    def get_all_broker_ids(self) -> list[int]:
        return sorted(int(c) for c in self.get_children(zk_data.BROKER_IDS_PATH) if c.isdigit())

    def get_broker(self, broker_id: int) -> tuple[zk_data.BrokerInfo, int] | None:
        got = self.get(zk_data.broker_path(broker_id))
        if got is None:
            return None
        return zk_data.BrokerInfo.decode(broker_id, got[0]), got[1].czxid

    def get_partition_state(self, tp: TopicPartitionT) -> LeaderIsrAndControllerEpoch | None:
        node = self.nodes.get(zk_data.partition_state_path(tp))
        if node is None:
            return None
        return LeaderIsrAndControllerEpoch.decode(tp, node.data, node.stat.version)

    def create_partition_states(
        self,
        states: Mapping[TopicPartitionT, LeaderIsrAndControllerEpoch],
        expected_epoch_zk_version: int | None = None,
    ) -> dict[TopicPartitionT, bool]:
        self._check_controller_epoch(expected_epoch_zk_version)
        gone = sorted({tp[0] for tp in states if zk_data.topic_path(tp[0]) not in self.nodes})
        if gone:
            raise NoTopicError(f"topic(s) {', '.join(gone)} do not exist")
        out: dict[TopicPartitionT, bool] = {}
        for tp, state in states.items():
            code, _ = self.create(zk_data.partition_state_path(tp), state.encode())
            out[tp] = code is ZkCode.OK
        return out

    def update_leader_and_isr(
        self,
        tp: TopicPartitionT,
        state: LeaderIsrAndControllerEpoch,
        expected_zk_version: int,
        expected_epoch_zk_version: int | None = None,
        *,
        session_id: int = 0,
    ) -> tuple[bool, int]:
        self._check_controller_epoch(expected_epoch_zk_version)
        code, stat = self.set_data(zk_data.partition_state_path(tp), state.encode(),
                                   expected_zk_version, session_id=session_id)
        if code is ZkCode.OK and stat is not None:
            return True, stat.version
        if code is ZkCode.SESSION_EXPIRED:
            raise ZkClientError(f"session {session_id:#x} expired")
        if code is ZkCode.BAD_VERSION:
            return self._lost_compare_and_set(tp, state)
        return False, -1

    def update_leader_and_isr_many(
        self,
        updates: Iterable[tuple[TopicPartitionT, LeaderIsrAndControllerEpoch, int]],
        expected_epoch_zk_version: int | None = None,
    ) -> dict[TopicPartitionT, tuple[bool, int]]:
        self._check_controller_epoch(expected_epoch_zk_version)
        return {(tp[0], tp[1]): self.update_leader_and_isr(tp, state, expected)
                for tp, state, expected in updates}

    def _notify(self, prefix_path: str, data: bytes, session_id: int) -> str:
        """A sequential notification znode (`prefix_path` + sequence number); its name."""
        code, path = self.create(prefix_path, data, session_id=session_id, sequential=True)
        if code is not ZkCode.OK:
            raise ZkClientError(f"{path}: {code.value}")
        return path.rsplit("/", 1)[-1]

    def _notifications(self, parent: str, prefix: str,
                       sequence_number: Callable[[str], str]) -> list[str]:
        """The sequence numbers of the notifications under `parent`, oldest first."""
        return sorted(sequence_number(c) for c in self.get_children(parent)
                      if c.startswith(prefix))

    def propagate_isr_changes(self, partitions: Iterable[TopicPartitionT], *,
                              session_id: int = 0) -> str:
        return self._notify(
            f"{zk_data.ISR_CHANGE_NOTIFICATION_PATH}/{zk_data.ISR_CHANGE_PREFIX}",
            zk_data.encode_isr_change_notification(partitions), session_id)

    def get_all_isr_change_notifications(self) -> list[str]:
        return self._notifications(zk_data.ISR_CHANGE_NOTIFICATION_PATH,
                                   zk_data.ISR_CHANGE_PREFIX, zk_data.isr_change_sequence_number)

    def delete_isr_change_notifications(
        self,
        sequence_numbers: Iterable[str] | None = None,
        expected_epoch_zk_version: int | None = None,
    ) -> None:
        self._check_controller_epoch(expected_epoch_zk_version)
        seqs = (list(sequence_numbers) if sequence_numbers is not None
                else self.get_all_isr_change_notifications())
        for seq in seqs:
            self.delete(zk_data.isr_change_path(seq))

    def propagate_log_dir_event(self, broker_id: int, *, session_id: int = 0) -> str:
        """A broker's log dir failed (Kafka's propagateLogDirEvent): a sequential
        /log_dir_event_notification/log_dir_event_<seq> naming it; returns its name."""
        return self._notify(zk_data.log_dir_event_path(""),
                            zk_data.encode_log_dir_event_notification(broker_id), session_id)

    def get_all_log_dir_event_notifications(self) -> list[str]:
        return self._notifications(zk_data.LOG_DIR_EVENT_NOTIFICATION_PATH,
                                   zk_data.LOG_DIR_EVENT_PREFIX,
                                   zk_data.log_dir_event_sequence_number)

    def delete_log_dir_event_notifications(self, sequence_numbers: Iterable[str],
                                           expected_epoch_zk_version: int | None = None) -> None:
        self._check_controller_epoch(expected_epoch_zk_version)
        for seq in sequence_numbers:
            self.delete(zk_data.log_dir_event_path(seq))

    def set_unclean_replicas(
        self,
        marks: Mapping[TopicPartitionT, Iterable[int]],
        expected_epoch_zk_version: int | None = None,
    ) -> None:
        self._check_controller_epoch(expected_epoch_zk_version)
        data = zk_data.encode_unclean_replicas(marks)
        if self.set_data(zk_data.UNCLEAN_REPLICAS_PATH, data)[0] is ZkCode.NO_NODE:
            self.create(zk_data.UNCLEAN_REPLICAS_PATH, data)

    def get_topic_assignment(self, topic: str) -> dict[int, list[int]] | None:
        node = self.nodes.get(zk_data.topic_path(topic))
        return None if node is None else zk_data.decode_topic_znode(topic, node.data)[0]

    def get_topic_reassignments(
        self, topic: str
    ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        node = self.nodes.get(zk_data.topic_path(topic))
        return ({}, {}) if node is None else zk_data.decode_topic_reassignments(topic, node.data)

    def set_topic_assignment(
        self,
        topic: str,
        assignment: Mapping[int, Sequence[int]],
        expected_version: int = -1,
        expected_epoch_zk_version: int | None = None,
        topic_id: UUID | None = None,
        adding: Mapping[int, Sequence[int]] | None = None,
        removing: Mapping[int, Sequence[int]] | None = None,
    ) -> int:
        self._check_controller_epoch(expected_epoch_zk_version)
        data = zk_data.encode_topic_assignment(assignment, topic_id, adding, removing)
        code, stat = self.set_data(zk_data.topic_path(topic), data, expected_version)
        if code is ZkCode.BAD_VERSION:
            raise ZnodeVersionError(
                f"{zk_data.topic_path(topic)} is no longer at version {expected_version}")
        if code is not ZkCode.OK or stat is None:
            raise ZkClientError(f"{zk_data.topic_path(topic)}: {code.value}")
        return stat.version

    def get_partition_reassignment(self) -> dict[TopicPartitionT, list[int]] | None:
        node = self.nodes.get(REASSIGN_PARTITIONS_PATH)
        if node is None:
            return None
        try:
            return {(tp.topic, tp.partition): rs
                    for tp, rs in decode_reassign_partitions(node.data).items()}
        except ValueError:
            return {}

    def set_partition_reassignment(
        self, targets: Mapping[TopicPartitionT, Sequence[int]],
        expected_epoch_zk_version: int | None = None,
    ) -> None:
        self._check_controller_epoch(expected_epoch_zk_version)
        if not targets:
            self.delete(REASSIGN_PARTITIONS_PATH)
        elif self.set_data(REASSIGN_PARTITIONS_PATH, encode_reassign_partitions(targets)
                           )[0] is ZkCode.NO_NODE:
            self.create(REASSIGN_PARTITIONS_PATH, encode_reassign_partitions(targets))

    def get_data_and_version(self, path: str) -> tuple[bytes | None, int]:
        node = self.nodes.get(path)
        return (None, -1) if node is None else (node.data, node.stat.version)

    def create_path(self, path: str, data: bytes) -> bool:
        return self.create(path, data)[0] is ZkCode.OK

    def conditional_update_path(self, path: str, data: bytes, expected_version: int) -> bool:
        return self.set_data(path, data, expected_version)[0] is ZkCode.OK
