"""A log dir failing at runtime (Kafka's JBOD): the LogDirFailureChannel and the LogManager."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from storage_helpers import batch

from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.checkpoint import OffsetCheckpointFile
from tidelog.storage.errors import KafkaStorageError
from tidelog.storage.file_io import OsFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_dir_failure_channel import LogDirFailureChannel
from tidelog.storage.log_manager import LogManager

DIRS = ["/disk1", "/disk2"]


def _two_dirs() -> tuple[MemoryFileIO, LogManager, list[str]]:
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig(), fio)
    woken: list[str] = []
    m.log_dir_failure_channel.on_offline_log_dir = lambda: woken.append("wake")
    for p in range(4):  # t-0, t-2 in /disk1; t-1, t-3 in /disk2
        m.get_or_create_log("t", p).append_as_leader(batch(), 1, 0)
    return fio, m, woken


def test_an_append_error_reports_its_dir_once_and_the_whole_dir_goes_offline() -> None:
    fio, m, woken = _two_dirs()
    fio.fail_io("/disk1", errno.EIO)
    for _ in range(2):  # the second error in the same dir is not queued again
        with pytest.raises(KafkaStorageError):
            m.get_log("t", 0).append_as_leader(batch(), 1, 0)
    channel = m.log_dir_failure_channel
    assert woken == ["wake"]
    assert channel.take_next_offline_log_dir() == "/disk1"
    assert channel.take_next_offline_log_dir() is None

    t2 = m.get_log("t", 2)
    assert m.handle_log_dir_failure("/disk1") == [("t", 0), ("t", 2)]
    assert t2 is not None and t2.closed  # a log of the dir that had no error goes too
    assert sorted(m.logs) == [("t", 1), ("t", 3)]
    assert m.live_log_dirs == ["/disk2"]
    assert m.handle_log_dir_failure("/disk1") == []
    # An existing replica is not created again elsewhere; a new one goes to the live dir.
    with pytest.raises(KafkaStorageError, match="/disk1 are offline"):
        m.get_or_create_log("t", 0)
    m.get_or_create_log("u", 0, is_new=True)
    assert m.log_dir_of[("u", 0)] == "/disk2"
    fio.heal()
    m.checkpoint_high_watermarks()  # nothing written into the offline dir any more
    assert not fio.exists("/disk1/replication-offset-checkpoint")


def test_every_log_of_a_reported_dir_refuses_appends_and_reads_before_the_handler_runs(
) -> None:
    """Kafka's maybeHandleIOException checks the dir's offline state before each operation:
    from the first report, not once the handler has taken the dir offline."""
    fio, m, _ = _two_dirs()
    fio.fail_io("/disk1/t-0", errno.EIO)
    with pytest.raises(KafkaStorageError):
        m.get_log("t", 0).append_as_leader(batch(), 1, 0)
    fio.heal()
    sibling = m.get_log("t", 2)  # same dir, no error of its own, the dir not handled yet
    assert sibling is not None and not sibling.closed
    with pytest.raises(KafkaStorageError, match="offline after an I/O error"):
        sibling.append_as_leader(batch(), 1, 0)
    for read in (sibling.read, m.get_log("t", 0).read):
        with pytest.raises(KafkaStorageError, match="offline after an I/O error"):
            read(0, 1 << 20)
    other = m.get_log("t", 1)  # the other dir is untouched
    assert other is not None and other.append_as_leader(batch(), 1, 0).first_offset == 1
    assert len(other.read(0, 1 << 20).records) > 0


def test_a_future_log_of_a_reported_dir_refuses_appends_at_once() -> None:
    fio, m, _ = _two_dirs()
    m.maybe_update_preferred_log_dir("t", 1, "/disk1")
    future = m.get_or_create_log("t", 1, is_future=True)  # t-1 moving into /disk1
    fio.fail_io("/disk1/t-0", errno.EIO)
    with pytest.raises(KafkaStorageError):
        m.get_log("t", 0).append_as_leader(batch(), 1, 0)
    fio.heal()
    with pytest.raises(KafkaStorageError, match="offline after an I/O error"):
        future.append_as_follower(batch(), 1)
    assert not m.get_log("t", 1).failed  # the current log, in /disk2, is not


def test_a_read_error_reports_the_dir() -> None:
    fio, m, _ = _two_dirs()
    fio.fail_io("/disk2/t-1", errno.EIO)
    with pytest.raises(KafkaStorageError):
        m.get_log("t", 1).read(0, 1 << 20)
    assert m.log_dir_failure_channel.take_next_offline_log_dir() == "/disk2"


@pytest.mark.parametrize("read", ["read", "read_slice", "batches", "offset_for_timestamp"])
def test_after_any_read_error_the_log_takes_no_more_writes(read: str) -> None:
    """Every read marks the log failed as a write's error does (Kafka's maybeHandleIOException:
    the dir is offline from the first error and nothing more is done in it), even when the
    disk answers again before the dir is taken offline."""
    fio, m, _ = _two_dirs()
    log = m.get_log("t", 1)
    assert log is not None
    fio.fail_io("/disk2/t-1", errno.EIO)
    with pytest.raises(KafkaStorageError):
        if read == "read":
            log.read(0, 1 << 20)
        elif read == "read_slice":
            log.read_slice(0, 1 << 20, min_slice_bytes=0)
        elif read == "batches":
            list(log.batches(0))
        else:
            log.offset_for_timestamp(0)
    fio.heal()
    with pytest.raises(KafkaStorageError, match="offline after an I/O error"):
        log.append_as_leader(batch(), 1, 0)


def test_a_list_offsets_read_error_is_a_storage_error_and_reports_the_dir() -> None:
    """ListOffsets by time (the time index, then the batch) and by the latest timestamp (every
    batch): KAFKA_STORAGE_ERROR for the partition, its dir reported, as a fetch's read."""
    fio, m, _ = _two_dirs()
    fio.fail_io("/disk2/t-1", errno.EIO)
    with pytest.raises(KafkaStorageError):
        m.get_log("t", 1).offset_for_timestamp(0)
    with pytest.raises(KafkaStorageError):
        list(m.get_log("t", 1).batches(0))
    assert m.log_dir_failure_channel.take_next_offline_log_dir() == "/disk2"


