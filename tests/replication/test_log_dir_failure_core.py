"""A log dir failing at runtime, in the replication core (Kafka's handleLogDirFailure): every
partition of the dir goes offline at once, whatever its role, and answers KAFKA_STORAGE_ERROR;
the other dir's partitions are untouched."""

from __future__ import annotations

import errno
from dataclasses import replace

from replication_helpers import TP, records, state

from tidelog.replication import Errors, ReplicaManager, ReplicationConfig, TopicPartition
from tidelog.replication.types import CompleteProduce, RemoveFetcher
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

LED = TopicPartition("orders", 1)  # led by broker 1, in the same dir as TP
OTHER = TopicPartition("orders", 2)  # in the other dir


def broker() -> tuple[ReplicaManager, LogManager, MemoryFileIO]:
    fio = MemoryFileIO()
    lm = LogManager(["/disk1", "/disk2"], LogConfig(), fio)
    rm = ReplicaManager(1, lm, ReplicationConfig())
    states = [replace(state(1, 0, (1, 2), tp=TP), is_new=True),
              replace(state(1, 0, (1, 2), tp=OTHER), is_new=True),
              replace(state(2, 0, (1, 2), tp=LED), is_new=True)]
    assert rm.become_leader_or_follower(0, 1, states, {1, 2}, 0).partition_errors == {
        TP: Errors.NONE, OTHER: Errors.NONE, LED: Errors.NONE}
    assert lm.log_dir_of[TP] == lm.log_dir_of[LED] == "/disk1"
    assert lm.log_dir_of[OTHER] == "/disk2"
    return rm, lm, fio


def test_the_failed_dirs_partitions_go_offline_and_answer_kafka_storage_error() -> None:
    rm, lm, fio = broker()
    waiting = rm.append_records(-1, {TP: records(1)}, 30_000, 10, request_key="p1")
    assert waiting.delayed  # follower 2 has not fetched it yet

    fio.fail_io("/disk1", errno.EIO)
    failed = rm.append_records(1, {TP: records(1), OTHER: records(1)}, 30_000, 20)
    assert failed.results is not None
    assert failed.results[TP].error == Errors.KAFKA_STORAGE_ERROR
    assert failed.results[OTHER].error == Errors.NONE
    assert lm.log_dir_failure_channel.take_next_offline_log_dir() == "/disk1"

    actions = rm.handle_log_dir_failure("/disk1", 30)
    # The follower's fetcher and the leader's partition both stop, the dir is offline.
    assert set(actions) == {RemoveFetcher(TP), RemoveFetcher(LED)}
    assert rm.partition(TP) is None and rm.partition(LED) is None
    assert lm.offline_dirs == {"/disk1"}
    # The acks=all request waiting on the failed partition completes with the error.
    [done] = rm.poll_completed(30)
    assert isinstance(done, CompleteProduce) and done.request_key == "p1"
    assert done.results[TP].error == Errors.KAFKA_STORAGE_ERROR
    fetched = rm.fetch_messages(-1, 0, 1, 1 << 20, {TP: (0, -1, 0, 1 << 20),
                                                   OTHER: (0, -1, 0, 1 << 20)}, 40)
    assert fetched.results is not None
    assert fetched.results[TP].error == Errors.KAFKA_STORAGE_ERROR
    assert fetched.results[OTHER].error == Errors.NONE
    # The controller's next LeaderAndIsr learns it (its answer makes the replica offline).
    again = rm.become_leader_or_follower(0, 1, [state(1, 1, (1, 2), tp=TP),
                                                state(2, 1, (1, 2), tp=OTHER)], {1, 2}, 50)
    assert again.partition_errors == {TP: Errors.KAFKA_STORAGE_ERROR, OTHER: Errors.NONE}


def test_a_dir_already_offline_changes_nothing() -> None:
    rm, lm, _ = broker()
    rm.handle_log_dir_failure("/disk1", 0)
    assert rm.handle_log_dir_failure("/disk1", 1) == []
    assert rm.partition(OTHER) is not None and rm.partition(OTHER).is_leader


def test_stop_replica_for_an_offline_partition_is_refused_as_kafka() -> None:
    """Its files are in the failed dir: deleting it now would leave them for the restart."""
    rm, lm, _ = broker()
    rm.handle_log_dir_failure("/disk1", 0)
    result = rm.stop_replicas(0, 1, {TP: True, OTHER: False}, 10)
    assert result.partition_errors == {TP: Errors.KAFKA_STORAGE_ERROR, OTHER: Errors.NONE}
    assert TP in rm.offline_partitions
    produced = rm.append_records(1, {TP: records(1)}, 1000, 20)
    assert produced.results is not None
    assert produced.results[TP].error == Errors.KAFKA_STORAGE_ERROR
