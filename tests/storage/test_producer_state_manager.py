"""Producer state in the log: Kafka's sequence and epoch rules on leader appends, duplicates
answered with the original offsets, the state kept by follower appends, truncations and
retention, and the `<offset>.snapshot` files (Kafka's format) it is reloaded from."""

from __future__ import annotations

import os
import random
import struct
from typing import Any

import crc32c
import pytest
from storage_helpers import small_config

from tidelog.protocol.records.builder import build_values
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log import Log
from tidelog.storage.producer_state_manager import (
    NUM_BATCHES_TO_RETAIN,
    CorruptSnapshotError,
    OutOfOrderSequenceError,
    ProducerStateEntry,
    read_snapshot,
    snapshot_file_name,
    write_snapshot,
)
from tidelog.storage.transactions import InvalidProducerEpochError, InvalidRecordError

DIR = "/data/t-0"
PID = 4242


def batch(seq: int, n: int = 1, epoch: int = 0, pid: int = PID, ts: int = 0) -> bytearray:
    return build_values([b"v%d" % (seq + i) for i in range(n)], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq, base_timestamp=ts)


def new_log(fio: MemoryFileIO | None = None, **kw: object) -> Log:
    return Log(DIR, small_config(), fio or MemoryFileIO(), **kw)  # type: ignore[arg-type]


def filled_log(fio: MemoryFileIO | None = None, count: int = 30) -> Log:
    """One producer's batches 0..count-1 (sequence = offset = timestamp), over several
    segments."""
    log = new_log(fio)
    for seq in range(count):
        log.append_as_leader(batch(seq, ts=seq), 0, now_ms=seq)
    return log


def snapshots(log: Log) -> list[str]:
    return sorted(n for n in log.file_io.listdir(log.dir) if n.endswith(".snapshot"))


def state(log: Log) -> dict[int, tuple[int, int, int]]:
    """(epoch, last sequence, last offset) per producer."""
    return {pid: (e.producer_epoch, e.last_seq, e.last_data_offset)
            for pid, e in log.producer_state_manager.producers.items()}


def replayed_state(log: Log) -> dict[int, tuple[int, int, int]]:
    """The same, from every batch of the log (what a full rescan would find)."""
    out: dict[int, tuple[int, int, int]] = {}
    for b in log.batches(log.log_start_offset):
        if b.producer_id >= 0:
            out[b.producer_id] = (b.producer_epoch, b.last_sequence, b.last_offset)
    return out


# ---------------------------------------------------------------- leader appends


def test_a_retried_batch_is_answered_with_its_original_offsets_and_not_written() -> None:
    log = new_log()
    first = log.append_as_leader(batch(0, 3), 0, now_ms=0)
    assert (first.first_offset, first.last_offset, first.duplicate) == (0, 2, False)
    again = log.append_as_leader(batch(0, 3), 0, now_ms=1)
    assert (again.first_offset, again.last_offset, again.duplicate) == (0, 2, True)
    assert log.log_end_offset == 3
    assert log.append_as_leader(batch(3), 0, now_ms=2).first_offset == 3


