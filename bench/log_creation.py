"""Log creation benchmark (issue 12 item 6): the time a broker's LogManager takes to create N
new, empty logs on the real disk, as a LeaderAndIsr for N new partitions does on the event loop.

    .venv/bin/python bench/log_creation.py [--logs 3333] [--rounds 3] [--baseline REV]

Each round creates the logs in a fresh directory next to the repository (the real disk, not a
tmpfs) in a child process, for the working tree and, with --baseline, for tidelog at REV
(exported with git archive), alternating, so both sides see the same machine load. Prints the
median time, per log, and the directory fsyncs counted, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _baseline import baseline_source, tidelog_from
from _machine import machine_description

ROOT = Path(__file__).resolve().parent.parent


def _create_logs(count: int, data_dir: str) -> dict[str, float]:
    """In the child: create `count` logs with the tidelog found on sys.path."""
    from tidelog.storage.file_io import OsFileIO
    from tidelog.storage.log_config import LogConfig
    from tidelog.storage.log_manager import LogManager

    class CountingFileIO(OsFileIO):
        dir_fsyncs = 0

        def fsync_dir(self, path: str) -> None:
            CountingFileIO.dir_fsyncs += 1
            super().fsync_dir(path)

    fio = CountingFileIO()
    manager = LogManager([data_dir], LogConfig(), fio)
    CountingFileIO.dir_fsyncs = 0
    start = time.perf_counter()
    for p in range(count):
        manager.get_or_create_log("scale", p, is_new=True)
    elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "dir_fsyncs": CountingFileIO.dir_fsyncs}


def _round(count: int, src: Path | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=ROOT.parent, prefix="log-creation-") as tmp:
        with tidelog_from(src):
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(count), os.path.join(tmp, "data")],
                capture_output=True, text=True, check=True, env=os.environ.copy()).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=3333)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="REV", help="also measure tidelog at REV")
    parser.add_argument("--child", nargs=2, metavar=("COUNT", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_create_logs(int(args.child[0]), args.child[1])))
        return 0
    sides: dict[str, Path | None] = {"working tree": None}
    export = Path(tempfile.mkdtemp(prefix="log-creation-baseline-"))
    try:
        if args.baseline:
            sides[args.baseline] = baseline_source(args.baseline, export)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        loads = [os.getloadavg()[0]]
        for _ in range(args.rounds):
            for name, src in sides.items():
                results[name].append(_round(args.logs, src))
                loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(export, ignore_errors=True)
    print(f"Machine: {machine_description(str(ROOT))}")
    print(f"load average (1 min) during the run: {min(loads):.1f}-{max(loads):.1f}")
    print("| tidelog | logs | median | per log | rounds | directory fsyncs |")
    print("|---|---:|---:|---:|---|---:|")
    for name, rounds in results.items():
        seconds = [r["seconds"] for r in rounds]
        median = statistics.median(seconds)
        print(f"| {name} | {args.logs:,} | {median:.2f} s | {median / args.logs * 1000:.2f} ms | "
              f"{', '.join(f'{s:.2f}' for s in seconds)} | {int(rounds[0]['dir_fsyncs']):,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
