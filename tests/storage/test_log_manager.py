"""LogManager: log dirs, partition dirs, checkpoints, clean shutdown, recovery on start."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import batch

from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from tidelog.storage.cleaner.log_cleaner import CLEANER_OFFSET_CHECKPOINT, cleanable_offsets
from tidelog.storage.errors import KafkaStorageError
from tidelog.storage.file_io import OsFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManager

DIRS = ["/disk1", "/disk2"]


def test_logs_are_spread_over_the_log_dirs_one_dir_per_partition() -> None:
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig(), fio)
    for p in range(4):
        m.get_or_create_log("orders", p)
    assert m.get_or_create_log("orders", 0) is m.get_log("orders", 0)
    assert fio.listdir("/disk1") == ["orders-0", "orders-2"]
    assert fio.listdir("/disk2") == ["orders-1", "orders-3"]
    assert m.get_log("orders", 9) is None
    assert len(m.all_logs()) == 4


class _CountedDirs(dict[Any, str]):
    """A LogManager's log -> dir map that counts the walks over every log's dir."""

    walks = 0

    def values(self) -> Any:
        _CountedDirs.walks += 1
        return super().values()


def test_with_one_live_log_dir_a_new_log_goes_there_without_counting_every_log() -> None:
    # Kafka's nextLogDirs: a count of every log's dir per new log made a LeaderAndIsr that
    # creates 10,000 logs quadratic (50 million steps in Python).
    m = LogManager(["/only"], LogConfig(), MemoryFileIO())
    m.log_dir_of = _CountedDirs()
    _CountedDirs.walks = 0
    for p in range(50):
        m.get_or_create_log("orders", p, is_new=True)
    assert _CountedDirs.walks == 0
    assert {m.log_dir_of[("orders", p)] for p in range(50)} == {"/only"}
    # With two, the fewest logs first: one count per new log, dirs alternating.
    two = LogManager(DIRS, LogConfig(), MemoryFileIO())
    two.log_dir_of = _CountedDirs(two.log_dir_of)
    _CountedDirs.walks = 0
    for p in range(4):
        two.get_or_create_log("orders", p, is_new=True)
    assert _CountedDirs.walks == 4
    assert [two.log_dir_of[("orders", p)] for p in range(4)] == DIRS * 2


def test_topic_configs_apply_to_their_logs() -> None:
    fio = MemoryFileIO()
    special = LogConfig.from_dict({"segment.bytes": "4096"})
    m = LogManager(DIRS, LogConfig(), fio, topic_configs={"small": special})
    assert m.get_or_create_log("small", 0).config.segment_bytes == 4096
    assert m.get_or_create_log("big", 0).config.segment_bytes == 1 << 30


def test_a_clean_shutdown_skips_recovery_and_restores_every_offset() -> None:
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig(), fio)
    for p in range(3):
        log = m.get_or_create_log("t", p)
        for _ in range(p + 2):
            log.append_as_leader(batch(), 1, 0)
        log.update_high_watermark(p + 1)
    m.shutdown()
    assert fio.exists(f"/disk1/{CLEAN_SHUTDOWN_FILE}")
    assert OffsetCheckpointFile(fio, "/disk1/replication-offset-checkpoint").read() == {
        ("t", 0): 1, ("t", 2): 3,
    }
    fio.crash()  # nothing is lost: everything was flushed
    again = LogManager(DIRS, LogConfig(), fio)
    assert again.had_clean_shutdown == {"/disk1": True, "/disk2": True}
    assert not fio.exists(f"/disk1/{CLEAN_SHUTDOWN_FILE}")  # the next crash is unclean
    got = {tp: (log.log_end_offset, log.high_watermark, log.recovery_point)
           for tp, log in again.logs.items()}
    assert got == {("t", 0): (2, 1, 2), ("t", 1): (3, 2, 3), ("t", 2): (4, 3, 4)}


def test_an_unclean_start_recovers_from_the_checkpointed_recovery_points() -> None:
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig(), fio)
    log = m.get_or_create_log("t", 0)
    for _ in range(5):
        log.append_as_leader(batch(), 0, 0)
    log.flush()
    m.checkpoint_logs()
    for _ in range(5):
        log.append_as_leader(batch(), 0, 0)
    fio.crash(random.Random(3), tear=True)
    again = LogManager(DIRS, LogConfig(), fio)
    recovered = again.get_log("t", 0)
    assert recovered is not None
    assert 5 <= recovered.log_end_offset <= 10
    assert again.had_clean_shutdown["/disk1"] is False


def test_broken_checkpoints_and_garbage_do_not_stop_the_start() -> None:
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig(), fio)
    m.get_or_create_log("t", 0).append_as_leader(batch(), 0, 0)
    m.shutdown()
    fio.write_file("/disk1/recovery-point-offset-checkpoint", b"7\n0\n")
    fio.write_file("/disk1/log-start-offset-checkpoint", b"0\n5\n")
    fio.write_file("/disk1/junk-x", b"not a partition")
    fio.write_file("/disk1/stray-3", b"a file named like a partition")
    fio.write_file("/disk1/gone-1-delete/00000000000000000000.log", b"")
    again = LogManager(DIRS, LogConfig(), fio)
    assert list(again.logs) == [("t", 0)]
    assert again.get_log("t", 0).log_end_offset == 1  # type: ignore[union-attr]
    assert [p for _, p in again.logs_to_be_deleted] == ["/disk1/gone-1-delete"]


def test_a_failing_partition_is_skipped_and_a_failing_dir_goes_offline() -> None:
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig(), fio)
    m.get_or_create_log("t", 0)
    m.get_or_create_log("t", 1)
    m.shutdown()
    fio.fail_io("/disk1/t-0")
    again = LogManager(DIRS, LogConfig(), fio)
    assert list(again.logs) == [("t", 1)] and again.skipped == ["/disk1/t-0"]
    # The replica whose log could not be loaded is not created afresh (unless it is new).
    with pytest.raises(KafkaStorageError, match="its log /disk1/t-0 could not be loaded"):
        again.get_or_create_log("t", 0)
    fio.heal()
    fio.fail_io("/disk2")
    third = LogManager(DIRS, LogConfig(), fio)
    assert third.offline_dirs == {"/disk2"}
    # Kafka's getOrCreateLog: while a dir is offline only a new replica gets a log, since an
    # existing one's data may be in that dir (t-1 is).
    with pytest.raises(KafkaStorageError, match="^Can not create log for t-1 because log "
                                                "directories /disk2 are offline$"):
        third.get_or_create_log("t", 1)
    assert "t-1" not in fio.listdir("/disk1")
    assert third.get_or_create_log("new", 0, is_new=True).dir == "/disk1/new-0"


def test_delete_log_retires_its_dir_then_removes_it_after_the_delay() -> None:
    """Kafka's asyncDelete: the dir is renamed `<tp>.<uuid>-delete` at once (durably) and its
    checkpoint entries go; its files go file.delete.delay.ms later (deleteLogs)."""
    fio = MemoryFileIO()
    m = LogManager(["/d"], LogConfig(file_delete_delay_ms=60_000), fio)
    m.get_or_create_log("t", 0).append_as_leader(batch(), 0, 0)
    m.get_or_create_log("t", 1)
    m.checkpoint_logs()
    assert m.delete_log("t", 0, now_ms=1000)
    assert not m.delete_log("t", 0, now_ms=1000)
    (retired,) = [n for n in fio.listdir("/d") if n.startswith("t-0")]
    assert retired.startswith("t-0.") and retired.endswith("-delete")
    assert "00000000000000000000.log" in fio.listdir(f"/d/{retired}")
    assert OffsetCheckpointFile(fio, "/d/recovery-point-offset-checkpoint").read() == {("t", 1): 0}
    fio.crash()  # the rename was made durable: a power loss does not bring t-0 back
    assert "t-0" not in fio.listdir("/d") and retired in fio.listdir("/d")
    assert m.next_delete_delay_ms(1000) == 60_000
    assert m.delete_logs(60_999) == 0 and retired in fio.listdir("/d")
    assert m.delete_logs(61_000) == 1
    assert fio.listdir("/d") == ["log-start-offset-checkpoint", "recovery-point-offset-checkpoint",
                                 "t-1"]
    assert m.next_delete_delay_ms(61_000) == 60_000  # none waits


def test_values_taken_before_a_deletions_checkpoint_do_not_bring_the_partition_back() -> None:
    """A periodic checkpoint takes its values on the broker's thread and writes them later on
    a worker; a deletion meanwhile writes the same files without the partition. The older
    values, written last, must not put the deleted partition's entries back: a topic created
    again under the name would start from the old log start (records hidden) after a crash."""
    fio = MemoryFileIO()
    m = LogManager(["/d"], LogConfig(), fio)
    log = m.get_or_create_log("t", 0)
    log.append_as_leader(batch(), 0, 0)
    m.get_or_create_log("t", 1)
    taken = m.checkpoint_values((LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT))
    assert ("t", 0) in taken.by_dir["/d"][LOG_START_OFFSET_CHECKPOINT]
    assert m.delete_log("t", 0)
    assert m.write_checkpoint_files(taken) == {}
    for name in (LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT):
        assert OffsetCheckpointFile(fio, f"/d/{name}").read() == {("t", 1): 0}
    # Values taken after that write are written as usual.
    assert m.write_checkpoint_files(m.checkpoint_values((RECOVERY_POINT_CHECKPOINT,))) == {}
    m.get_or_create_log("t", 2)
    m.write_checkpoint_files(m.checkpoint_values((RECOVERY_POINT_CHECKPOINT,)))
    assert OffsetCheckpointFile(fio, f"/d/{RECOVERY_POINT_CHECKPOINT}").read() == {
        ("t", 1): 0, ("t", 2): 0}


def test_a_retired_dir_whose_removal_fails_reports_its_log_dir() -> None:
    """Kafka's deleteLogs removes a retired log with UnifiedLog.delete, whose disk error
    reports the log dir (maybeHandleIOException): the dir goes offline. Only logged before,
    the failing dir stayed online."""
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig(), fio)
    m.get_or_create_log("t", 0).append_as_leader(batch(), 0, 0)
    m.get_or_create_log("t", 1).append_as_leader(batch(), 0, 0)
    failing, other = m.log_dir_of[("t", 0)], m.log_dir_of[("t", 1)]
    m.delete_log("t", 0)
    m.delete_log("t", 1)
    (retired,) = [n for n in fio.listdir(failing) if n.endswith("-delete")]
    fio.fail_io(f"{failing}/{retired}")
    assert m.delete_logs(m.config.file_delete_delay_ms) == 1  # the other dir's
    assert m.log_dir_failure_channel.take_next_offline_log_dir() == failing
    assert not m.log_dir_failure_channel.has_queued_dirs()
    assert not any(n.endswith("-delete") for n in fio.listdir(other))


def test_a_partition_deleted_and_created_again_gets_a_new_dir_beside_the_retired_one() -> None:
    fio = MemoryFileIO()
    m = LogManager(["/d"], LogConfig(), fio)
    m.get_or_create_log("t", 0).append_as_leader(batch(), 0, 0)
    m.delete_log("t", 0)
    again = m.get_or_create_log("t", 0)
    assert again.dir == "/d/t-0" and again.log_end_offset == 0
    again.append_as_leader(batch(), 0, 0)
    assert m.delete_logs(m.config.file_delete_delay_ms) == 1  # the retired one, not the new
    assert [n for n in fio.listdir("/d") if n.startswith("t-0")] == ["t-0"]
    assert m.get_log("t", 0).read(0, 1 << 20).records


def test_a_deleted_partitions_future_log_is_retired_too() -> None:
    """Kafka's asyncDelete(isFuture = true): a replica moving between dirs when its partition
    is deleted leaves its future dir renamed `<tp>.<uuid>-delete`, removed after
    file.delete.delay.ms like the current one, not at once."""
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig(file_delete_delay_ms=60_000), fio)
    m.get_or_create_log("t", 0).append_as_leader(batch(), 0, 0)
    dest = next(d for d in DIRS if d != m.log_dir_of[("t", 0)])
    m.maybe_update_preferred_log_dir("t", 0, dest)
    m.get_or_create_log("t", 0, is_future=True).append_as_follower(batch(), 0)
    assert m.delete_log("t", 0, now_ms=1000)
    assert m.get_future_log("t", 0) is None and m.future_log_dir_of == {}
    (retired,) = [n for n in fio.listdir(dest) if n.startswith("t-0")]
    assert retired.endswith("-delete")
    assert "00000000000000000000.log" in fio.listdir(f"{dest}/{retired}")
    fio.crash()  # the rename was made durable
    assert retired in fio.listdir(dest)
    assert m.delete_logs(60_999) == 0
    assert m.delete_logs(61_000) == 2  # the current log's dir and the future one's
    assert not any(n.startswith("t-0") for d in DIRS for n in fio.listdir(d))


def test_a_deleted_partitions_current_log_is_retired_even_when_its_future_log_fails() -> None:
    """Kafka's asyncDelete retires the current and the future log each on its own: the future
    dir's disk error is the partition's error, the current log still goes. Kept registered, it
    was the log a topic created again under the name got back, with the old topic's records."""
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig(), fio)
    m.get_or_create_log("t", 0).append_as_leader(batch(), 0, 0)
    source = m.log_dir_of[("t", 0)]
    dest = next(d for d in DIRS if d != source)
    m.maybe_update_preferred_log_dir("t", 0, dest)
    m.get_or_create_log("t", 0, is_future=True)
    fio.fail_io(dest)
    with pytest.raises(KafkaStorageError, match="cannot delete log"):
        m.delete_log("t", 0)
    assert m.log_dir_failure_channel.take_next_offline_log_dir() == dest
    assert m.get_log("t", 0) is None and ("t", 0) not in m.log_dir_of
    assert [n for n in fio.listdir(source) if n.startswith("t-0")][0].endswith("-delete")
    m.handle_log_dir_failure(dest)
    again = m.get_or_create_log("t", 0, is_new=True)
    assert again.dir == f"{source}/t-0" and again.log_end_offset == 0


