"""The ZooKeeper operations the controller and the brokers need, as one interface.

Two implementations: `KafkaZkClient` (zk_client.py, over kazoo, against a real ZooKeeper) and
`SimZooKeeper` (sim/zookeeper.py, the simulator's). Both store Kafka's znode layout and JSON
encodings (zk_data.py), so a decision written by one controller reads the same in the other.
The controller's decisions are carried out over this interface by `executor.DecisionExecutor`,
the one execute loop of both drivers.

Writes that a controller makes pass `expected_epoch_zk_version` (the version of
/controller_epoch it was elected at): ZooKeeper checks it in the same transaction and the write
raises `ControllerMovedError` once another controller was elected (Kafka's
`checkControllerAndUpdate`). A leader's own ISR update passes None.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol
from uuid import UUID

from tidelog.controller import zk_data
from tidelog.controller.zk_data import BrokerInfo, LeaderIsrAndControllerEpoch, TopicPartitionT
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition

__all__ = [
    "ControllerMovedError",
    "KafkaZkReads",
    "NoTopicError",
    "ZkClientError",
    "ZnodeVersionError",
    "ZooKeeperClient",
    "from_zk_state",
    "to_zk_state",
]

log = logging.getLogger(__name__)


class ZkClientError(RuntimeError):
    """A ZooKeeper operation failed (connection, timeout, unexpected state)."""


class ControllerMovedError(ZkClientError):
    """/controller_epoch changed: this controller was deposed and must not write."""


class ZnodeVersionError(ZkClientError):
    """A conditional write met another version of the znode: someone wrote it meanwhile."""


class NoTopicError(ZkClientError):
    """A partition state was to be created under a topic whose znode is gone (deleted
    meanwhile): a deleted topic is never resurrected."""


class ZooKeeperClient(Protocol):
    # -- broker registrations (/brokers/ids/<id>, ephemeral, Kafka's JSON) ---------------------
    def get_all_broker_ids(self) -> list[int]: ...

    def get_broker(self, broker_id: int) -> tuple[BrokerInfo, int] | None:
        """(registration, broker epoch = the znode's creation zxid), None if not registered."""
        ...

    def get_all_brokers_and_epochs(self) -> dict[int, tuple[BrokerInfo, int]]: ...

    # -- partition states (/brokers/topics/<t>/partitions/<p>/state) ----------------------------
    def get_partition_state(self, tp: TopicPartitionT) -> LeaderIsrAndControllerEpoch | None:
        """The state with `zk_version` set to the znode's version, or None."""
        ...

    def get_partition_states(
        self, tps: Iterable[TopicPartitionT]
    ) -> dict[TopicPartitionT, LeaderIsrAndControllerEpoch]: ...

    def create_partition_states(
        self,
        states: Mapping[TopicPartitionT, LeaderIsrAndControllerEpoch],
        expected_epoch_zk_version: int | None = None,
    ) -> dict[TopicPartitionT, bool]:
        """True = created, False = already existed; `NoTopicError` when the topic is gone."""
        ...

    def update_leader_and_isr(
        self,
        tp: TopicPartitionT,
        state: LeaderIsrAndControllerEpoch,
        expected_zk_version: int,
        expected_epoch_zk_version: int | None = None,
    ) -> tuple[bool, int]:
        """Compare-and-set on the state znode's version: (ok, new zk version). A lost
        compare-and-set whose znode already holds exactly `state` is our own earlier write
        (Kafka's `checkLeaderAndIsrZkData`): ok."""
        ...

    def update_leader_and_isr_many(
        self,
        updates: Iterable[tuple[TopicPartitionT, LeaderIsrAndControllerEpoch, int]],
        expected_epoch_zk_version: int | None = None,
    ) -> dict[TopicPartitionT, tuple[bool, int]]: ...

    # -- ISR change notifications (/isr_change_notification) ------------------------------------
    def propagate_isr_changes(self, partitions: Iterable[TopicPartitionT]) -> str:
        """A sequential notification for the controller; returns its name."""
        ...

    def get_all_isr_change_notifications(self) -> list[str]:
        """The sequence numbers of pending notifications, oldest first."""
        ...

    def get_partitions_from_isr_change_notifications(
        self, sequence_numbers: Iterable[str]
    ) -> set[TopicPartitionT]: ...

    def delete_isr_change_notifications(
        self,
        sequence_numbers: Iterable[str] | None = None,
        expected_epoch_zk_version: int | None = None,
    ) -> None: ...

    # -- log dir event notifications (/log_dir_event_notification) --------------------------------
    def get_all_log_dir_event_notifications(self) -> list[str]:
        """The sequence numbers of pending log dir events, oldest first."""
        ...

    def get_broker_ids_from_log_dir_events(self, sequence_numbers: Iterable[str]) -> list[int]:
        """The brokers the notifications name (one deleted meanwhile is skipped)."""
        ...

    def delete_log_dir_event_notifications(self, sequence_numbers: Iterable[str],
                                           expected_epoch_zk_version: int | None = None) -> None:
        """Delete handled notifications, fenced by the controller epoch."""
        ...

    # -- KIP-966 marks (/tidelog/unclean_replicas) ------------------------------------------------
    def get_unclean_replicas(self) -> dict[TopicPartitionT, set[int]]: ...

    def set_unclean_replicas(
        self,
        marks: Mapping[TopicPartitionT, Iterable[int]],
        expected_epoch_zk_version: int | None = None,
    ) -> None: ...

    # -- topic assignments (/brokers/topics/<t>) and /admin/reassign_partitions -----------------
    def get_topic_assignment(self, topic: str) -> dict[int, list[int]] | None: ...

    def get_topic_reassignments(
        self, topic: str
    ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """The topic znode's (adding_replicas, removing_replicas); empty when no topic."""
        ...

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
        """Overwrite a topic's assignment (with the moving partitions' adding/removing
        replicas); returns the znode's new version. `ZnodeVersionError` when
        `expected_version` (>= 0) is no longer the znode's."""
        ...

    def get_partition_reassignment(self) -> dict[TopicPartitionT, list[int]] | None:
        """The legacy znode's targets; None when absent."""
        ...

    def set_partition_reassignment(
        self, targets: Mapping[TopicPartitionT, Sequence[int]],
        expected_epoch_zk_version: int | None = None,
    ) -> None:
        """Rewrite the legacy znode, deleting it when empty."""
        ...

    # -- plain znodes (Kafka's getDataAndVersion / conditionalUpdatePath) ---------------------------
    def get_data_and_version(self, path: str) -> tuple[bytes | None, int]:
        """(data, version); (None, -1) when the znode does not exist."""
        ...

    def create_path(self, path: str, data: bytes) -> bool:
        """Create a persistent znode (and its parents); False if it already existed."""
        ...

    def conditional_update_path(self, path: str, data: bytes, expected_version: int) -> bool:
        """Set the data iff the znode is at `expected_version`; False otherwise."""
        ...


class KafkaZkReads(ZooKeeperClient):
    """The operations that follow from the primitives above, written once for both
    implementations (which subclass this)."""

    def get_all_brokers_and_epochs(self) -> dict[int, tuple[BrokerInfo, int]]:
        out: dict[int, tuple[BrokerInfo, int]] = {}
        for broker_id in self.get_all_broker_ids():
            found = self.get_broker(broker_id)
            if found is not None:  # it may have gone between the listing and the read
                out[broker_id] = found
        return out

    def get_partition_states(
        self, tps: Iterable[TopicPartitionT]
    ) -> dict[TopicPartitionT, LeaderIsrAndControllerEpoch]:
        out: dict[TopicPartitionT, LeaderIsrAndControllerEpoch] = {}
        for tp in tps:
            s = self.get_partition_state(tp)
            if s is not None:
                out[tp] = s
        return out

    def get_partitions_from_isr_change_notifications(
        self, sequence_numbers: Iterable[str]
    ) -> set[TopicPartitionT]:
        out: set[TopicPartitionT] = set()
        for seq in sequence_numbers:
            path = zk_data.isr_change_path(seq)
            data, _ = self.get_data_and_version(path)
            if data is not None:  # else deleted by an earlier controller
                out |= zk_data.decode_isr_change_notification(path, data)
        return out

    def get_broker_ids_from_log_dir_events(self, sequence_numbers: Iterable[str]) -> list[int]:
        out: list[int] = []
        for seq in sequence_numbers:
            path = zk_data.log_dir_event_path(seq)
            data, _ = self.get_data_and_version(path)
            if data is not None:  # else deleted by an earlier controller
                out.append(zk_data.decode_log_dir_event_notification(path, data))
        return out

    def get_unclean_replicas(self) -> dict[TopicPartitionT, set[int]]:
        """The replicas marked as back from an unclean shutdown, per partition ({} if none)."""
        data, _ = self.get_data_and_version(zk_data.UNCLEAN_REPLICAS_PATH)
        if data is None:
            return {}
        try:
            return zk_data.decode_unclean_replicas(data)
        except zk_data.ZkDataError as e:
            log.warning("ignoring %s", e)
            return {}

    def _lost_compare_and_set(self, tp: TopicPartitionT,
                              state: LeaderIsrAndControllerEpoch) -> tuple[bool, int]:
        """A state write that met another version: ok if the znode holds exactly `state` (our
        own write whose answer was lost: Kafka's `checkLeaderAndIsrZkData`)."""
        current = self.get_partition_state(tp)
        if current is not None and current.same_state(state):
            return True, current.zk_version
        return False, -1


def to_zk_state(state: LeaderAndIsrPartitionState) -> LeaderIsrAndControllerEpoch:
    return LeaderIsrAndControllerEpoch(state.leader, state.leader_epoch, tuple(state.isr),
                                       state.controller_epoch, state.zk_version)


def from_zk_state(tp: TopicPartition, state: LeaderIsrAndControllerEpoch,
                  replicas: Iterable[int]) -> LeaderAndIsrPartitionState:
    return LeaderAndIsrPartitionState(
        topic=tp.topic, partition=tp.partition, controller_epoch=state.controller_epoch,
        leader=state.leader, leader_epoch=state.leader_epoch, isr=tuple(state.isr),
        zk_version=state.zk_version, replicas=tuple(replicas))
