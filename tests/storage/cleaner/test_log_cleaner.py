"""The log cleaner against a model: after a clean, every key's latest record survives at its
original offset, in order; tombstones stay until their batch's delete horizon
(delete.retention.ms after the clean that first kept them) and go after it. Also the bounds of
a clean (Kafka's first uncleanable offset) and the offset map's size bound."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.protocol.records.batch import RecordBatch, iter_batches
from tidelog.protocol.records.builder import Record, build_batch
from tidelog.protocol.records.decoder import decode_records
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.cleaner.log_cleaner import Cleaner, cleanable_offsets, log_to_clean
from tidelog.storage.cleaner.offset_map import OffsetMap
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_validator import InvalidRecordError

RETENTION = 1_000


def compacted_log(fio: MemoryFileIO | None = None, **overrides: object) -> Log:
    props: dict[str, object] = {"cleanup.policy": "compact", "segment.bytes": 600,
                                "delete.retention.ms": RETENTION, "file.delete.delay.ms": 0}
    props.update({k.replace("_", "."): v for k, v in overrides.items()})
    return Log("/d/c-0", LogConfig.from_dict(props), fio or MemoryFileIO())


def append(log: Log, records: list[tuple[bytes | None, bytes | None]], ts: int,
           producer_id: int = -1, base_sequence: int = 0) -> None:
    batch = build_batch([Record(v, key=k) for k, v in records], base_timestamp=ts,
                        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                        base_sequence=base_sequence if producer_id >= 0 else -1)
    log.append_as_leader(batch, 0, now_ms=ts)


def contents(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for b in log.batches(0) for r in decode_records(b)]


def clean(log: Log, now_ms: int, cleaner: Cleaner | None = None) -> int | None:
    """Roll and advance the HW so that everything is cleanable, then clean once."""
    log.roll(now_ms)
    log.update_high_watermark(log.log_end_offset)
    cleaner = cleaner or Cleaner(OffsetMap(1 << 20))
    for _ in cleaner.clean(log_to_clean(log, None, now_ms), now_ms):
        pass
    return cleaner.end_offset


@dataclass
class Model:
    """The log as a list of batches of (offset, key, value), with each batch's horizon."""

    batches: list[list[tuple[int, bytes, bytes | None]]] = field(default_factory=list)
    horizons: list[int | None] = field(default_factory=list)
    next_offset: int = 0

    def append(self, records: list[tuple[bytes, bytes | None]]) -> None:
        self.batches.append([(self.next_offset + i, k, v) for i, (k, v) in enumerate(records)])
        self.horizons.append(None)
        self.next_offset += len(records)

    def clean(self, now_ms: int) -> None:
        latest = {k: o for batch in self.batches for o, k, _ in batch}
        for i, batch in enumerate(self.batches):
            horizon = self.horizons[i]
            kept = [(o, k, v) for o, k, v in batch
                    if latest[k] == o and (v is not None or horizon is None or now_ms < horizon)]
            if horizon is None and any(v is None for _, _, v in kept):
                self.horizons[i] = now_ms + RETENTION
            self.batches[i] = kept

    def contents(self) -> list[tuple[int, bytes, bytes | None]]:
        return [r for batch in self.batches for r in batch]


