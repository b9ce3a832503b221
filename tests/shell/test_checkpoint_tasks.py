"""The checkpoint tasks (`highwatermark-checkpoint`, `kafka-recovery-point-checkpoint`) read
their values on the shell's thread and write the files on the driver's `DiskExecutor`, as Kafka
writes them on its scheduler threads: here a disk that runs the work only when the test says."""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from test_shell_replica_manager import TP, Broker, Clock, state

from tidelog.protocol.records.builder import build_values
from tidelog.shell.interfaces import RunInline
from tidelog.shell.log_tasks import CheckpointTask, LogTaskIntervals, schedule_log_tasks
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager


class HeldDisk:
    """A `DiskExecutor` whose work waits until `finish`."""

    def __init__(self) -> None:
        self.held: list[tuple[str, Callable[[], Any], Callable[[Any], None]]] = []

    def run(self, name: str, work: Callable[[], Any], then: Callable[[Any], None]) -> None:
        self.held.append((name, work, then))

    def finish(self) -> None:
        _, work, then = self.held.pop(0)
        then(work())


def hw_file(io: MemoryFileIO) -> dict[tuple[str, int], int]:
    return OffsetCheckpointFile.in_dir(io, "/b1", REPLICATION_OFFSET_CHECKPOINT).read()


def leader_with_records(disk: HeldDisk, n: int) -> Broker:
    b = Broker(1, disk=disk)
    b.rm.become_leader_or_follower(0, 1, 100, [state(1, 0, (1,))], {1})
    b.rm.append_records(1, {TP: build_values([b"x"] * n)}, 5000, "p0", lambda _: None)
    assert b.rm.core.partition(TP).high_watermark == n
    return b


def test_the_high_watermarks_are_read_at_the_run_and_written_on_the_disk_executor() -> None:
    disk = HeldDisk()
    b = leader_with_records(disk, 3)
    written: list[int] = []
    b.rm.high_watermark_checkpoint.on_written = lambda: written.append(1)
    b.rm.startup()
    b.clock.advance(0)  # the first run
    assert [name for name, _, _ in disk.held] == ["highwatermark-checkpoint"]
    assert not b.io.exists("/b1/" + REPLICATION_OFFSET_CHECKPOINT) and written == []

    b.rm.append_records(1, {TP: build_values([b"y", b"z"])}, 5000, "p1", lambda _: None)
    b.clock.advance(500)  # the next run, while the first still writes: skipped
    assert len(disk.held) == 1
    disk.finish()
    assert hw_file(b.io) == {("t", 0): 3}  # the values of its run, not of the write's time
    assert written == [1]

    b.clock.advance(500)
    disk.finish()
    assert hw_file(b.io) == {("t", 0): 5} and written == [1, 1]


def test_a_failed_checkpoint_write_takes_its_dir_offline_on_the_shells_thread() -> None:
    disk = HeldDisk()
    b = leader_with_records(disk, 2)
    reported: list[str] = []
    b.lm.log_dir_failure_channel.offline_listeners.append(reported.append)
    written: list[int] = []
    b.rm.high_watermark_checkpoint.on_written = lambda: written.append(1)
    b.rm.startup()
    b.clock.advance(0)
    b.io.fail_io("/b1", errno.EIO)
    _, work, then = disk.held.pop(0)
    failed = work()  # where the driver's worker would run it: nothing reported from there
    assert list(failed) == ["/b1"] and reported == []
    then(failed)
    assert reported == ["/b1"] and written == []
    b.io.heal()
    b.clock.advance(500)  # the task goes on (the handler takes the dir offline meanwhile)
    assert len(disk.held) == 1


def test_the_recovery_point_checkpoint_writes_on_the_disk_executor_too() -> None:
    disk = HeldDisk()
    b = leader_with_records(disk, 1)
    b.rm.startup()
    b.clock.advance(30_000)  # log.initial.task.delay.ms
    names = sorted(name for name, _, _ in disk.held)
    assert names == ["highwatermark-checkpoint", "kafka-recovery-point-checkpoint"]
    assert not b.io.exists("/b1/recovery-point-offset-checkpoint")
    while disk.held:
        disk.finish()
    for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
        assert OffsetCheckpointFile.in_dir(b.io, "/b1", name).read() == {("t", 0): 0}


def test_a_stopped_broker_starts_no_checkpoint_and_ignores_one_under_way() -> None:
    disk = HeldDisk()
    b = leader_with_records(disk, 1)
    written: list[int] = []
    b.rm.high_watermark_checkpoint.on_written = lambda: written.append(1)
    b.rm.startup()
    b.clock.advance(0)
    b.rm.shutdown()
    disk.finish()  # (the driver's shutdown waits for it)
    assert written == []
    task: CheckpointTask = b.rm.high_watermark_checkpoint
    task()
    assert disk.held == []


def test_a_broker_without_a_disk_executor_writes_at_once() -> None:
    """The simulator's memory disk never blocks: no executor, the file is there after the run."""
    io = MemoryFileIO()
    lm = LogManager(["/b1"], LogConfig(), io)
    lm.get_or_create_log("t", 0).append_as_leader(build_values([b"v"]), 0, 0)
    task = CheckpointTask("kafka-recovery-point-checkpoint", lm,
                          ("recovery-point-offset-checkpoint",), RunInline())
    task()
    assert OffsetCheckpointFile.in_dir(io, "/b1", "recovery-point-offset-checkpoint").read() \
        == {("t", 0): 0}


def test_a_retired_dir_is_removed_on_the_disk_executor() -> None:
    """kafka-delete-logs takes the due dirs off the queue on the shell's thread and removes
    their files on the disk executor (a large log's unlinks held the loop 35-70 ms); a
    failure is reported back on the shell's thread."""
    clock, fio, disk = Clock(), MemoryFileIO(), HeldDisk()
    lm = LogManager(["/b1"], LogConfig(file_delete_delay_ms=60_000), fio)
    for p in (0, 1):
        lm.get_or_create_log("t", p).append_as_leader(build_values([b"v"]), 0, clock.now)
    reported: list[str] = []
    lm.log_dir_failure_channel.offline_listeners.append(reported.append)
    schedule_log_tasks(lm, clock, clock, LogTaskIntervals(), disk=disk)
    lm.delete_log("t", 0, clock.now)
    (retired,) = [n for n in fio.listdir("/b1") if n.endswith("-delete")]
    clock.advance(60_000)
    assert [n for n, _, _ in disk.held][-1] == "kafka-delete-logs"
    assert retired in fio.listdir("/b1") and lm.logs_to_be_deleted == []
    while disk.held:
        disk.finish()
    assert retired not in fio.listdir("/b1")

    lm.delete_log("t", 1, clock.now)
    clock.advance(60_000)
    fio.fail_io("/b1", errno.EIO)
    _, work, then = disk.held.pop()
    then(work())
    assert reported == ["/b1"]
