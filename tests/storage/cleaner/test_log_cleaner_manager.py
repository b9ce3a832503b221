"""LogCleanerManager: the filthiest compacted log first, the cleaner-offset-checkpoint file per
log dir (moved by a clean, lowered by a truncation below it), and the io rate throttler."""

from __future__ import annotations

from pathlib import Path

from tidelog.protocol.records.builder import Record, build_batch
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.checkpoint import OffsetCheckpointFile
from tidelog.storage.cleaner.log_cleaner import (
    CLEANER_OFFSET_CHECKPOINT,
    CleanerConfig,
    LogCleanerManager,
    Throttler,
)
from tidelog.storage.file_io import OsFileIO
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager


def write(log: Log, keys: list[bytes]) -> None:
    for key in keys:
        log.append_as_leader(build_batch([Record(b"v" * 50, key=key)]), 0, now_ms=0)
    log.roll(0)
    log.update_high_watermark(log.log_end_offset)


def manager_with(topics: dict[str, str]) -> tuple[LogManager, LogCleanerManager]:
    base = LogConfig.from_dict({"file.delete.delay.ms": 0})
    lm = LogManager(["/d"], base, MemoryFileIO(), topic_configs={
        t: LogConfig.from_dict({"cleanup.policy": p, "file.delete.delay.ms": 0})
        for t, p in topics.items()})
    return lm, LogCleanerManager(lm, CleanerConfig(dedupe_buffer_size=2 * 1024 * 1024))


def run_pass(cm: LogCleanerManager) -> str | None:
    steps = cm.clean_once(cm.cleaners[0], 0)
    if steps is None:
        return None
    topics = set(cm.in_progress)
    for _ in steps:
        pass
    assert not cm.in_progress
    return topics.pop()[0]


def test_the_filthiest_compacted_log_is_cleaned_first_and_checkpointed() -> None:
    lm, cm = manager_with({"few-dups": "compact", "many-dups": "compact", "deleted": "delete"})
    write(lm.get_or_create_log("few-dups", 0), [b"a", b"b", b"c", b"a"])
    write(lm.get_or_create_log("many-dups", 0), [b"a"] * 4)
    write(lm.get_or_create_log("deleted", 0), [b"a"] * 8)
    # Both compacted logs are wholly dirty (ratio 1): the first found of equal ratio goes first;
    # a delete-only topic is never cleaned.
    cleaned = {run_pass(cm), run_pass(cm)}
    assert cleaned == {"few-dups", "many-dups"}
    assert run_pass(cm) is None  # nothing dirty left
    checkpoint = OffsetCheckpointFile.in_dir(lm.file_io, "/d", CLEANER_OFFSET_CHECKPOINT).read()
    assert checkpoint == {("few-dups", 0): 4, ("many-dups", 0): 4}


def test_a_dirty_ratio_below_the_minimum_waits() -> None:
    lm, cm = manager_with({"t": "compact"})
    log = lm.get_or_create_log("t", 0)
    write(log, [b"a", b"b"])
    assert run_pass(cm) == "t"
    write(log, [b"a"])  # 1 dirty batch of 3: ratio 1/3 < 0.5
    assert run_pass(cm) is None
    write(log, [b"b", b"c"])  # 3 of 5 (after the first clean kept 2): above 0.5
    assert run_pass(cm) == "t"


def test_a_truncation_below_the_checkpoint_lowers_it() -> None:
    lm, cm = manager_with({"t": "compact"})
    log = lm.get_or_create_log("t", 0)
    write(log, [b"a", b"b", b"c", b"d"])
    assert run_pass(cm) == "t"
    assert cm.all_checkpoints() == {("t", 0): 4}
    log.truncate_to(2)
    assert cm.all_checkpoints() == {("t", 0): 2}


def test_the_throttler_paces_reads_to_the_rate() -> None:
    throttler = Throttler(1000.0)
    assert throttler.pause_for(500, 10.0) == 0.5
    assert throttler.pause_for(500, 10.5) == 0.5  # 1000 bytes due at 11.0
    assert throttler.pause_for(100, 11.2) == 0.0  # behind the rate: no pause
    assert Throttler(float("inf")).pause_for(10**9, 0.0) == 0.0


def test_a_log_whose_clean_fails_is_left_uncleanable() -> None:
    lm, cm = manager_with({"bad": "compact", "good": "compact"})
    bad = lm.get_or_create_log("bad", 0)
    write(bad, [b"a"] * 6)
    write(lm.get_or_create_log("good", 0), [b"a"] * 4)
    lm.file_io.fail_io("/d/bad-0", writes_only=True)  # type: ignore[attr-defined]
    cleaned = []
    for _ in range(3):
        try:
            cleaned.append(run_pass(cm))
        except OSError:
            cleaned.append("failed")
    # The error reports the dir offline: its other log is not cleaned either (Kafka refuses
    # every operation in the dir from its first report).
    assert sorted(map(str, cleaned)) == ["None", "None", "failed"]
    assert cm.uncleanable == {("bad", 0): bad}