def test_sequence_gaps_new_epochs_and_fenced_epochs_are_refused() -> None:
    log = new_log()
    log.append_as_leader(batch(5), 0, now_ms=0)  # an unknown producer may start anywhere
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(7), 0, now_ms=0)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(5, epoch=1), 0, now_ms=0)  # a new epoch starts at 0
    assert log.log_end_offset == 1
    log.append_as_leader(batch(0, epoch=1), 0, now_ms=0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(batch(6, epoch=0), 0, now_ms=0)
    assert log.log_end_offset == 2
    log.append_as_leader(batch(9, pid=77), 0, now_ms=0)  # producers are independent


def test_a_client_batch_with_a_producer_id_but_no_sequence_is_an_invalid_record() -> None:
    log = new_log()
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(batch(-1), 0, now_ms=0)
    assert log.log_end_offset == 0


def test_only_the_last_five_batches_are_remembered_and_sequences_wrap() -> None:
    log = new_log()
    for i in range(NUM_BATCHES_TO_RETAIN + 2):
        log.append_as_leader(batch(i), 0, now_ms=0)
    assert log.append_as_leader(batch(2), 0, now_ms=0).duplicate
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(batch(1), 0, now_ms=0)
    log.append_as_leader(batch(2**31 - 2, n=2, pid=9), 0, now_ms=0)
    assert not log.append_as_leader(batch(0, pid=9), 0, now_ms=0).duplicate


def test_a_follower_keeps_the_state_and_answers_retries_once_it_leads() -> None:
    leader, follower = new_log(), Log("/f/t-0", small_config(), MemoryFileIO())
    for seq in range(0, 6, 2):
        leader.append_as_leader(batch(seq, 2), 0, now_ms=0)
    follower.append_as_follower(bytes(leader.read(0, 1 << 20).records), now_ms=0)
    assert state(follower) == {PID: (0, 5, 5)}
    retry = follower.append_as_leader(batch(4, 2), 1, now_ms=0)
    assert retry.duplicate and retry.first_offset == 4
    with pytest.raises(OutOfOrderSequenceError):
        follower.append_as_leader(batch(7), 1, now_ms=0)


# ---------------------------------------------------------------- snapshots


def test_the_snapshot_file_is_kafkas_format() -> None:
    entry = ProducerStateEntry(7, 3, 11, 1234, 40)
    entry.add_batch(3, 9, 45, 2, 1234)
    data = write_snapshot([entry])
    version, crc, count = struct.unpack_from(">hIi", data)
    assert (version, count) == (1, 1)
    assert crc == crc32c.crc32c(data[6:])
    # producer_id, epoch, last_sequence, last_offset, offset_delta, timestamp,
    # coordinator_epoch, current_txn_first_offset
    assert struct.unpack_from(">qhiqiqiq", data, 10) == (7, 3, 9, 45, 2, 1234, 11, 40)
    (back,) = read_snapshot(data)
    assert (back.producer_epoch, back.last_seq, back.last_data_offset,
            back.batch_metadata[-1].first_seq, back.coordinator_epoch,
            back.current_txn_first_offset) == (3, 9, 45, 7, 11, 40)
    with pytest.raises(CorruptSnapshotError):
        read_snapshot(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptSnapshotError):
        read_snapshot(data[:-3])


def test_a_roll_and_a_clean_close_write_snapshots_and_a_clean_reopen_replays_nothing() -> None:
    fio = MemoryFileIO()
    log = filled_log(fio)
    assert len(log.segments) > 2
    bases = [s.base_offset for s in log.segments[1:]]
    assert snapshots(log) == [snapshot_file_name(b) for b in bases]
    log.flush()
    log.close()
    assert snapshot_file_name(30) in snapshots(log)
    again = new_log(fio, recovery_point=30, had_clean_shutdown=True)
    assert again.producer_state_manager.batches_loaded == 0
    assert state(again) == {PID: (0, 29, 29)}
    assert again.append_as_leader(batch(29), 0, now_ms=31).duplicate


def test_after_a_crash_the_log_is_replayed_from_the_latest_snapshot_only() -> None:
    fio = MemoryFileIO()
    log = filled_log(fio)
    log.flush()
    latest = log.producer_state_manager.latest_snapshot_offset()
    assert latest is not None and 0 < latest < 30
    fio.crash()
    again = new_log(fio, recovery_point=0)
    assert again.producer_state_manager.batches_loaded == 30 - latest
    assert state(again) == {PID: (0, 29, 29)}


def test_a_corrupt_snapshot_is_deleted_and_an_older_one_used() -> None:
    fio = MemoryFileIO()
    log = filled_log(fio)
    log.flush()
    offsets = log.producer_state_manager.snapshot_offsets
    path = os.path.join(DIR, snapshot_file_name(offsets[-1]))
    fio.write_file(path, fio.read_file(path)[:-5])
    fio.crash()
    again = new_log(fio)
    assert again.producer_state_manager.batches_loaded == 30 - offsets[-2]
    # Replaying past the last segment's base wrote that snapshot again, whole this time.
    assert read_snapshot(fio.read_file(path))[0].last_seq == offsets[-1] - 1
    assert state(again) == {PID: (0, 29, 29)}


def test_truncation_drops_later_snapshots_and_a_truncated_batch_is_new_again() -> None:
    log = filled_log()
    log.truncate_to(12)
    assert all(int(n.split(".")[0]) <= 12 for n in snapshots(log))
    assert state(log) == {PID: (0, 11, 11)}
    assert not log.append_as_leader(batch(12), 0, now_ms=0).duplicate
    log.truncate_fully_and_start_at(100)
    assert snapshots(log) == [] and state(log) == {}


def test_retention_and_delete_records_remove_the_snapshots_below_the_log_start() -> None:
    log = filled_log()
    log.truncate_to(20)  # leaves a snapshot at 20, where no segment starts
    assert snapshot_file_name(20) in snapshots(log)
    for seq in range(20, 40):
        log.append_as_leader(batch(seq), 0, now_ms=0)
    log.update_high_watermark(40)
    start = next(s.base_offset for s in log.segments if s.base_offset > 20)
    log.maybe_increment_log_start_offset(start)
    log.delete_old_segments(now_ms=0)
    assert log.segments[0].base_offset == start
    assert snapshots(log) and all(int(n.split(".")[0]) >= start for n in snapshots(log))
    assert state(log) == {PID: (0, 39, 39)}  # the state itself keeps the producer


def test_producers_expire_and_are_not_reloaded_once_expired() -> None:
    fio = MemoryFileIO()
    log = new_log(fio, producer_id_expiration_ms=1000)
    log.append_as_leader(batch(0, ts=0), 0, now_ms=0)
    log.append_as_leader(batch(0, pid=5, ts=900), 0, now_ms=900)
    assert log.remove_expired_producers(now_ms=1500) == 1
    assert set(state(log)) == {5}
    log.append_as_leader(batch(7, ts=1500), 0, now_ms=1500)  # forgotten: any sequence again
    log.flush()
    log.close()
    again = new_log(fio, recovery_point=2, had_clean_shutdown=True,
                    producer_id_expiration_ms=1000, now_ms=2000)
    assert set(state(again)) == {PID}


# ---------------------------------------------------------------- crashes at the snapshot steps


class _Crash(Exception):
    pass


class CrashAt(MemoryFileIO):
    """A MemoryFileIO that loses power at the n-th snapshot step (halfway through the write,
    before the fsync, the rename, a delete, or any directory fsync), tearing what was not
    fsynced."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.countdown = -1
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.countdown > 0:
            self.countdown -= 1
            if self.countdown == 0:
                self.crash(self.rng, tear=True)
                raise _Crash()

    def open(self, path: str) -> Any:
        handle = super().open(path)
        return _SnapshotHandle(self, handle) if ".snapshot" in path else handle

    def remove(self, path: str) -> None:
        if ".snapshot" in path:
            self.step()
        super().remove(path)

    def rename(self, src: str, dst: str) -> None:
        if ".snapshot" in src:
            self.step()
        super().rename(src, dst)

    def fsync_dir(self, path: str) -> None:
        self.step()
        super().fsync_dir(path)


class _SnapshotHandle:
    """A snapshot file's handle that may lose power halfway through the write or before the
    fsync."""

    def __init__(self, fio: CrashAt, handle: Any) -> None:
        self.fio = fio
        self.handle = handle
        self.path = handle.path

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)

    def append(self, data: bytes | bytearray | memoryview) -> int:
        data = bytes(data)
        written: int = self.handle.append(data[: len(data) // 2])
        self.fio.step()
        self.handle.append(data[len(data) // 2 :])
        return written

    def flush(self) -> None:
        self.fio.step()
        self.handle.flush()


@pytest.mark.parametrize("seed", range(12))
def test_a_crash_at_any_snapshot_step_reloads_the_state_of_the_surviving_log(seed: int) -> None:
    rng = random.Random(seed)
    fio = CrashAt(rng)
    log = new_log(fio)
    seqs = {PID: 0, 77: 0}
    crashes = 0
    for step in range(300):
        try:
            if fio.countdown <= 0 and rng.random() < 0.05:
                fio.countdown = rng.randint(1, 6)
            r = rng.random()
            if r < 0.8:
                pid = rng.choice(list(seqs))
                n = rng.randint(1, 3)
                log.append_as_leader(batch(seqs[pid], n, pid=pid), 0, now_ms=step)
                seqs[pid] += n
            elif r < 0.9:
                log.flush()
            elif r < 0.95 and log.log_end_offset > 2:
                log.truncate_to(rng.randint(1, log.log_end_offset - 1))
                seqs = {p: (s[1] + 1 if (s := state(log).get(p)) else 0) for p in seqs}
            else:
                log.roll(step)
        except _Crash:
            crashes += 1
            fio.countdown = -1
            log = new_log(fio, recovery_point=0)
            assert state(log) == replayed_state(log)
            seqs = {p: (s[1] + 1 if (s := state(log).get(p)) else 0) for p in seqs}
            # The last surviving batch of each producer is still recognised when retried.
            for pid in state(log):
                last = log.producer_state_manager.producers[pid].batch_metadata[-1]
                retry = log.append_as_leader(batch(last.first_seq, last.offset_delta + 1,
                                                   pid=pid), 0, now_ms=step)
                assert retry.duplicate and retry.first_offset == last.first_offset
    assert crashes > 0 and fio.steps > 0
