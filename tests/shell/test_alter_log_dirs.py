"""Moving a replica between a broker's log dirs (AlterReplicaLogDirs) through the shared shell,
on real files and a hand-stepped clock: the future log copies the current one, follows its
truncations and appends, swaps in atomically, and a crash at any point of the move recovers
to one whole log."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from test_shell_replica_manager import Clock, IsrWriter

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records.builder import Record, build_batch, build_values
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.replication_quota import (
    QUOTA_BYTES_PER_SECOND_DEFAULT,
    ReplicationQuotaManager,
)
from tidelog.replication.types import LeaderAndIsrPartitionState, TopicPartition
from tidelog.shell.replica_manager import ReplicaManager
from tidelog.storage.cleaner.log_cleaner import CleanerConfig, LogCleanerManager
from tidelog.storage.file_io import OsFileHandle, OsFileIO
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import FUTURE_DIR_SUFFIX, LogManager

TP = TopicPartition("t", 0)


class CrashingFileIO(OsFileIO):
    """Real files; the process "dies" (an exception no handler catches) at the n-th change to
    a directory: what is on disk then is what a restart finds. A process crash loses nothing
    written, so the fsyncs are counted as steps but not made (they only slow the test)."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = budget
        self.ops = 0

    def _tick(self) -> None:
        self.ops += 1
        if self.budget is not None and self.ops > self.budget:
            raise Crash

    def makedirs(self, path: str) -> None:
        self._tick()
        super().makedirs(path)

    def remove(self, path: str) -> None:
        self._tick()
        super().remove(path)

    def rename(self, src: str, dst: str) -> None:
        self._tick()
        super().rename(src, dst)

    def fsync_dir(self, path: str) -> None:
        self._tick()

    def open(self, path: str) -> Any:
        self._tick()
        return _NoSyncHandle(path)


class _NoSyncHandle(OsFileHandle):
    def flush(self) -> None:
        pass


class Crash(BaseException):
    pass


class Broker:
    def __init__(self, dirs: list[str], io: OsFileIO | None = None,
                 fetch_max_bytes: int = 1 << 20, config: LogConfig | None = None) -> None:
        self.dirs = dirs
        self.clock = Clock()
        self.lm = LogManager(dirs, config or LogConfig(min_insync_replicas=1, segment_bytes=2048),
                             io or OsFileIO())
        self.rm = ReplicaManager(
            1, self.lm, ReplicationConfig(replica_fetch_max_bytes=fetch_max_bytes),
            time=self.clock, scheduler=self.clock, alter_partition_manager=IsrWriter(),
            leader_end_point=lambda s, f: None)  # type: ignore[arg-type,return-value]
        self.rm.set_broker_epoch(100)
        self.moves = self.rm.alter_log_dirs_manager

    def lead(self, tp: TopicPartition = TP, is_new: bool = True) -> None:
        state = LeaderAndIsrPartitionState(tp.topic, tp.partition, 1, 1, 0, (1,), 0, (1,),
                                           is_new=is_new)
        assert self.rm.become_leader_or_follower(0, 1, 100, [state], {1}).error == 0

    def produce(self, n: int, tp: TopicPartition = TP) -> None:
        for i in range(n):
            out = self.rm.append_records(1, {tp: build_values([b"x%d" % i] * 5)}, 1000,
                                         ("p", i), lambda _: None)
            assert out.results[tp].error == 0

    def alter(self, tp: TopicPartition, path: str,
              known: bool = True) -> ErrorCode:
        return self.moves.alter_replica_log_dirs({tp: os.path.abspath(path)},
                                                 lambda _: known)[tp]


def contents(log: Any) -> bytes:
    return bytes(log.read(log.log_start_offset, 1 << 30).records)


@pytest.fixture
def dirs(tmp_path: Path) -> list[str]:
    return [str(tmp_path / "d1"), str(tmp_path / "d2")]