keys = st.sampled_from([b"a", b"b", b"c", b"d", b"e"])
values = st.one_of(st.none(), st.binary(min_size=1, max_size=30))
batches = st.lists(st.tuples(keys, values), min_size=1, max_size=4)
steps = st.lists(st.one_of(batches.map(lambda b: ("append", b)),
                           st.integers(0, 2 * RETENTION).map(lambda dt: ("clean", dt))),
                 min_size=1, max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_a_clean_keeps_the_latest_record_per_key_at_its_offset_as_the_model(
        ops: list[tuple[str, object]]) -> None:
    log = compacted_log()
    model = Model()
    now = 0
    for op, arg in ops:
        if op == "append":
            records = arg  # type: ignore[assignment]
            append(log, records, now)  # type: ignore[arg-type]
            model.append(records)  # type: ignore[arg-type]
        else:
            now += arg  # type: ignore[operator]
            clean(log, now)
            model.clean(now)
            assert contents(log) == model.contents()
        assert log.log_end_offset == model.next_offset
    before = contents(log)
    for offset, _, _ in before:  # the cleaned segments' indexes find every record left
        first = next(iter_batches(log.read(offset, 1).records))
        assert first.base_offset <= offset <= first.last_offset
    log.close()
    reopened = Log("/d/c-0", log.config, log.file_io, had_clean_shutdown=True)
    assert contents(reopened) == before  # loaded from the index files written by the cleaner


def test_a_tombstone_stays_for_delete_retention_ms_then_goes() -> None:
    log = compacted_log()
    append(log, [(b"k", b"v1"), (b"j", b"w")], 0)
    append(log, [(b"k", None)], 0)
    clean(log, 100)  # the tombstone's batch gets its horizon: 100 + RETENTION
    assert contents(log) == [(1, b"j", b"w"), (2, b"k", None)]
    [_, tombstone_batch] = list(log.batches(0))
    assert tombstone_batch.delete_horizon_ms == 100 + RETENTION
    clean(log, 100 + RETENTION - 1)
    assert contents(log) == [(1, b"j", b"w"), (2, b"k", None)]
    clean(log, 100 + RETENTION)
    assert contents(log) == [(1, b"j", b"w")]


def test_a_rewritten_batch_keeps_its_offsets_and_producer_fields() -> None:
    log = compacted_log()
    append(log, [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")], 5, producer_id=7)
    append(log, [(b"a", b"4")], 6)
    clean(log, 10)
    first: RecordBatch = next(log.batches(0))
    assert (first.base_offset, first.last_offset, first.record_count) == (0, 2, 2)
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (7, 0, 0)
    assert first.is_valid()
    assert [(r.offset, r.timestamp) for r in decode_records(first)] == [(1, 5), (2, 5)]


def test_a_compacted_topic_refuses_an_unkeyed_record_with_invalid_record() -> None:
    log = compacted_log()
    with pytest.raises(InvalidRecordError) as info:
        append(log, [(b"a", b"1"), (None, b"x")], 0)
    assert info.value.error_code == 87
    assert log.log_end_offset == 0


def test_unkeyed_records_written_before_compaction_are_removed_by_the_clean() -> None:
    log = compacted_log(cleanup_policy="delete")
    append(log, [(None, b"x"), (b"a", b"1")], 0)
    log.update_config(replace(log.config, cleanup_policy="compact"))  # a topic config change
    clean(log, 1)
    assert contents(log) == [(1, b"a", b"1")]


def test_the_active_segment_and_records_above_the_high_watermark_stay_dirty() -> None:
    log = compacted_log(segment_bytes=10_000)
    append(log, [(b"a", b"1")], 0)
    append(log, [(b"a", b"2")], 0)
    log.update_high_watermark(log.log_end_offset)
    assert cleanable_offsets(log, None, 0)[:2] == (0, 0)  # all in the active segment
    log.roll(0)
    append(log, [(b"a", b"3")], 0)
    log.update_high_watermark(1)
    assert cleanable_offsets(log, None, 0)[:2] == (0, 1)  # the HW (the LSO) bounds it
    log.update_high_watermark(log.log_end_offset)
    assert cleanable_offsets(log, None, 0)[:2] == (0, 2)  # the active segment's base


def test_min_compaction_lag_keeps_young_segments_dirty() -> None:
    log = compacted_log(min_compaction_lag_ms=500)
    append(log, [(b"a", b"1")], 0)
    log.roll(0)
    append(log, [(b"a", b"2")], 400)
    log.roll(400)
    log.update_high_watermark(log.log_end_offset)
    assert cleanable_offsets(log, None, 800)[:2] == (0, 1)  # the 400 ms record is too young
    assert cleanable_offsets(log, None, 901)[:2] == (0, 2)


def test_max_compaction_lag_forces_a_clean_below_the_dirty_ratio() -> None:
    log = compacted_log(max_compaction_lag_ms=1000, min_cleanable_dirty_ratio=0.99)
    append(log, [(b"a", b"1")], 0)
    log.roll(0)
    log.update_high_watermark(log.log_end_offset)
    assert not cleanable_offsets(log, None, 1000)[2]
    assert cleanable_offsets(log, None, 1001)[2]


def test_a_small_offset_map_cleans_in_several_passes_to_the_same_result() -> None:
    big, small = compacted_log(), compacted_log()
    for i in range(60):
        for log in (big, small):
            append(log, [(b"k%d" % (i % 12), b"v%d" % i)], i)
    clean(big, 100)
    tiny = Cleaner(OffsetMap(24 * 6, load_factor=1.0))  # six keys at a time
    ends = []
    checkpoint: int | None = None
    small.roll(100)
    small.update_high_watermark(small.log_end_offset)
    for _ in range(20):
        ltc = log_to_clean(small, checkpoint, 100)
        if ltc.first_dirty_offset >= ltc.first_uncleanable_offset:
            break
        for _ in tiny.clean(ltc, 100):
            pass
        assert tiny.offset_map.size <= 6
        checkpoint = tiny.end_offset
        ends.append(checkpoint)
    assert len(ends) > 1 and ends == sorted(ends)
    assert contents(small) == contents(big)
    assert contents(big) == [(i, b"k%d" % (i % 12), b"v%d" % i) for i in range(48, 60)]


def test_the_clean_aborts_when_the_log_is_truncated_under_it() -> None:
    log = compacted_log(segment_bytes=100_000)
    for i in range(200):
        append(log, [(b"k%d" % (i % 3), b"x" * 50)], i)
    log.roll(200)
    append(log, [(b"z", b"1")], 200)
    log.update_high_watermark(log.log_end_offset)
    before = contents(log)
    cleaner = Cleaner(OffsetMap(1 << 20), step_bytes=1024)
    steps = cleaner.clean(log_to_clean(log, None, 300), 300)
    next(steps)  # the map
    log.truncate_to(100)  # a follower truncation below the dirty section's end
    for _ in steps:
        pass
    assert cleaner.aborted and cleaner.end_offset is None
    assert contents(log) == before[:100]
    assert not [n for n in log.file_io.listdir(log.dir) if n.endswith(".cleaned")]


def test_the_last_batch_of_an_active_producer_stays_as_an_empty_batch() -> None:
    log = compacted_log()
    append(log, [(b"a", b"1")], 1000, producer_id=5)  # superseded, not producer 5's last batch
    append(log, [(b"b", b"1")], 1000, producer_id=5, base_sequence=1)  # superseded, its last
    append(log, [(b"c", b"1")], 0, producer_id=6)  # superseded, producer 6 expired by then
    append(log, [(b"a", b"2"), (b"b", b"2"), (b"c", b"2")], 86_400_000)
    clean(log, 86_400_000)
    batches = list(log.batches(0))
    empty = [b for b in batches if b.record_count == 0]
    assert [(b.base_offset, b.last_offset, b.producer_id, b.base_sequence) for b in empty] == [
        (1, 1, 5, 1)]
    assert empty[0].is_valid()
    assert contents(log) == [(3, b"a", b"2"), (4, b"b", b"2"), (5, b"c", b"2")]
    clean(log, 86_400_001)  # kept as it is by the next clean
    assert [b.base_offset for b in log.batches(0) if b.record_count == 0] == [1]