def test_a_failed_checkpoint_reports_its_dir_and_the_other_dir_is_still_written() -> None:
    fio, m, _ = _two_dirs()
    fio.fail_io("/disk1", errno.ENOSPC, writes_only=True)
    with pytest.raises(KafkaStorageError, match="/disk1"):
        m.checkpoint_high_watermarks()
    assert m.log_dir_failure_channel.take_next_offline_log_dir() == "/disk1"
    assert OffsetCheckpointFile(fio, "/disk2/replication-offset-checkpoint").read() == {
        ("t", 1): 0, ("t", 3): 0}


def test_a_log_manager_can_share_the_brokers_channel() -> None:
    channel = LogDirFailureChannel()
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig(), fio, log_dir_failure_channel=channel)
    assert m.log_dir_failure_channel is channel
    m.get_or_create_log("t", 0)
    fio.fail_io("/disk1/t-0")
    with pytest.raises(KafkaStorageError):
        m.get_log("t", 0).append_as_leader(batch(), 1, 0)
    assert channel.take_next_offline_log_dir() == "/disk1"


def test_a_future_log_in_the_failed_dir_goes_too() -> None:
    _, m, _ = _two_dirs()
    m.maybe_update_preferred_log_dir("t", 1, "/disk1")
    m.get_or_create_log("t", 1, is_future=True)  # t-1 moving from /disk2 into /disk1
    assert m.handle_log_dir_failure("/disk1") == [("t", 0), ("t", 2)]
    assert m.get_future_log("t", 1) is None and m.get_log("t", 1) is not None