def test_a_partition_of_a_249_character_topic_is_retired_under_a_name_cut_to_255(
        tmp_path: Path) -> None:
    """Kafka's logDeleteDirName caps the name (the topic cut) so the rename fits the file
    system's 255-character limit; uncut, `<tp>.<uuid>-delete` was 291 characters and the rename
    failed, taking the log dir offline at the topic's deletion or a move's swap."""
    topic = "t" * 249
    log_dir = str(tmp_path / "d")
    m = LogManager([log_dir], LogConfig(), OsFileIO())
    m.get_or_create_log(topic, 10).append_as_leader(batch(), 0, 0)
    assert m.delete_log(topic, 10)
    (retired,) = [n for n in os.listdir(log_dir) if n.endswith("-delete")]
    assert len(retired) == 255 and retired.startswith("t" * 212 + "-10.")
    assert not m.log_dir_failure_channel.has_queued_dirs()
    assert m.delete_logs(m.config.file_delete_delay_ms) == 1
    assert not any(n.endswith("-delete") for n in os.listdir(log_dir))


def test_a_retired_dir_found_at_start_goes_file_delete_delay_ms_after_the_start() -> None:
    """Kafka's loadLog puts a `-delete` dir found at start in logsToBeDeleted with the start's
    time: kafka-delete-logs removes it file.delete.delay.ms later, not the load."""
    fio = MemoryFileIO()
    m = LogManager(["/d"], LogConfig(), fio)
    m.get_or_create_log("t", 0).append_as_leader(batch(), 0, 0)
    m.delete_log("t", 0)
    m.shutdown()  # before file.delete.delay.ms passed
    (retired,) = [n for n in fio.listdir("/d") if n.endswith("-delete")]
    fio.write_file("/d/notes-delete", b"a file so named: not a log")
    restarted = LogManager(["/d"], LogConfig(file_delete_delay_ms=30_000), fio, now_ms=5000)
    assert restarted.get_log("t", 0) is None and restarted.skipped == []
    assert retired in fio.listdir("/d")
    assert restarted.logs_to_be_deleted == [(35_000, f"/d/{retired}")]
    assert restarted.next_delete_delay_ms(5000) == 30_000
    assert restarted.delete_logs(34_999) == 0 and retired in fio.listdir("/d")
    assert restarted.delete_logs(35_000) == 1
    assert retired not in fio.listdir("/d") and "notes-delete" in fio.listdir("/d")


