"""Property test: any interleaving of appends, new leader epochs, reads, truncations, rolls,
retention, flushes, clean restarts, kill -9 and power loss keeps the log equal to a plain list of
batches and its epoch cache in agreement with the batches' epochs."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from storage_helpers import batch

from tidelog.protocol.records.batch import LOG_OVERHEAD, RecordBatch
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.errors import OffsetOutOfRangeError
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig

DIR = "/data/model-0"
CONFIG = LogConfig.from_dict(
    {
        "segment.bytes": 600,
        "index.interval.bytes": 100,
        "retention.bytes": 1500,
        "retention.ms": 5000,
    }
)

Stored = tuple[int, int, int, bytes]  # base offset, last offset, epoch, the batch's bytes


def describe(b: RecordBatch) -> Stored:
    return b.base_offset, b.last_offset, b.partition_leader_epoch, bytes(b.buf)


class LogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fio = MemoryFileIO()
        # The log's dir is on the disk already: its own name's durability is the LogManager's
        # (checkpoints, test_log_manager.py), not this model's.
        self.fio.makedirs(DIR, durable=True)
        self.log = Log(DIR, CONFIG, self.fio)
        self.model: list[Stored] = []
        self.start = 0  # log start offset
        self.end = 0  # log end offset
        self.epoch = 0
        self.now = 0

    # -- helpers ---------------------------------------------------------------------------
    def reopen(self, clean: bool) -> None:
        self.log = Log(
            DIR, CONFIG, self.fio, recovery_point=self.log.recovery_point,
            log_start_offset=self.log.log_start_offset, now_ms=self.now,
            had_clean_shutdown=clean,
        )

    # -- rules -----------------------------------------------------------------------------
    @rule(
        sizes=st.lists(st.integers(0, 120), min_size=1, max_size=4),
        records=st.integers(1, 3),
        bump=st.booleans(),
        dt=st.integers(0, 800),
    )
    def append_as_leader(self, sizes: list[int], records: int, bump: bool, dt: int) -> None:
        self.now += dt
        self.epoch += bump
        data = bytearray()
        for size in sizes:
            data += batch(*[b"v" * size] * records, timestamp=self.now)
        info = self.log.append_as_leader(data, self.epoch, self.now)
        assert info.first_offset == self.end
        for b in _split(data):
            b.set_base_offset(self.end)
            b.set_partition_leader_epoch(self.epoch)
            self.model.append(describe(b))
            self.end = b.last_offset + 1
        assert info.last_offset == self.end - 1

    @rule(gap=st.integers(0, 3), count=st.integers(1, 3), epoch_bump=st.integers(0, 1))
    def append_as_follower(self, gap: int, count: int, epoch_bump: int) -> None:
        self.epoch += epoch_bump
        base = self.end + gap
        data = batch(*[b"f"] * count, epoch=self.epoch, base_offset=base, timestamp=self.now)
        self.log.append_as_follower(data, self.now)
        self.model.append(describe(RecordBatch(data)))
        self.end = base + count

    @rule(target_offset=st.integers(0, 60), count=st.integers(1, 3))
    def follow_a_leader_of_an_older_epoch(self, target_offset: int, count: int) -> None:
        # KIP-279: our newer epochs diverged; the new leader's log goes on in the older epoch
        # of our last kept batch, which we copy after truncating to where it ends.
        self.truncate_to(target_offset)
        epoch = self.model[-1][2] if self.model else 0
        # The leader's answer for our newer epoch (OffsetsForLeaderEpoch) is at most where that
        # epoch starts here: a follower keeps none of its diverged epochs (a target past one's
        # start, possible with gaps in the offsets, is not an answer a leader gives).
        newer = [start for e, start in self.log.leader_epoch_cache.entries if e > epoch]
        if newer and newer[0] < self.end:
            self.truncate_to(newer[0])
            epoch = self.model[-1][2] if self.model else 0
        data = batch(*[b"d"] * count, epoch=epoch, base_offset=self.end, timestamp=self.now)
        self.log.append_as_follower(data, self.now)
        self.model.append(describe(RecordBatch(data)))
        self.end += count

    @rule(offset=st.integers(-2, 60), max_bytes=st.integers(0, 700), hw_cap=st.booleans())
    def read(self, offset: int, max_bytes: int, hw_cap: bool) -> None:
        max_offset = self.log.high_watermark if hw_cap else None
        if offset < self.start or offset > self.end:
            try:
                self.log.read(offset, max_bytes, max_offset)
            except OffsetOutOfRangeError as exc:
                assert (exc.log_start_offset, exc.log_end_offset) == (self.start, self.end)
                return
            raise AssertionError("read outside the log did not raise")
        got = bytes(self.log.read(offset, max_bytes, max_offset).records)
        expected = bytearray()
        if max_offset is None or offset < max_offset:
            for _, last, _, raw in self.model:
                if last < offset:
                    continue
                if max_offset is not None and last >= max_offset:
                    break
                if expected and len(expected) + len(raw) > max_bytes:
                    break
                if not expected and len(raw) > max_bytes:
                    expected += raw  # min_one_message
                    break
                expected += raw
        # A read stops at the end of a segment (as Kafka's): a whole-batch prefix, never empty
        # when something is readable.
        assert bytes(expected).startswith(got)
        assert bool(got) == bool(expected)
        if got != bytes(expected):
            assert self._is_batch_boundary(offset, got)

    def _is_batch_boundary(self, offset: int, got: bytes) -> bool:
        total = 0
        for _, last, _, raw in self.model:
            if last < offset:
                continue
            total += len(raw)
            if total == len(got):
                return True
        return False

    @rule(target_offset=st.integers(0, 60))
    def truncate_to(self, target_offset: int) -> None:
        target = target_offset
        changed = self.log.truncate_to(target)
        assert changed == (target < self.end)
        if not changed:
            return
        if target < self.start:
            self.model, self.start, self.end = [], target, target
            return
        kept = [s for s in self.model if s[1] < target]
        removed = [s for s in self.model if s[1] >= target]
        new_end = min(target, removed[0][0]) if removed else target
        if new_end < self.start:  # the batch holding the log start went: restart at target
            self.model, self.start, self.end = [], target, target
            return
        self.model = kept
        self.end = new_end

    @rule(offset=st.integers(0, 80))
    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.log.truncate_fully_and_start_at(offset, self.now)
        self.model, self.start, self.end = [], offset, offset

    @rule()
    def roll(self) -> None:
        self.log.roll(self.now)

    @rule(hw=st.integers(0, 60))
    def update_high_watermark(self, hw: int) -> None:
        assert self.log.update_high_watermark(hw) == min(max(hw, self.start), self.log.log_end_offset)

    @rule(dt=st.integers(0, 6000))
    def retention(self, dt: int) -> None:
        self.now += dt
        before = self.log.log_start_offset
        self.log.delete_old_segments(self.now)
        self.start = self.log.log_start_offset
        assert before <= self.start <= self.log.high_watermark
        self.model = [s for s in self.model if s[1] >= self.start]

    @rule(fraction=st.floats(0, 1))
    def delete_records(self, fraction: float) -> None:
        hw = self.log.high_watermark
        target = self.start + int((hw - self.start) * fraction)
        changed = self.log.maybe_increment_log_start_offset(target)
        assert changed == (target > self.start)
        self.start = max(self.start, target)
        self.model = [s for s in self.model if s[1] >= self.start]

    @rule()
    def flush(self) -> None:
        self.log.flush()
        assert self.log.recovery_point == self.log.log_end_offset

    @rule()
    def clean_restart(self) -> None:
        self.log.flush()
        self.log.close()
        self.reopen(clean=True)
        self._reconcile_end()

    def _reconcile_end(self) -> None:
        # After a truncation into a gap (follower offsets with holes), the LEO Kafka sets is the
        # target; reloaded, it is the end of the data again. Either is within these bounds.
        data_end = self.model[-1][1] + 1 if self.model else self.start
        assert data_end <= self.log.log_end_offset <= self.end
        self.end = self.log.log_end_offset

    @rule()
    def become_leader(self) -> None:
        # KIP-279: a new leader's epoch starts at its log end before it appends (in memory
        # until a flush needs it on disk).
        self.epoch += 1
        self.log.assign_epoch_start_offset(self.epoch, self.end)

    @rule()
    def kill(self) -> None:
        # kill -9: the page cache survives, the process's memory (an unwritten epoch
        # checkpoint) does not.
        recovery_point = self.log.recovery_point
        self.reopen(clean=False)
        assert self.log.recovery_point <= max(recovery_point, self.log.log_start_offset)
        self._reconcile_end()

    @rule(seed=st.integers(0, 2**16), tear=st.booleans())
    def crash(self, seed: int, tear: bool) -> None:
        durable = [s for s in self.model if s[1] < self.log.recovery_point]
        self.fio.crash(random.Random(seed), tear=tear)
        self.reopen(clean=False)
        stored = [describe(b) for b in self.log.batches(self.log.log_start_offset)]
        assert stored[: len(durable)] == durable
        assert stored == self.model[: len(stored)]  # a prefix: nothing invented, nothing torn
        lost = len(stored) < len(self.model)
        self.model = stored
        assert self.log.log_start_offset == self.start
        if lost:
            assert self.log.log_end_offset <= self.end
            self.end = self.log.log_end_offset
        self._reconcile_end()

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def log_equals_model(self) -> None:
        log = self.log
        assert [describe(b) for b in log.batches(log.log_start_offset)] == self.model
        assert (log.log_start_offset, log.log_end_offset) == (self.start, self.end)
        assert log.log_start_offset <= log.high_watermark <= log.log_end_offset
        assert log.recovery_point <= log.log_end_offset

    @invariant()
    def epoch_cache_matches_the_batches(self) -> None:
        cache = self.log.leader_epoch_cache
        entries = cache.entries
        assert all(a[0] < b[0] and a[1] <= b[1] for a, b in zip(entries, entries[1:], strict=False))
        for base, _, epoch, _ in self.model:
            if epoch >= 0:
                assert cache.epoch_for_offset(max(base, self.start)) == epoch
        if entries:
            assert entries[-1][1] <= self.end
            assert self.log.end_offset_for_epoch(entries[-1][0]) == (entries[-1][0], self.end)


def _split(data: bytearray) -> list[RecordBatch]:
    view = memoryview(data)
    out = []
    pos = 0
    while pos < len(view):
        size = RecordBatch(view[pos:]).batch_length + LOG_OVERHEAD
        out.append(RecordBatch(view[pos : pos + size]))
        pos += size
    return out


LogModel.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogModel = LogModel.TestCase
