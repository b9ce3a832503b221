"""Fuzzing the loader: whatever bytes a log dir holds, opening the log never raises (other than
KafkaStorageError for I/O), keeps only valid batches in increasing order, and accepts appends."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import batch, small_config

from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log import Log

DIR = "/fuzz/t-0"


def valid_segment(count: int, start: int) -> bytes:
    return b"".join(bytes(batch(b"v" * i, base_offset=start + i, epoch=i // 3)) for i in range(count))


@st.composite
def damaged_files(draw: st.DrawFn) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for base in sorted(draw(st.sets(st.sampled_from([0, 5, 9, 20, 40]), min_size=1, max_size=3))):
        data = bytearray(valid_segment(draw(st.integers(0, 12)), base))
        for _ in range(draw(st.integers(0, 3))):
            if data:
                data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        if draw(st.booleans()) and data:
            del data[draw(st.integers(0, len(data) - 1)) :]
        if draw(st.booleans()):
            data += draw(st.binary(max_size=80))
        name = f"{base:020d}"
        files[f"{name}.log"] = bytes(data)
        if draw(st.booleans()):
            files[f"{name}.index"] = draw(st.binary(max_size=40))
        if draw(st.booleans()):
            files[f"{name}.timeindex"] = draw(st.binary(max_size=40))
    if draw(st.booleans()):
        files["leader-epoch-checkpoint"] = draw(
            st.sampled_from([b"0\n1\n0 0\n", b"0\n2\n1 0\n", b"garbage", b"0\n1\n9 99999\n"])
        )
    if draw(st.booleans()):
        files[draw(st.sampled_from(["x.log", "junk", "00000000000000000003.index"]))] = b"?"
    return files


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    files=damaged_files(),
    recovery_point=st.integers(0, 50),
    log_start=st.integers(0, 12),
    clean=st.booleans(),
)
def test_any_damage_loads_into_a_consistent_log(
    files: dict[str, bytes], recovery_point: int, log_start: int, clean: bool
) -> None:
    fio = MemoryFileIO()
    for name, data in files.items():
        fio.write_file(f"{DIR}/{name}", data)
    log = Log(DIR, small_config(), fio, recovery_point=recovery_point,
              log_start_offset=log_start, had_clean_shutdown=clean)
    stored = list(log.batches(log.log_start_offset))
    assert all(b.is_valid() for b in stored)
    offsets = [(b.base_offset, b.last_offset) for b in stored]
    assert all(a[1] < b[0] for a, b in zip(offsets, offsets[1:], strict=False))
    assert log.log_start_offset <= log.log_end_offset
    if stored:
        assert stored[-1].last_offset < log.log_end_offset
    entries = log.leader_epoch_cache.entries
    assert all(start <= log.log_end_offset for _, start in entries)
    leo = log.log_end_offset
    assert log.append_as_leader(batch(), 50, 0).first_offset == leo
    log.flush()
    log.close()
    again = Log(DIR, small_config(), fio, recovery_point=0, log_start_offset=log.log_start_offset)
    assert again.log_end_offset == leo + 1