def test_cleanup_and_flush_tasks_run_over_every_log() -> None:
    fio = MemoryFileIO()
    config = LogConfig.from_dict({"segment.bytes": "200", "retention.ms": "1000",
                                  "flush.ms": "500"})
    m = LogManager(["/d"], config, fio)
    log = m.get_or_create_log("t", 0)
    for i in range(6):
        log.append_as_leader(batch(b"x" * 60, timestamp=i), 0, now_ms=i)
    log.update_high_watermark(log.log_end_offset)
    m.flush_dirty_logs(600)
    assert log.recovery_point == log.log_end_offset
    assert m.cleanup_logs(now_ms=5000) == [("t", 0)]  # its log start offset moved
    assert log.log_start_offset == log.log_end_offset == 6


def test_retention_applies_to_a_future_log_too() -> None:
    """Kafka's cleanupLogs cleans the future log of a replica moving between dirs right after
    its current log: old segments copied into the future log go there too."""
    fio = MemoryFileIO()
    config = LogConfig.from_dict({"segment.bytes": "200", "retention.ms": "1000"})
    m = LogManager(DIRS, config, fio)
    log = m.get_or_create_log("t", 0)
    m.maybe_update_preferred_log_dir("t", 0, next(d for d in DIRS if d != m.log_dir_of[("t", 0)]))
    future = m.get_or_create_log("t", 0, is_future=True)
    for i in range(6):
        log.append_as_leader(batch(b"x" * 60, timestamp=i), 0, now_ms=i)
    while future.log_end_offset < log.log_end_offset:  # the copy, a read at a time
        future.append_as_follower(bytes(log.read(future.log_end_offset, 1 << 20).records), 6)
    for each in (log, future):
        each.update_high_watermark(each.log_end_offset)
    assert len(future.segments) > 1
    assert m.cleanup_logs(now_ms=5000) == [("t", 0)]
    assert future.log_start_offset == future.log_end_offset == 6
    assert len(future.segments) == 1