def test_a_replica_moves_to_the_other_log_dir_with_every_record(dirs: list[str]) -> None:
    b = Broker(dirs, fetch_max_bytes=1500)
    b.lead()
    b.produce(40)
    log = b.lm.get_log("t", 0)
    before, hw = contents(log), log.high_watermark
    assert b.lm.log_dir_of[TP] == dirs[0] and len(log.segments) >= 3

    assert b.alter(TP, dirs[1]) == ErrorCode.NONE
    (future_dir,) = [n for n in os.listdir(dirs[1]) if n.endswith(FUTURE_DIR_SUFFIX)]
    assert future_dir.startswith("t-0.")
    b.clock.advance(0)  # one step: one read of at most replica.fetch.max.bytes
    assert b.lm.log_dir_of[TP] == dirs[0] and 0 < b.moves.bytes_copied <= 1500
    b.clock.advance(100)

    moved = b.lm.get_log("t", 0)
    assert b.lm.log_dir_of[TP] == dirs[1] and b.moves.swaps == 1
    assert "t-0" not in os.listdir(dirs[0]) and os.listdir(dirs[1]).count("t-0") == 1
    assert not any(n.endswith("-future") for d in dirs for n in os.listdir(d))
    # The old dir is retired at the swap and deleted file.delete.delay.ms later.
    (retired,) = [n for n in os.listdir(dirs[0]) if n.endswith("-delete")]
    ((due, _),) = b.lm.logs_to_be_deleted
    assert b.lm.config.file_delete_delay_ms <= due <= b.clock.now + b.lm.config.file_delete_delay_ms
    b.lm.delete_logs(due - 1)
    assert retired in os.listdir(dirs[0])
    b.lm.delete_logs(due)
    assert not any(n.endswith("-delete") for n in os.listdir(dirs[0]))
    assert b.rm.core.partition(TP).log is moved and moved is not log and log.closed
    assert contents(moved) == before and moved.high_watermark == hw
    b.produce(1)  # the partition writes to its new log
    assert moved.log_end_offset == log.log_end_offset + 5

    after, hw = contents(moved), moved.high_watermark
    b.lm.shutdown()
    again = LogManager(dirs, LogConfig(), OsFileIO())
    assert again.log_dir_of[TP] == dirs[1] and contents(again.get_log("t", 0)) == after
    assert again.get_log("t", 0).high_watermark == hw


def test_records_produced_during_the_copy_are_moved_too(dirs: list[str]) -> None:
    b = Broker(dirs, fetch_max_bytes=500)
    b.lead()
    b.produce(10)
    assert b.alter(TP, dirs[1]) == ErrorCode.NONE
    for _ in range(10):
        b.produce(2)
        b.clock.advance(1)
    b.clock.advance(100)
    assert b.lm.log_dir_of[TP] == dirs[1]
    moved = b.lm.get_log("t", 0)
    assert moved.log_end_offset == 30 * 5 and len(list(moved.batches())) == 30


def test_the_copy_is_bounded_by_the_alter_log_dirs_quota(dirs: list[str]) -> None:
    """replica.alter.log.dirs.io.max.bytes.per.second: every byte copied is recorded, and the
    copy waits while the rate (Kafka's, over 11 windows of 1 s) is above the bound; a minute
    of hand-stepped time copies about a minute's worth, the move ends once the bound is
    lifted."""
    bound, step = 200, 300
    b = Broker(dirs, fetch_max_bytes=step)
    b.moves.quota = ReplicationQuotaManager(bound=bound)
    b.lead()
    b.produce(200)
    size = b.lm.get_log("t", 0).size
    assert size > bound * 80
    assert b.alter(TP, dirs[1]) == ErrorCode.NONE
    for second in range(1, 61):
        b.clock.advance(1000)
        # At most the bound over the time so far plus the 10 windows Kafka's Rate counts at
        # least, and the one read that went over it.
        assert b.moves.bytes_copied <= bound * (second + 10) + step
    assert b.moves.bytes_copied >= bound * 50  # bounded, not stalled
    assert b.lm.log_dir_of[TP] == dirs[0] and b.moves.swaps == 0
    b.moves.quota.update_quota(QUOTA_BYTES_PER_SECOND_DEFAULT)
    b.clock.advance(60_000)
    assert b.lm.log_dir_of[TP] == dirs[1] and b.moves.bytes_copied == size


def test_a_truncation_of_the_current_log_truncates_the_future_one(dirs: list[str]) -> None:
    """A follower that diverged from a new leader truncates; the future copy must not keep
    the records the current log dropped (here the same offsets are then written again with
    other values)."""
    b = Broker(dirs, fetch_max_bytes=1)  # a batch (5 records) per step
    b.lead()
    b.produce(10)
    assert b.alter(TP, dirs[1]) == ErrorCode.NONE
    current = b.lm.get_log("t", 0)
    future = b.lm.get_future_log("t", 0)
    b.clock.advance(5)  # 6 steps of the 10 the copy takes
    assert future.log_end_offset == 30 and current.log_end_offset == 50
    current.truncate_to(20)
    assert future.log_end_offset == 20
    current.append_as_follower(build_values([b"other"] * 5, base_offset=20), 0)
    expected = contents(current)
    b.clock.advance(10)
    assert b.lm.log_dir_of[TP] == dirs[1]
    assert contents(b.lm.get_log("t", 0)) == expected and b"other" in expected


