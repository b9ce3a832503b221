"""Log cleaner benchmark: cleaning throughput (MB/s of dirty log read) on a compacted log with
10% and 90% duplicate keys, and the group coordinator's load time of a `__consumer_offsets`
partition after many commits, with and without cleaning. Prints tables and appends them to
docs/benchmarks.md.

    .venv/bin/python bench/cleaner.py [--mib 1024] [--rounds 1] [--commits 1000000]
                                      [--no-write-doc]

The offsets partition holds `--commits` single-record commit batches (one a commit request, as
the coordinator writes them) over 100 groups x 10 partitions; the load replays it with the
coordinator's `load_partition`, before and after one clean.

Each round writes a fresh log (64 MiB segments, batches of 100 records of 100-byte values, keys
interleaved so that a fraction of the records repeat an earlier key) in a temporary directory,
then times one full clean of everything below the active segment (offset map build + rewrite +
swap) on real files (OsFileIO). Wall time and the process's CPU time are both recorded: on a
shared machine the CPU time is the steadier figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine_description  # noqa: E402

from tidelog.coordinator.offsets import (  # noqa: E402
    OffsetAndMetadata,
    encode_offset_commit_key,
    encode_offset_commit_value,
    load_partition,
)
from tidelog.protocol.records.builder import Record, build_batch  # noqa: E402
from tidelog.storage.cleaner.log_cleaner import Cleaner, log_to_clean  # noqa: E402
from tidelog.storage.cleaner.offset_map import OffsetMap  # noqa: E402
from tidelog.storage.file_io import OsFileIO  # noqa: E402
from tidelog.storage.log import Log  # noqa: E402
from tidelog.storage.log_config import LogConfig  # noqa: E402

MIB = 1024 * 1024
DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
PER_BATCH = 100
VALUE = 100


def write_log(path: Path, total: int, duplicates: float) -> tuple[Log, int]:
    config = LogConfig.from_dict({"cleanup.policy": "compact", "segment.bytes": 64 * MIB,
                                  "file.delete.delay.ms": 0})
    log = Log(str(path), config, OsFileIO())
    value = os.urandom(VALUE)
    # batch size first, to know how many records make `total`
    probe = len(build_batch([Record(value, key=b"key-%012d" % i) for i in range(PER_BATCH)]))
    records = (total // probe) * PER_BATCH
    distinct = max(1, int(records * (1 - duplicates)))
    for start in range(0, records, PER_BATCH):
        batch = build_batch([Record(value, key=b"key-%012d" % (i % distinct))
                             for i in range(start, start + PER_BATCH)], base_timestamp=0)
        log.append_as_leader(batch, 0, now_ms=0)
    log.roll(0)
    log.update_high_watermark(log.log_end_offset)
    return log, records


def clean_once(workdir: Path, total: int, duplicates: float) -> tuple[float, float, int, int]:
    path = workdir / "bench-0"
    shutil.rmtree(path, ignore_errors=True)
    log, _ = write_log(path, total, duplicates)
    before = log.size
    cleaner = Cleaner(OffsetMap(1024 * MIB))  # the map holds every key: one pass
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in cleaner.clean(log_to_clean(log, None, 1), 1):
        pass
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    after = log.size
    log.close()
    shutil.rmtree(path, ignore_errors=True)
    return elapsed, cpu, before, after


def offsets_load_times(workdir: Path, commits: int) -> tuple[int, float, int, float, float]:
    """(bytes, load time, bytes after cleaning, load time after, clean time)."""
    path = workdir / "__consumer_offsets-0"
    shutil.rmtree(path, ignore_errors=True)
    config = LogConfig.from_dict({"cleanup.policy": "compact", "segment.bytes": 100 * MIB,
                                  "file.delete.delay.ms": 0})
    log = Log(str(path), config, OsFileIO())
    keys = [encode_offset_commit_key(f"group-{g}", "orders", p)
            for g in range(100) for p in range(10)]
    for i in range(commits):
        value = encode_offset_commit_value(OffsetAndMetadata(i, 0, "", i))
        log.append_as_leader(build_batch([Record(value, key=keys[i % len(keys)])],
                                         base_timestamp=i), 0, now_ms=i)
    log.roll(commits)
    log.update_high_watermark(log.log_end_offset)

    def load() -> float:
        t0 = time.perf_counter()
        loaded = load_partition(log.batches(log.log_start_offset), log.log_end_offset)
        elapsed = time.perf_counter() - t0
        assert sum(len(v) for v in loaded.offsets.values()) == len(keys)
        return elapsed

    before, load_before = log.size, load()
    t0 = time.perf_counter()
    for _ in Cleaner(OffsetMap(128 * MIB)).clean(log_to_clean(log, None, commits), commits):
        pass
    clean_s = time.perf_counter() - t0
    after, load_after = log.size, load()
    log.close()
    shutil.rmtree(path, ignore_errors=True)
    return before, load_before, after, load_after, clean_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="size of the dirty log")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per ratio (median kept)")
    parser.add_argument("--commits", type=int, default=1_000_000,
                        help="offset commits in the __consumer_offsets partition (0: skip)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--no-write-doc", action="store_true", help="print only")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tidelog-cleaner-", dir=args.dir))
    rows = []
    try:
        for duplicates in (0.1, 0.9):
            runs = [clean_once(workdir, args.mib * MIB, duplicates) for _ in range(args.rounds)]
            elapsed = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            before, after = runs[0][2], runs[0][3]
            rows.append((duplicates, before, after, elapsed, cpu))
        offsets = offsets_load_times(workdir, args.commits) if args.commits else None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    lines = [
        f"### run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC (bench/cleaner.py --mib {args.mib} "
        f"--rounds {args.rounds} --commits {args.commits})",
        "",
        f"Machine: {machine_description(str(workdir.parent))}.",
        "",
        "| duplicate keys | dirty log | cleaned log | wall time | MB/s (wall) | CPU time | MB/s (CPU) |",
        "|---|---|---|---|---|---|---|",
    ]
    for duplicates, before, after, elapsed, cpu in rows:
        lines.append(f"| {duplicates:.0%} | {before / MIB:.0f} MiB | {after / MIB:.0f} MiB | "
                     f"{elapsed:.1f} s | {before / MIB / elapsed:.1f} | {cpu:.1f} s | "
                     f"{before / MIB / cpu:.1f} |")
    if offsets is not None:
        before, load_before, after, load_after, clean_s = offsets
        lines += [
            "",
            f"`__consumer_offsets` partition after {args.commits:,} commits (1,000 keys): the "
            "coordinator's load (`load_partition`)",
            "",
            "| | log size | load time |",
            "|---|---|---|",
            f"| not cleaned | {before / MIB:.1f} MiB | {load_before:.2f} s |",
            f"| cleaned ({clean_s:.1f} s) | {after / MIB:.2f} MiB | {load_after:.3f} s |",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write_doc:
        section = "## log cleaner\n"
        with DOC.open("a") as f:
            if section not in DOC.read_text():
                f.write("\n" + section)
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