def test_an_io_error_while_cleaning_takes_the_log_dir_offline() -> None:
    """Kafka's CleanerThread: an IOException cleaning a log reports its dir to the
    LogDirFailureChannel (the replica manager then takes it offline)."""
    lm, cm = manager_with({"bad": "compact"})
    write(lm.get_or_create_log("bad", 0), [b"a"] * 6)
    lm.file_io.fail_io("/d/bad-0", writes_only=True)  # type: ignore[attr-defined]
    try:
        run_pass(cm)
    except OSError:
        pass
    assert lm.log_dir_failure_channel.take_next_offline_log_dir() == "/d"


def test_an_io_error_on_the_cleaner_checkpoint_takes_the_log_dir_offline() -> None:
    """Kafka's updateCheckpoints: the checkpoint file's IOException reports its dir and is
    logged; the pass itself does not fail."""
    lm, cm = manager_with({"t": "compact"})
    write(lm.get_or_create_log("t", 0), [b"a"] * 4)
    # The new file is written beside the old one first (write_file_atomically).
    lm.file_io.fail_io(f"/d/{CLEANER_OFFSET_CHECKPOINT}.tmp")  # type: ignore[attr-defined]
    assert run_pass(cm) == "t"
    assert lm.log_dir_failure_channel.take_next_offline_log_dir() == "/d"


def test_a_replica_moved_to_another_log_dir_takes_its_cleaner_checkpoint_along(
        tmp_path: Path) -> None:
    """Kafka's LogCleaner.alterCheckpointDir at the swap: the entry is in the new dir's file
    only, and a truncation of the moved log lowers it."""
    dirs = [str(tmp_path / "d1"), str(tmp_path / "d2")]
    lm = LogManager(dirs, LogConfig.from_dict({"file.delete.delay.ms": 0}),
                    OsFileIO(), topic_configs={"t": LogConfig.from_dict(
                        {"cleanup.policy": "compact", "file.delete.delay.ms": 0})})
    cm = LogCleanerManager(lm, CleanerConfig(dedupe_buffer_size=2 * 1024 * 1024))
    log = lm.get_or_create_log("t", 0)
    write(log, [b"a", b"b", b"c", b"d"])
    assert run_pass(cm) == "t"
    source = lm.log_dir_of[("t", 0)]
    dest = dirs[1] if source == dirs[0] else dirs[0]
    lm.maybe_update_preferred_log_dir("t", 0, dest)
    future = lm.get_or_create_log("t", 0, is_future=True)
    future.append_as_follower(log.read(0, 1 << 20).records, 0)
    moved = lm.replace_current_with_future_log("t", 0)

    def entries(log_dir: str) -> dict[tuple[str, int], int]:
        return OffsetCheckpointFile.in_dir(lm.file_io, log_dir, CLEANER_OFFSET_CHECKPOINT).read()

    assert (entries(source), entries(dest)) == ({}, {("t", 0): 4})
    moved.truncate_to(2)
    assert cm.all_checkpoints() == {("t", 0): 2}


def test_deleting_a_log_ends_its_cleaning_pass_and_leaves_no_cleaned_file() -> None:
    """Kafka's asyncDelete aborts the log's cleaning first (abortCleaning): a pass mid-way
    through its rewrite ends at the delete, its .cleaned file removed before the dir is
    retired, and the partition is not left in progress."""
    lm, cm = manager_with({"t": "compact"})
    cleaner = cm.cleaners[0]
    cleaner.step_bytes = 256
    write(lm.get_or_create_log("t", 0), [b"k%d" % (i % 5) for i in range(100)])
    log_dir = lm.get_log("t", 0).dir
    steps = cm.clean_once(cleaner, 0)
    assert steps is not None
    for _ in range(100):  # into the rewrite of a segment group
        next(steps)
        if any(n.endswith(".cleaned") for n in lm.file_io.listdir(log_dir)):
            break
    else:
        raise AssertionError("the pass never started its rewrite")
    assert lm.delete_log("t", 0)
    assert ("t", 0) not in cm.in_progress
    assert next(steps, None) is None  # the pass is over
    (retired,) = [n for n in lm.file_io.listdir("/d") if n.startswith("t-0")]
    assert not any(n.endswith(".cleaned") for n in lm.file_io.listdir(f"/d/{retired}"))


def test_deleting_a_log_drops_its_cleaner_checkpoint_entry() -> None:
    """Kafka's asyncDelete calls updateCheckpoints(partitionToRemove): left in the file, the
    entry would mark a partition created again under the name clean up to the old offset."""
    lm, cm = manager_with({"t": "compact", "u": "compact"})
    write(lm.get_or_create_log("t", 0), [b"a"] * 4)
    write(lm.get_or_create_log("u", 0), [b"a"] * 4)
    assert {run_pass(cm), run_pass(cm)} == {"t", "u"}
    checkpoint = OffsetCheckpointFile.in_dir(lm.file_io, "/d", CLEANER_OFFSET_CHECKPOINT)
    assert checkpoint.read() == {("t", 0): 4, ("u", 0): 4}
    assert lm.delete_log("t", 0)
    assert checkpoint.read() == {("u", 0): 4}