def test_a_topic_config_change_reaches_its_logs() -> None:
    fio = MemoryFileIO()
    m = LogManager(["/d"], LogConfig(), fio)
    log = m.get_or_create_log("t", 0)
    other = m.get_or_create_log("u", 0)
    m.update_topic_config("t", LogConfig.from_dict({"max.message.bytes": "100"}))
    assert log.config.max_message_bytes == 100
    assert other.config.max_message_bytes == 1048588
    assert m.get_or_create_log("t", 1).config.max_message_bytes == 100


def test_illegal_topic_names_are_refused() -> None:
    import pytest

    m = LogManager(["/d", "/d/"], LogConfig(), MemoryFileIO())
    assert m.log_dirs == ["/d"]
    for topic, partition in (("", 0), ("a/b", 0), ("a b", 0), ("..", 0), ("x" * 250, 0), ("t", -1)):
        with pytest.raises(ValueError, match="invalid topic partition"):
            m.get_or_create_log(topic, partition)
    assert m.get_or_create_log("ok.topic_1-x", 3).dir == "/d/ok.topic_1-x-3"


class _DirFsyncRecordingIO(MemoryFileIO):
    """The simulator's disk, recording every directory fsync (files' fsyncs are counted by
    MemoryFileIO itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.dir_fsyncs: list[str] = []

    def fsync_dir(self, path: str) -> None:
        self.dir_fsyncs.append(path)
        super().fsync_dir(path)


def test_creating_a_log_fsyncs_nothing_and_its_first_flush_makes_its_names_durable() -> None:
    fio = _DirFsyncRecordingIO()
    m = LogManager(["/disk1"], LogConfig(), fio)
    fio.dir_fsyncs.clear()
    log = m.get_or_create_log("t", 0)
    # As Kafka's getOrCreateLog: a LeaderAndIsr creating thousands of logs waits on no disk.
    assert (fio.dir_fsyncs, fio.fsyncs) == ([], 0)
    log.flush()  # (a clean shutdown's) an empty log's names carry nothing a load cannot rebuild
    assert (fio.dir_fsyncs, fio.fsyncs) == ([], 0)
    log.append_as_leader(batch(), 1, 0)
    log.append_as_leader(batch(), 1, 0)
    log.flush()
    # The names in the partition dir (the segment's, the leader epoch checkpoint's), then the
    # partition dir's in the log dir.
    assert set(fio.dir_fsyncs[:-1]) == {"/disk1/t-0"} and fio.dir_fsyncs[-1] == "/disk1"
    synced = len(fio.dir_fsyncs)
    log.append_as_leader(batch(), 1, 0)
    log.flush()
    assert len(fio.dir_fsyncs) == synced  # no new name: no dir fsync
    fio.crash()
    again = LogManager(["/disk1"], LogConfig(), fio)
    assert again.logs[("t", 0)].log_end_offset == 3


def test_a_power_loss_before_the_first_flush_brings_new_logs_back_empty_or_not_at_all() -> None:
    fio = MemoryFileIO()
    m = LogManager(["/disk1"], LogConfig(), fio)
    for p in range(2):
        log = m.get_or_create_log("t", p)
        for _ in range(3):
            log.append_as_leader(batch(), 1, 0)
        log.update_high_watermark(3)
    m.checkpoint_logs()
    m.checkpoint_high_watermarks()
    OffsetCheckpointFile.in_dir(fio, "/disk1", CLEANER_OFFSET_CHECKPOINT).write(
        {("t", 0): 3, ("t", 1): 3})
    fio.crash()
    # The simulator keeps directories; a file system that had not made t-1's entry durable
    # (nothing flushed it) loses the dir itself.
    assert fio.listdir("/disk1/t-1") == []
    fio.remove("/disk1/t-1")
    again = LogManager(["/disk1"], LogConfig(), fio)
    survivor = again.logs[("t", 0)]
    # Empty, at its start: the checkpointed HW is clamped to the log end, and the cleaner's
    # checkpoint past the end is not trusted.
    assert (survivor.log_end_offset, survivor.high_watermark, survivor.recovery_point) == (0, 0, 0)
    assert cleanable_offsets(survivor, 3, 0)[0] == 0
    assert ("t", 1) not in again.logs
    recreated = again.get_or_create_log("t", 1)  # a LeaderAndIsr with is_new false
    assert (recreated.log_end_offset, recreated.high_watermark) == (0, 0)
    again.checkpoint_high_watermarks()
    assert OffsetCheckpointFile.in_dir(fio, "/disk1", REPLICATION_OFFSET_CHECKPOINT).read() == {
        ("t", 0): 0, ("t", 1): 0}
    for log in (survivor, recreated):
        log.append_as_leader(batch(), 1, 0)
        log.flush()
    fio.crash()
    third = LogManager(["/disk1"], LogConfig(), fio)
    assert {tp: log.log_end_offset for tp, log in third.logs.items()} == {("t", 0): 1, ("t", 1): 1}


@pytest.mark.parametrize("log_dir", ["/data/disk1", "/data/kafka/logs"])
def test_a_log_dir_it_creates_is_made_durable_with_its_new_parents(log_dir: str) -> None:
    # Kafka's createAndValidateLogDirs flushes the parent of a log dir it had to create: the
    # logs flushed into it later must not vanish with its name in a power loss. With
    # /data/kafka/logs on a disk holding /data only, /data/kafka is new too: its name as well.
    fio = MemoryFileIO()
    m = LogManager([log_dir], LogConfig(), fio)
    log = m.get_or_create_log("t", 0)
    log.append_as_leader(batch(), 1, 0)
    log.flush()
    fio.crash()
    again = LogManager([log_dir], LogConfig(), fio)
    assert again.logs[("t", 0)].log_end_offset == 1


def test_a_relative_log_dir_it_creates_stays_online(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # log.dirs=kafka-logs: its parent is the working dir (Kafka's toAbsolutePath.getParent);
    # the fsync of its dirname "" failed and the new dir went offline at once.
    monkeypatch.chdir(tmp_path)
    m = LogManager(["kafka-logs"], LogConfig(), OsFileIO())
    assert m.live_log_dirs == ["kafka-logs"]
    assert m.get_or_create_log("t", 0).dir == "kafka-logs/t-0"


def test_after_an_unclean_stop_the_logs_found_are_made_durable_before_they_flush() -> None:
    # A log created (no fsync) by a process killed before anything made its names durable is
    # found by the next start, which flushes it: a power loss then must keep what was flushed.
    fio = MemoryFileIO()
    m = LogManager(["/disk1"], LogConfig(), fio)
    m.get_or_create_log("t", 0).append_as_leader(batch(), 1, 0)  # then kill -9: no shutdown
    again = LogManager(["/disk1"], LogConfig(), fio)
    log = again.logs[("t", 0)]
    log.append_as_leader(batch(), 1, 0)
    log.flush()
    assert log.recovery_point == 2
    fio.crash()
    third = LogManager(["/disk1"], LogConfig(), fio)
    assert third.logs[("t", 0)].log_end_offset == 2
