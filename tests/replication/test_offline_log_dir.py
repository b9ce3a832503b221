"""A broker with a log dir offline (two log.dirs, one failing at start) does not create an
empty log for a replica that is not new, as Kafka's getOrCreateLog: the replica's data may be
in the offline dir, and an empty log leading would have its followers truncate to nothing.
The LeaderAndIsr gets KAFKA_STORAGE_ERROR for it; a new replica is created in the online dir."""

from __future__ import annotations

from dataclasses import replace

from replication_helpers import TP, state

from tidelog.replication import Errors, ReplicaManager, ReplicationConfig
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

DIRS = ["/disk1", "/disk2"]


def broker_with_disk2_failed() -> tuple[ReplicaManager, MemoryFileIO]:
    fio = MemoryFileIO()
    lm = LogManager(DIRS, LogConfig(), fio)
    rm = ReplicaManager(1, lm, ReplicationConfig())
    # The partition lived on /disk2 before a restart that finds /disk2 failing.
    lm.get_or_create_log("other", 0, is_new=True)
    rm.become_leader_or_follower(0, 1, [replace(state(1, 0, (1, 2, 3)), is_new=True)],
                                 {1, 2, 3}, 0)
    assert lm.log_dir_of[(TP.topic, TP.partition)] == "/disk2"
    lm.shutdown()
    fio.fail_io("/disk2")
    lm = LogManager(DIRS, LogConfig(), fio)
    assert lm.offline_dirs == {"/disk2"}
    return ReplicaManager(1, lm, ReplicationConfig()), fio


def test_an_existing_replica_is_not_recreated_while_a_log_dir_is_offline() -> None:
    rm, fio = broker_with_disk2_failed()
    result = rm.become_leader_or_follower(0, 1, [state(1, 1, (1, 2, 3))], {1, 2, 3}, 0)
    assert result.partition_errors[TP] == Errors.KAFKA_STORAGE_ERROR
    assert rm.partition(TP) is None and f"{TP.topic}-{TP.partition}" not in fio.listdir("/disk1")


def test_a_new_replica_is_created_in_an_online_log_dir() -> None:
    rm, fio = broker_with_disk2_failed()
    result = rm.become_leader_or_follower(
        0, 1, [replace(state(1, 1, (1, 2, 3)), is_new=True)], {1, 2, 3}, 0)
    assert result.partition_errors[TP] == Errors.NONE
    assert rm.partition(TP) is not None and rm.partition(TP).is_leader
    assert f"{TP.topic}-{TP.partition}" in fio.listdir("/disk1")
