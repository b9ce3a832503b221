"""The shell's LogDirFailureHandler (Kafka's): a log dir reported failed is handled in its own
task, takes the dir's partitions offline, then tells the controller, or halts the broker when
no dir is left."""

from __future__ import annotations

import errno

from test_shell_replica_manager import Clock, EndPoint, IsrWriter

from tidelog.protocol.records.builder import build_values
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors
from tidelog.replication.types import (
    CONSUMER_REPLICA_ID,
    MAX_TIMESTAMP,
    LeaderAndIsrPartitionState,
    TopicPartition,
)
from tidelog.shell.replica_manager import ReplicaManager
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


class Handling:
    """The driver's LogDirFailureHandling: what the shell asked for, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def propagate_log_dir_event(self) -> None:
        self.calls.append("propagate")

    def halt(self, reason: str) -> None:
        self.calls.append(f"halt: {reason}")


def broker(handling: Handling | None) -> tuple[ReplicaManager, Clock, MemoryFileIO]:
    io, clock = MemoryFileIO(), Clock()
    lm = LogManager(["/d1", "/d2"], LogConfig(), io)
    rm = ReplicaManager(1, lm, ReplicationConfig(), time=clock, scheduler=clock,
                        alter_partition_manager=IsrWriter(),
                        leader_end_point=lambda s, f: EndPoint([], s, f),
                        log_dir_failure=handling)
    rm.startup()
    states = [LeaderAndIsrPartitionState(tp.topic, tp.partition, 1, 1, 0, (1,), 0, (1,),
                                         is_new=True) for tp in (T0, T1)]
    rm.become_leader_or_follower(0, 1, -1, states, {1})
    assert lm.log_dir_of == {T0: "/d1", T1: "/d2"}
    return rm, clock, io


def produce(rm: ReplicaManager, tp: TopicPartition) -> Errors:
    outcome = rm.append_records(1, {tp: bytes(build_values([b"v"]))}, 1000, object(),
                                lambda done: None)
    assert outcome.results is not None
    return outcome.results[tp].error


def test_a_failed_dir_goes_offline_in_its_own_task_then_the_controller_is_told() -> None:
    handling = Handling()
    rm, clock, io = broker(handling)
    io.fail_io("/d1", errno.EIO)
    assert produce(rm, T0) == Errors.KAFKA_STORAGE_ERROR
    assert rm.core.partition(T0) is not None and handling.calls == []  # not inline
    clock.advance(0)
    assert rm.core.partition(T0) is None and rm.log_manager.offline_dirs == {"/d1"}
    assert handling.calls == ["propagate"]
    assert produce(rm, T1) == Errors.NONE


def test_the_broker_halts_when_no_log_dir_is_left() -> None:
    handling = Handling()
    rm, clock, io = broker(handling)
    io.fail_io("/d1", errno.EIO)
    produce(rm, T0)
    clock.advance(0)
    io.fail_io("/d2", errno.ENOSPC, writes_only=True)
    assert produce(rm, T1) == Errors.KAFKA_STORAGE_ERROR
    clock.advance(0)
    assert handling.calls == ["propagate", "halt: all log dirs in /d1, /d2 have failed"]


def test_without_a_handling_the_driver_keeps_its_dirs() -> None:
    rm, clock, io = broker(None)
    io.fail_io("/d1", errno.EIO)
    assert produce(rm, T0) == Errors.KAFKA_STORAGE_ERROR
    clock.advance(0)
    assert rm.log_manager.offline_dirs == set() and rm.core.partition(T0) is not None


def test_a_stopped_shell_no_longer_handles_failures() -> None:
    handling = Handling()
    rm, clock, io = broker(handling)
    rm.shutdown()
    io.fail_io("/d1", errno.EIO)
    assert produce(rm, T0) == Errors.KAFKA_STORAGE_ERROR
    assert clock.tasks == [] or all(t.cancelled for t in clock.tasks)  # nothing scheduled
    clock.advance(0)
    assert handling.calls == [] and rm.log_manager.offline_dirs == set()


def test_a_dir_reported_before_the_startup_is_handled_once_started() -> None:
    handling = Handling()
    io, clock = MemoryFileIO(), Clock()
    lm = LogManager(["/d1", "/d2"], LogConfig(), io)
    lm.log_dir_failure_channel.maybe_add_offline_log_dir("/d1", "failed before the startup")
    rm = ReplicaManager(1, lm, ReplicationConfig(), time=clock, scheduler=clock,
                        alter_partition_manager=IsrWriter(),
                        leader_end_point=lambda s, f: EndPoint([], s, f),
                        log_dir_failure=handling)
    rm.startup()
    clock.advance(0)
    assert lm.offline_dirs == {"/d1"} and handling.calls == ["propagate"]


def test_a_list_offsets_disk_error_is_the_partitions_storage_error() -> None:
    """ListOffsets by time and by MAX_TIMESTAMP read the log (the broker's ListOffsets answers
    from here): a disk error is KAFKA_STORAGE_ERROR for that partition alone, its dir reported
    (Kafka's fetchOffsetForTimestamp), not an exception that closes the client's connection."""
    rm, clock, io = broker(Handling())
    for tp in (T0, T1):
        assert produce(rm, tp) == Errors.NONE
    wanted = {T0: (-1, 0), T1: (-1, MAX_TIMESTAMP)}
    healthy = rm.core.list_offsets(CONSUMER_REPLICA_ID, wanted)
    assert [(r.error, r.offset) for r in healthy.values()] == [(Errors.NONE, 0)] * 2
    io.fail_io("/d1", errno.EIO)
    io.fail_io("/d2", errno.EIO)
    answers = rm.core.list_offsets(CONSUMER_REPLICA_ID, wanted)
    assert [(r.error, r.offset) for r in answers.values()] == [(Errors.KAFKA_STORAGE_ERROR, -1)] * 2
    assert rm.log_manager.log_dir_failure_channel.has_queued_dirs()