def test_errors_are_kafkas(tmp_path: Path, dirs: list[str]) -> None:
    b = Broker(dirs)
    b.lead()
    assert b.alter(TP, str(tmp_path / "elsewhere")) == ErrorCode.LOG_DIR_NOT_FOUND
    assert b.alter(TopicPartition("t", 9), dirs[1], known=True) \
        == ErrorCode.REPLICA_NOT_AVAILABLE
    assert b.alter(TopicPartition("nope", 0), dirs[1], known=False) \
        == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert b.alter(TopicPartition("x" * 215, 0), dirs[1]) == ErrorCode.INVALID_TOPIC_EXCEPTION
    # Already there: nothing to move.
    assert b.alter(TP, dirs[0]) == ErrorCode.NONE and b.lm.future_logs == {}
    b.lm.offline_dirs.add(dirs[1])
    assert b.alter(TP, dirs[1]) == ErrorCode.KAFKA_STORAGE_ERROR
    assert b.lm.future_logs == {}


def test_a_replica_not_created_yet_is_created_in_its_preferred_dir(dirs: list[str]) -> None:
    b = Broker(dirs)
    b.lead(TopicPartition("a", 0))  # d1 holds one log now: the default would be d2
    tp = TopicPartition("t", 3)
    assert b.alter(tp, dirs[0]) == ErrorCode.REPLICA_NOT_AVAILABLE
    b.lead(tp)
    assert b.lm.log_dir_of[tp] == dirs[0] and b.lm.preferred_log_dirs == {}
    assert b.lm.future_logs == {}


def test_a_new_destination_replaces_the_move_in_progress(tmp_path: Path) -> None:
    dirs = [str(tmp_path / f"d{i}") for i in (1, 2, 3)]
    b = Broker(dirs, fetch_max_bytes=300)
    b.lead()
    b.produce(10)
    assert b.alter(TP, dirs[1]) == ErrorCode.NONE
    b.clock.advance(1)
    assert b.alter(TP, dirs[2]) == ErrorCode.NONE
    assert not any(n.endswith(FUTURE_DIR_SUFFIX) for n in os.listdir(dirs[1]))
    # The dropped copy is retired (Kafka's asyncDelete(isFuture = true)), removed later.
    (retired,) = [n for n in os.listdir(dirs[1]) if n.startswith("t-0.")]
    assert retired.endswith("-delete")
    b.clock.advance(100)
    assert b.lm.log_dir_of[TP] == dirs[2] and os.listdir(dirs[1]).count("t-0") == 0


def test_deleting_the_replica_mid_move_deletes_both_logs(dirs: list[str]) -> None:
    b = Broker(dirs, fetch_max_bytes=300)
    b.lead()
    b.produce(10)
    assert b.alter(TP, dirs[1]) == ErrorCode.NONE
    b.clock.advance(1)
    assert b.rm.stop_replicas(0, 1, 100, {TP: True}).error == 0
    b.clock.advance(100)
    assert b.moves.moving == {} and b.moves.swaps == 0
    # Both logs are retired (Kafka's asyncDelete, the future one's too) until
    # file.delete.delay.ms has passed.
    for d in dirs:
        (retired,) = [n for n in os.listdir(d) if n.startswith("t-0")]
        assert retired.endswith("-delete")
    b.lm.delete_logs(b.clock.now + b.lm.config.file_delete_delay_ms)
    assert [n for d in dirs for n in os.listdir(d) if n.startswith("t-0")] == []


def test_a_crash_at_any_point_of_the_move_recovers_one_whole_log(dirs: list[str]) -> None:
    """The process dies at every directory change of the copy and the swap in turn; the
    restarted broker has one log holding every record, in the old dir (with the future log
    kept, whose copy resumes once the partition is hosted) or in the new one."""
    setup = Broker(dirs)
    setup.lead()
    setup.produce(20)
    setup.lm.shutdown()
    expected = contents(LogManager(dirs, LogConfig(), OsFileIO()).get_log("t", 0))

    outcomes: set[str] = set()
    budget = 0
    while True:
        io = CrashingFileIO()
        b = Broker(dirs, io, fetch_max_bytes=1500)
        b.lead(is_new=False)
        io.budget, io.ops = budget, 0
        try:
            b.alter(TP, dirs[1])
            b.clock.advance(100)
            finished = True
        except Crash:
            finished = False
        # Restart (no shutdown: the process is gone).
        restarted = Broker(dirs, CrashingFileIO())
        lm = restarted.lm
        assert lm.skipped == [] and TP in lm.logs
        assert contents(lm.get_log("t", 0)) == expected, budget
        # Retired dirs left by the crash wait file.delete.delay.ms again (Kafka's loadLog).
        retired = {os.path.join(d, n) for d in dirs for n in os.listdir(d) if n.endswith("-delete")}
        assert retired == {path for _, path in lm.logs_to_be_deleted}
        outcomes.add(f"{lm.log_dir_of[TP] == dirs[1]}/{TP in lm.future_logs}")
        restarted.lead(is_new=False)
        if lm.log_dir_of[TP] == dirs[0] and TP in lm.future_logs:
            # Hosted again: the copy resumes and completes.
            restarted.clock.advance(100)
            assert lm.log_dir_of[TP] == dirs[1] and contents(lm.get_log("t", 0)) == expected
        if lm.log_dir_of[TP] == dirs[1]:
            # Back to the first dir for the next round, so each starts from the same place.
            assert restarted.alter(TP, dirs[0]) == ErrorCode.NONE
            restarted.clock.advance(100)
            assert lm.log_dir_of[TP] == dirs[0]
        restarted.lm.shutdown()
        if finished:
            break
        budget += 1
    # Every kind of state was hit: the old log alone, a partial future beside it, the swap
    # finished by the load (between the two renames), and the move done.
    assert outcomes == {"False/False", "False/True", "True/False"}, outcomes
    assert budget > 10