def test_a_move_failing_on_the_disk_reports_the_dir_for_the_handler() -> None:
    """Not taken offline behind the replica manager's back: its partitions must go offline and
    the controller be told, which the handling of the reported dir does."""
    fio, m, _ = _two_dirs()
    m.maybe_update_preferred_log_dir("t", 0, "/disk2")
    current = m.get_log("t", 0)
    m.get_or_create_log("t", 0, is_future=True).append_as_follower(
        bytes(current.read(0, 1 << 20).records), 0)
    fio.fail_io("/disk1/t-0", errno.EIO)
    with pytest.raises(KafkaStorageError, match="cannot retire"):
        m.replace_current_with_future_log("t", 0)
    assert m.log_dir_failure_channel.take_next_offline_log_dir() == "/disk1"
    assert m.offline_dirs == set()


def test_a_swap_failing_in_the_future_logs_dir_reports_that_dir_only() -> None:
    """The future log's flush fails in the destination dir: the current log (the source dir)
    is untouched and keeps serving, so only the destination goes offline."""
    fio, m, _ = _two_dirs()
    m.maybe_update_preferred_log_dir("t", 0, "/disk2")
    current = m.get_log("t", 0)
    m.get_or_create_log("t", 0, is_future=True).append_as_follower(
        bytes(current.read(0, 1 << 20).records), 0)
    fio.fail_io("/disk2", errno.ENOSPC, writes_only=True)
    with pytest.raises(KafkaStorageError):
        m.replace_current_with_future_log("t", 0)
    channel = m.log_dir_failure_channel
    assert channel.take_next_offline_log_dir() == "/disk2"
    assert channel.take_next_offline_log_dir() is None
    assert m.get_log("t", 0) is current and not current.closed



class _FailingMakedirs(OsFileIO):
    """Real files, except that creating the dir ``path`` fails."""

    def __init__(self, path: str) -> None:
        self.path = path

    def makedirs(self, path: str) -> None:
        if path == self.path:
            raise OSError(errno.EIO, "simulated I/O error", path)
        super().makedirs(path)


def test_an_interrupted_swap_failing_at_start_takes_the_future_logs_dir_offline(
        tmp_path: Path) -> None:
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    m = LogManager(dirs, LogConfig(), OsFileIO())
    m.get_or_create_log("t", 0).append_as_follower(batch(), 0)
    m.maybe_update_preferred_log_dir("t", 0, dirs[1])
    m.get_or_create_log("t", 0, is_future=True).append_as_follower(batch(), 0)
    # The swap stopped between its renames: the current retired, the future not yet renamed.
    future_dir = m.future_logs[("t", 0)].dir
    m.file_io.rename = _stop_at_future(m.file_io.rename)  # type: ignore[method-assign]
    with pytest.raises(_Stopped):
        m.replace_current_with_future_log("t", 0)
    assert os.path.isdir(future_dir) and not os.path.exists(os.path.join(dirs[0], "t-0"))
    again = LogManager(dirs, LogConfig(), _FailingMakedirs(os.path.join(dirs[1], "t-0")))
    assert again.offline_dirs == {dirs[1]}


class _Stopped(Exception):
    """The process stopped here."""


def _stop_at_future(rename: Any) -> Any:
    """`rename`, except that renaming a future log stops the process."""
    def stopping(src: str, dst: str) -> Any:
        if src.endswith("-future"):
            raise _Stopped
        return rename(src, dst)
    return stopping


def test_a_deleted_partitions_future_log_left_by_a_failed_dir_is_not_its_replica_at_start(
        ) -> None:
    """The partition is deleted while its future log's dir fails: the current log is retired,
    the future one stays on the failed disk. At the next start it is no interrupted swap (no
    retired dir of that move beside it) and must not come back as the partition's log."""
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig(), fio)
    m.maybe_update_preferred_log_dir("t", 0, DIRS[0])
    m.get_or_create_log("t", 0).append_as_leader(batch(), 0, 0)
    m.maybe_update_preferred_log_dir("t", 0, DIRS[1])
    m.get_or_create_log("t", 0, is_future=True).append_as_follower(batch(), 0)
    m.checkpoint_logs()
    fio.fail_io(DIRS[1], errno.EIO)
    with pytest.raises(KafkaStorageError):
        m.delete_log("t", 0)
    assert ("t", 0) not in m.logs
    fio.heal()
    again = LogManager(DIRS, LogConfig(), fio)
    assert ("t", 0) not in again.logs and ("t", 0) not in again.future_logs
    assert [n for n in fio.listdir(DIRS[1]) if n.startswith("t-0")][0].endswith("-delete")


