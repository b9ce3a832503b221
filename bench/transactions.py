"""Transactions benchmark: what KIP-98 costs the log. Append CPU time per batch for plain,
idempotent and transactional batches (the transactional ones with a COMMIT or ABORT marker
after each), and the CPU time of a 64 KiB fetch read_uncommitted next to read_committed
(reading to the LSO, plus the aborted transactions of the range from the `.txnindex`). Prints a
table and appends it to docs/benchmarks.md.

    .venv/bin/python bench/transactions.py [--batches 10000] [--rounds 9] [--no-write-doc]

CPU time (`time.process_time`), median of rounds, each kind in turn within a round: the machine
is shared, and CPU time is what other jobs disturb least.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _doc import append_run  # noqa: E402
from _machine import machine_description  # noqa: E402

from tidelog.protocol.records.batch import iter_batches  # noqa: E402
from tidelog.protocol.records.builder import (  # noqa: E402
    Record,
    build_batch,
    build_end_transaction_marker,
)
from tidelog.storage.file_io import OsFileIO  # noqa: E402
from tidelog.storage.log import Log  # noqa: E402
from tidelog.storage.log_config import LogConfig  # noqa: E402
from tidelog.storage.transactions import AppendOrigin  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
PRODUCERS = 8
RECORDS = [Record(value=b"x" * 100) for _ in range(10)]


KINDS = {"plain": 0, "idempotent": 0, "transactional, 1 batch per transaction": 1,
         "transactional, 10 batches per transaction": 10}


def batches(kind: str, n: int) -> list[tuple[bytes, AppendOrigin]]:
    """`n` batches of ten 100-byte records; a transactional kind ends each transaction (of
    KINDS[kind] batches of one producer) with its marker (every other one an ABORT), written
    by the coordinator."""
    per_txn = KINDS[kind]
    out: list[tuple[bytes, AppendOrigin]] = []
    sequences = [0] * PRODUCERS
    for i in range(n):
        pid = (i // max(1, per_txn)) % PRODUCERS
        if kind == "plain":
            out.append((bytes(build_batch(RECORDS)), AppendOrigin.CLIENT))
            continue
        out.append((bytes(build_batch(RECORDS, producer_id=pid, producer_epoch=0,
                                      base_sequence=sequences[pid],
                                      transactional=per_txn > 0)),
                    AppendOrigin.CLIENT))
        sequences[pid] += len(RECORDS)
        if per_txn and (i + 1) % per_txn == 0:
            out.append((bytes(build_end_transaction_marker(
                commit=(i // per_txn) % 2 == 0, producer_id=pid, producer_epoch=0,
                coordinator_epoch=0)), AppendOrigin.COORDINATOR))
    return out


def new_log(root: Path, name: str) -> Log:
    return Log(str(root / f"{name}-0"), LogConfig.from_dict({"segment.bytes": 64 << 20}),
               OsFileIO())


def append_us(root: Path, kind: str, data: list[tuple[bytes, AppendOrigin]], r: int,
              n: int) -> float:
    """CPU microseconds per data batch (markers included in the transactional cost)."""
    log = new_log(root, f"{list(KINDS).index(kind)}-{r}")
    t = time.process_time()
    for records, origin in data:
        log.append_as_leader(records, 0, 0, origin)
    spent = time.process_time() - t
    log.close()
    return spent / n * 1e6


def fetch_us(log: Log, committed: bool) -> tuple[float, int]:
    """CPU microseconds per 64 KiB fetch reading the whole log, and the fetches made."""
    end = log.last_stable_offset if committed else log.high_watermark
    offset = fetches = 0
    t = time.process_time()
    while offset < end:
        info = log.read(offset, 64 * 1024, max_offset=end)
        if committed:
            log.aborted_transactions_for_read(info)
        offset = [b.last_offset + 1 for b in iter_batches(bytes(info.records))][-1]
        fetches += 1
    return (time.process_time() - t) / fetches * 1e6, fetches


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--no-write-doc", action="store_true")
    args = ap.parse_args()
    kinds = tuple(KINDS)
    data = {k: batches(k, args.batches) for k in kinds}
    appends: dict[str, list[float]] = {k: [] for k in kinds}
    reads: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for r in range(args.rounds):
            for k in kinds:
                appends[k].append(append_us(root, k, data[k], r, args.batches))
        log = new_log(root, "reads")
        for records, origin in data["transactional, 1 batch per transaction"]:
            log.append_as_leader(records, 0, 0, origin)
        log.update_high_watermark(log.log_end_offset)
        aborted = sum(len(s.txn_index) for s in log.segments)
        for _ in range(args.rounds):
            for committed in (False, True):
                us, fetches = fetch_us(log, committed)
                reads[committed].append(us)
        log.close()
    rows = [f"| append, {k} | {statistics.median(appends[k]):.2f} µs per batch |"
            for k in kinds]
    rows += [f"| 64 KiB fetch, {name} | {statistics.median(reads[c]):.1f} µs per fetch |"
             for c, name in ((False, "read_uncommitted"), (True, "read_committed"))]
    block = (
        f"### run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n\n"
        f"Machine: {machine_description()}.\n"
        f"Command: `python bench/transactions.py --batches {args.batches} "
        f"--rounds {args.rounds}`\n"
        f"Batches of 10 records of 100 B from {PRODUCERS} producers; the read log holds "
        f"{args.batches} transactions, {aborted} aborted, read in {fetches} fetches.\n\n"
        "| what | CPU time (median of rounds) |\n|---|---:|\n" + "\n".join(rows) + "\n"
    )
    print(block)
    if not args.no_write_doc:
        intro = (
            "## transactions\n\n"
            "`bench/transactions.py`: what KIP-98 costs the log (issue 17). Append CPU time per\n"
            "batch for plain, idempotent and transactional batches (a transaction's COMMIT/ABORT\n"
            "marker counted in the cost of its batches), and a 64 KiB fetch read_uncommitted next\n"
            "to read_committed (to the LSO, with the aborted transactions of the range from the\n"
            "`.txnindex`). CPU time, so that the shared machine's other jobs disturb it least.\n"
        )
        append_run(DOC, "## transactions", intro, block)


if __name__ == "__main__":
    main()
