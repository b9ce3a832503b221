"""What holds a broker's event loop, by cause, under a fixed-rate load (issue 12 item 5).

    .venv/bin/python bench/loop_stalls.py [--rate 5000] [--linger 5] [--rounds 3]
        [--baseline REV]

tidelog's fixed-rate p50 is a few ms while its p99 swings between rounds of the same row: the
tail is stalls, every record that arrives while a broker's event loop is held waits for it. This
counts them where they happen, in the brokers, so that a loaded machine (other processes taking
the CPU) does not hide or fake them the way it moves a wall-clock p99.

Each broker process imports a `sitecustomize` (a temporary directory put first on PYTHONPATH, so
the brokers' code is not touched; as bench/round_trip_steps.py) that starts one sampler thread:
every `SAMPLE_MS` it looks at the main thread's stack and, below the event loop's own frames,
at the frame the loop called (a protocol callback, a timer, a task's step). An episode is one
such frame seen in consecutive samples; its length is measured from the sample before it was
first seen to the sample that no longer saw it (an upper bound, off by about one sample period
when the loop was idle around it; a CPU-bound callback is sampled only when it lets the
sampler have the GIL, every sys.getswitchinterval(), which does not change the bound), with the
main thread's CPU time and its time runnable but waiting for a CPU (/proc schedstat) over the
same span. An episode counts when its wall time less that wait is at least `--min-ms` (what
the broker did to its own loop: CPU work, or blocking in a system call or on the GIL, not what
the machine's load did); it is kept with the stack most often seen during it (the leaf says
what held the loop: an fsync, a loop over partitions). `gc.callbacks` times every collection.
Pure asyncio and uvloop both: the loop's frames are those of asyncio's and uvloop's modules.
Caveat: the sampler is a thread of the broker; on an overloaded machine it may hold the GIL
while it waits for a CPU, and the main thread, back from a system call (a read of the page
cache, a socket write), waits for it: such episodes show a leaf at a system call with little
CPU. Compare clusters measured in the same run, by cause.

A round is one row (`--rate` records/s of 1 KiB at `--linger` linger.ms, `--seconds`, acks=all,
a fresh 6-partition RF=3 topic with min.insync.replicas=2) on each cluster in turn (this tree,
and with `--baseline REV` tidelog at REV beside it, as bench/cluster.py's `--baseline`). Stalls
are counted inside the rows' produce windows only (topic creation and deletion between rows
are not the rows' latency), summed over the 3 brokers, grouped by the function the loop called
and the leaf of its most seen stack. Prints the tables; nothing is written to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _baseline import baseline_source, environment
from _machine import load_average, machine_description
from cluster import (
    RF3_CONFIG,
    broker_pids,
    create_topic,
    delete_topic,
    percentile,
    prime_topic,
    produce_for,
    start_tidelog,
)

from tidelog.cluster.local import LocalCluster

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_MS = 1.0
RECORD_SIZE = 1024

SITECUSTOMIZE = '''
import gc, json, os, sys, threading, time

_OUT = os.environ["LOOP_STALLS_OUT"]
_MIN_S = float(os.environ["LOOP_STALLS_MIN_MS"]) / 1000
_PERIOD_S = float(os.environ["LOOP_STALLS_SAMPLE_MS"]) / 1000
_LOOP_FILES = ("asyncio/base_events.py", "asyncio/events.py", "asyncio/runners.py",
               "uvloop/__init__.py")
_episodes = []
_collections = []
_lock = threading.Lock()


def _name(frame):
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{code.co_qualname}"


def _called(frame):
    """(the frame the loop called, its stack from there as names) or None: idle, or the
    loop not running."""
    stack = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    stack.reverse()
    i = 0
    while i < len(stack) and not stack[i].f_code.co_filename.endswith(_LOOP_FILES):
        i += 1
    while i < len(stack) and stack[i].f_code.co_filename.endswith(_LOOP_FILES):
        i += 1
    if i >= len(stack):
        return None
    return stack[i], tuple(f"{_name(f)}:{f.f_lineno}" for f in stack[i:])


def _sample():
    main = threading.main_thread()
    cpu_clock = time.pthread_getcpuclockid(main.ident)
    schedstat = f"/proc/self/task/{main.native_id}/schedstat"

    def clocks():
        """(now, the main thread's CPU time, its time runnable but waiting for a CPU), s"""
        with open(schedstat) as f:
            waited = int(f.read().split()[1]) / 1e9
        return time.perf_counter(), time.clock_gettime(cpu_clock), waited

    current = None  # [root frame, clocks before it was seen, wall start, {stack: samples}]
    previous = clocks()
    while True:
        time.sleep(_PERIOD_S)
        frame = sys._current_frames().get(main.ident)
        now = clocks()
        seen = _called(frame) if frame is not None else None
        del frame
        if current is not None and (seen is None or seen[0] is not current[0]):
            held, cpu, waited = (now[i] - current[1][i] for i in range(3))
            if held >= _MIN_S:
                stack = max(current[3].items(), key=lambda kv: kv[1])[0]
                with _lock:
                    _episodes.append({"wall": current[2], "ms": held * 1000,
                                      "cpu_ms": cpu * 1000, "wait_ms": waited * 1000,
                                      "root": _name(current[0]), "stack": stack,
                                      "samples": sum(current[3].values())})
            current = None
        if seen is not None:
            if current is None:
                current = [seen[0], previous, time.time() - (now[0] - previous[0]), {}]
            current[3][seen[1]] = current[3].get(seen[1], 0) + 1
        previous = now


_gc_start = [0.0]


def _on_gc(phase, info):
    if phase == "start":
        _gc_start[0] = time.perf_counter()
        return
    held = time.perf_counter() - _gc_start[0]
    if held >= 0.001:
        with _lock:
            _collections.append({"wall": time.time(), "ms": held * 1000,
                                 "generation": info["generation"],
                                 "collected": info["collected"],
                                 "thread": threading.current_thread().name})


def _dump():
    path = os.path.join(_OUT, f"{os.getpid()}.json")
    while True:
        time.sleep(1.0)
        with _lock:
            data = json.dumps({"episodes": _episodes, "collections": _collections})
        with open(path + ".tmp", "w") as f:
            f.write(data)
        os.replace(path + ".tmp", path)


gc.callbacks.append(_on_gc)
threading.Thread(target=_sample, name="loop-stalls-sampler", daemon=True).start()
threading.Thread(target=_dump, name="loop-stalls-dump", daemon=True).start()
'''


@dataclass
class Window:
    """One row on one cluster: when its records were produced, and its latencies."""
    cluster: str
    start: float
    end: float
    p50_ms: float
    p99_ms: float
    load: float


@dataclass
class Instrumented:
    name: str
    cluster: LocalCluster
    out: Path
    windows: list[Window] = field(default_factory=list)


def start_instrumented(name: str, workdir: Path, site: Path, src: Path | None,
                       min_ms: float) -> Instrumented:
    out = workdir / "stalls"
    shutil.rmtree(workdir, ignore_errors=True)
    out.mkdir(parents=True)
    path = os.pathsep.join(str(p) for p in (site, src) if p is not None)
    # (the brokers only: this process and the producer stay uninstrumented)
    with environment(PYTHONPATH=path, LOOP_STALLS_OUT=str(out), LOOP_STALLS_MIN_MS=str(min_ms),
                     LOOP_STALLS_SAMPLE_MS=str(SAMPLE_MS)):
        cluster = start_tidelog(workdir / "cluster")
    return Instrumented(name, cluster, out)


def run_row(c: Instrumented, rate: int, linger: int, seconds: float, partitions: int) -> Window:
    bootstrap = c.cluster.bootstrap_servers
    topic = f"stalls-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions, 3, RF3_CONFIG)
    prime_topic(bootstrap, topic, partitions)
    start = time.time()
    d = produce_for(bootstrap, topic, RECORD_SIZE, seconds, rate_records_s=rate,
                    linger_ms=linger)
    end = time.time()
    delete_topic(bootstrap, topic)
    lat = sorted(d.latencies)
    w = Window(c.name, start, end, percentile(lat, 50), percentile(lat, 99),
               os.getloadavg()[0])
    c.windows.append(w)
    print(f"  {c.name}: p50 {w.p50_ms:.2f} ms, p99 {w.p99_ms:.2f} ms, {d.ok:,} records, "
          f"{d.errors} errors (load average {load_average()})", flush=True)
    return w


def collect(c: Instrumented) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Broker id -> its sampler's episodes and collections (the last dump, <= 1 s old)."""
    time.sleep(1.5)
    out = {}
    for broker, pid in broker_pids(c.cluster).items():
        f = c.out / f"{pid}.json"
        out[broker] = json.loads(f.read_text()) if f.exists() else {"episodes": [],
                                                                    "collections": []}
    return out


def in_windows(wall: float, windows: list[Window]) -> bool:
    return any(w.start <= wall <= w.end for w in windows)


def stall_table(c: Instrumented, data: dict[int, dict[str, list[dict[str, Any]]]],
                min_ms: float, top: int = 15) -> str:
    """The stalls inside the rows by cause. 'Held' is an episode's wall time less the time
    the main thread was runnable but waiting for a CPU (its schedstat): what the broker did
    to its own loop (CPU work, or blocking in a system call or on the GIL), not what the
    machine's load did; only episodes held >= ``min_ms`` count."""
    rows: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    starved: list[dict[str, Any]] = []
    for d in data.values():
        for e in d["episodes"]:
            if not in_windows(e["wall"], c.windows):
                continue
            if e["ms"] - e["wait_ms"] >= min_ms:
                rows[(e["root"], " < ".join(reversed(e["stack"][-3:])))].append(e)
            else:
                starved.append(e)
    gcs: dict[int, list[float]] = defaultdict(list)
    for d in data.values():
        for g in d["collections"]:
            if in_windows(g["wall"], c.windows):
                gcs[g["generation"]].append(g["ms"])
    seconds = sum(w.end - w.start for w in c.windows)

    def held(es: list[dict[str, Any]]) -> list[float]:
        return [e["ms"] - e["wait_ms"] for e in es]

    lines = [f"{c.name}: the loop held >= {min_ms:g} ms (less the time waiting for a CPU) "
             f"inside {len(c.windows)} rows ({seconds:.0f} s of produce), 3 brokers:", "",
             "| called by the loop | most seen stack (leaf first) | stalls | held ms | "
             "of which on CPU ms | median held ms | max held ms |",
             "|---|---|---:|---:|---:|---:|---:|"]
    ranked = sorted(rows.items(), key=lambda kv: -sum(held(kv[1])))
    for (root, stack), es in ranked[:top]:
        h = held(es)
        lines.append(f"| {root} | {stack} | {len(es)} | {sum(h):,.0f} | "
                     f"{sum(e['cpu_ms'] for e in es):,.0f} | {statistics.median(h):.1f} | "
                     f"{max(h):.1f} |")
    rest = [e for _, es in ranked[top:] for e in es]
    if rest:
        h = held(rest)
        lines.append(f"| ({len(ranked) - top} other causes) | | {len(rest)} | {sum(h):,.0f} | "
                     f"{sum(e['cpu_ms'] for e in rest):,.0f} | {statistics.median(h):.1f} | "
                     f"{max(h):.1f} |")
    every = [e for es in rows.values() for e in es]
    h = held(every)
    lines.append(f"| all | | {len(every)} | {sum(h):,.0f} | "
                 f"{sum(e['cpu_ms'] for e in every):,.0f} | "
                 f"{statistics.median(h) if h else 0:.1f} | {max(h, default=0):.1f} |")
    files = [e for e in every if any(":write_file_atomically:" in f for f in e["stack"])]
    lines += ["", f"Of these, inside a file's atomic write (write_file_atomically: a checkpoint, "
              f"a snapshot; the fsyncs on the loop): {len(files)}, held "
              f"{sum(held(files)):,.0f} ms."]
    lines += ["", f"Besides: {len(starved)} episodes >= {min_ms:g} ms of wall time that were "
              f"mostly waiting for a CPU ({sum(e['wait_ms'] for e in starved):,.0f} ms "
              "waiting in all).",
              "Collections >= 1 ms (any thread) by generation: " + (", ".join(
                  f"gen {g}: {len(ms)}, total {sum(ms):.0f} ms, max {max(ms):.1f} ms"
                  for g, ms in sorted(gcs.items())) or "none") + "."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rate", type=int, default=5000, help="records/s of 1 KiB")
    ap.add_argument("--linger", type=int, default=5, help="the producer's linger.ms")
    ap.add_argument("--seconds", type=float, default=15.0, help="produce time per row")
    ap.add_argument("--rounds", type=int, default=3, help="rows per cluster (taking turns)")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--min-ms", type=float, default=5.0, help="shortest stall counted")
    ap.add_argument("--baseline", metavar="REV", default=None,
                    help="also tidelog at git revision REV (its own cluster), in turn")
    ap.add_argument("--dir", default=str(ROOT / "bench-data" / "loop-stalls"),
                    help="the clusters' directory (wiped first)")
    args = ap.parse_args()
    if args.rate < 1 or args.rounds < 1 or args.seconds <= 0:
        ap.error("--rate, --rounds and --seconds must be positive")
    workdir = Path(args.dir).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    site = Path(tempfile.mkdtemp(prefix="loop-stalls-"))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    print(f"machine: {machine_description(str(ROOT))}", flush=True)
    clusters: list[Instrumented] = []
    try:
        if args.baseline:
            print(f"tidelog at {args.baseline}: exporting and building ...", flush=True)
            src = baseline_source(args.baseline, workdir / "baseline-source")
            clusters.append(start_instrumented(f"tidelog {args.baseline}", workdir / "baseline",
                                               site, src, args.min_ms))
        clusters.append(start_instrumented("tidelog (this tree)", workdir / "head", site, None,
                                           args.min_ms))
        for n in range(args.rounds):
            print(f"round {n + 1}: {args.rate:,} records/s, linger.ms={args.linger}", flush=True)
            for c in clusters:
                run_row(c, args.rate, args.linger, args.seconds, args.partitions)
        data = {c.name: collect(c) for c in clusters}
    finally:
        for c in clusters:
            c.cluster.down(timeout_s=20)
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)
    print()
    for c in clusters:
        p99s = [w.p99_ms for w in c.windows]
        print(f"{c.name}: p99 per round " + ", ".join(f"{p:.1f}" for p in p99s)
              + f" ms (median {statistics.median(p99s):.1f}), load "
              + ", ".join(f"{w.load:.1f}" for w in c.windows))
        print(stall_table(c, data[c.name], args.min_ms))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