def test_a_log_failing_its_flush_does_not_keep_the_other_dirs_logs_unflushed() -> None:
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig.from_dict({"flush.ms": "500"}), fio)
    failing, other = m.get_or_create_log("t", 0), m.get_or_create_log("t", 1)
    assert (m.log_dir_of[("t", 0)], m.log_dir_of[("t", 1)]) == ("/disk1", "/disk2")
    for log in (failing, other):
        log.append_as_leader(batch(), 1, 0)
    fio.fail_io("/disk1", errno.EIO)
    m.flush_dirty_logs(600)
    assert other.recovery_point == other.log_end_offset
    assert m.log_dir_failure_channel.take_next_offline_log_dir() == "/disk1"


def test_a_log_that_cannot_be_created_reports_its_dir_and_goes_to_the_next() -> None:
    fio, m, _ = _two_dirs()  # two logs in each dir: /disk1 is tried first
    fio.fail_io("/disk1", errno.EIO)
    log = m.get_or_create_log("u", 0, is_new=True)
    assert m.log_dir_of[("u", 0)] == "/disk2" and log.dir == "/disk2/u-0"
    assert m.log_dir_failure_channel.take_next_offline_log_dir() == "/disk1"
    fio.fail_io("/disk2", errno.EIO)
    with pytest.raises(KafkaStorageError, match="No log directories available"):
        m.get_or_create_log("u", 1, is_new=True)
    assert m.log_dir_failure_channel.take_next_offline_log_dir() == "/disk2"


class _FailingFutureRename(OsFileIO):
    """Real files, except that renaming a future log's dir fails."""

    def rename(self, src: str, dst: str) -> None:
        if src.endswith("-future"):
            raise OSError(errno.EIO, "simulated I/O error", src)
        super().rename(src, dst)


def test_a_swap_failing_after_the_current_log_was_retired_leaves_the_replica_in_the_destination(
        tmp_path: Path) -> None:
    """The current log is renamed for deletion, then the future one fails to take its name:
    the replica is the destination dir's now, so that dir's failure takes its partition
    offline (the core marks offline the partitions whose log the dir holds)."""
    source, dest = str(tmp_path / "a"), str(tmp_path / "b")
    m = LogManager([source, dest], LogConfig(), _FailingFutureRename())
    current = m.get_or_create_log("t", 0)
    current.append_as_leader(batch(), 1, 0)
    m.maybe_update_preferred_log_dir("t", 0, dest)
    m.get_or_create_log("t", 0, is_future=True).append_as_follower(
        bytes(current.read(0, 1 << 20).records), 0)
    with pytest.raises(KafkaStorageError, match="cannot move"):
        m.replace_current_with_future_log("t", 0)
    assert m.log_dir_failure_channel.take_next_offline_log_dir() == dest
    assert m.log_dir_of.get(("t", 0)) == dest
    assert m.handle_log_dir_failure(dest) == [("t", 0)]


def test_a_retention_error_ends_the_round_but_the_moves_before_it_are_told() -> None:
    """Kafka's cleanupLogs stops at a log's disk error (its dir goes offline; the logs after it
    wait for the next round); the log starts already moved are still returned, for the fetch
    sessions to answer them."""
    fio = MemoryFileIO()
    m = LogManager(DIRS, LogConfig.from_dict({"segment.bytes": "200", "retention.ms": "1000"}),
                   fio)
    logs = [m.get_or_create_log("t", p) for p in range(3)]  # t-0, t-2 in /disk1; t-1 in /disk2
    for log in logs:
        for i in range(6):
            log.append_as_leader(batch(b"x" * 60, timestamp=i), 0, now_ms=i)
        log.update_high_watermark(log.log_end_offset)
    fio.fail_io("/disk2", errno.EIO)
    assert m.cleanup_logs(now_ms=5000) == [("t", 0)]
    assert [log.log_start_offset for log in logs] == [6, 0, 0]  # t-2 waits for the next round
    assert m.log_dir_failure_channel.take_next_offline_log_dir() == "/disk2"