def test_a_corrupt_batch_delays_its_own_move_only(dirs: list[str]) -> None:
    """As Kafka's fetcher thread: a partition whose copy meets a corrupt batch is retried after
    replica.fetch.backoff.ms, and the other moves go on meanwhile."""
    b = Broker(dirs)
    bad, good = TP, TopicPartition("t", 1)
    for tp in (bad, good):
        b.alter(tp, dirs[0])  # (not hosted yet: where it is created)
        b.lead(tp)
        b.produce(3, tp)
    (segment,) = [n for n in os.listdir(os.path.join(dirs[0], "t-0")) if n.endswith(".log")]
    with open(os.path.join(dirs[0], "t-0", segment), "r+b") as f:
        f.seek(-3, os.SEEK_END)
        f.write(b"\xff")  # in the last batch's records: its CRC32C fails
    assert b.lm.log_dir_of[bad] == b.lm.log_dir_of[good] == dirs[0]
    assert b.alter(bad, dirs[1]) == b.alter(good, dirs[1]) == ErrorCode.NONE
    b.clock.advance(10)  # well below the back-off
    assert b.lm.log_dir_of[good] == dirs[1] and b.moves.swaps == 1
    assert b.lm.log_dir_of[bad] == dirs[0] and bad in b.moves.moving


def test_a_move_ends_the_cleaning_pass_on_its_log_and_is_never_held_by_one(
        dirs: list[str]) -> None:
    """Kafka's abortAndPauseCleaning as a move starts: a pass mid-way on the log ends at once
    (its .cleaned file removed), no pass takes the log while it moves, and the copy goes in
    steps of its own to the swap, none spent waiting for a cleaner; cleaning resumes on the
    moved log."""
    config = LogConfig.from_dict({"min.insync.replicas": 1, "segment.bytes": 2048,
                                  "cleanup.policy": "compact"})
    step = 4096
    b = Broker(dirs, fetch_max_bytes=step, config=config)
    cleaners = LogCleanerManager(b.lm, CleanerConfig(dedupe_buffer_size=1 << 20))
    cleaner = cleaners.cleaners[0]
    cleaner.step_bytes = 256
    b.lead()
    for i in range(200):
        out = b.rm.append_records(1, {TP: build_batch([Record(b"v" * 50, key=b"k%d" % (i % 5))])},
                                  1000, ("p", i), lambda _: None)
        assert out.results[TP].error == 0
    current = b.lm.get_log("t", 0)
    size, segments = current.size, len(current.segments)
    steps = cleaners.clean_once(cleaner, 0)
    assert steps is not None

    def cleaned_files() -> list[str]:
        return [n for n in os.listdir(current.dir) if n.endswith(".cleaned")]

    for _ in range(100):  # into the rewrite of a segment group
        next(steps)
        if cleaned_files():
            break
    assert cleaned_files() and TP in cleaners.in_progress

    runs: list[str] = []
    schedule = b.clock.schedule

    def counted(name: str, fn: Any, delay_ms: int, period_ms: int = -1) -> Any:
        if name == "ReplicaAlterLogDirsThread":
            runs.append(name)
        return schedule(name, fn, delay_ms, period_ms)

    b.clock.schedule = counted  # type: ignore[method-assign]
    assert b.alter(TP, dirs[1]) == ErrorCode.NONE
    assert TP not in cleaners.in_progress and cleaned_files() == []
    assert next(steps, None) is None  # the pass is over
    assert cleaners.clean_once(cleaner, 0) is None  # the moving log is not taken
    b.clock.advance(10_000)
    assert b.moves.swaps == 1 and b.lm.log_dir_of[TP] == dirs[1]
    # A read per segment (a read stops at its segment's end), the last one swaps; no polling.
    assert len(runs) <= segments + 1
    resumed = cleaners.clean_once(cleaner, 0)
    assert resumed is not None and TP in cleaners.in_progress
    for _ in resumed:
        pass
    assert b.lm.get_log("t", 0).size < size
