"""A partition move under an acks=all producer, throttled and not: the move's duration and the
producer's latency during it (issue 14: "moving data does not starve producers").

A local 4-broker tidelog cluster; a topic on [1, 2, 3] with `--history-mb` of records; a
producer sends `--rate` records/s (acks=all, 100 bytes, linger.ms=0) to the moving partition
for the whole move; the move [1, 2, 3] -> [2, 3, 4] through AlterPartitionReassignments (the
`tidelog reassign` tool), once unthrottled, once with `--throttle` bytes/s (back to [1, 2, 3]
in between, so both moves copy the same history). Appends a run to docs/benchmarks.md's
"## reassignment" section with --doc.

    .venv/bin/python bench/reassign.py --history-mb 20 --throttle 2000000 [--doc]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _doc import append_run  # noqa: E402
from _machine import machine_description  # noqa: E402

from tidelog.cluster.local import LocalCluster  # noqa: E402
from tidelog.testing.kafka_cluster import kafka_tool, wait_for_metadata  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
TOPIC = "bench-move"


def reassign(bs: str, d: Path, target: list[int], throttle: int | None) -> None:
    plan = d / f"plan-{'-'.join(map(str, target))}.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": TOPIC, "partition": 0, "replicas": target}]}))
    base = [sys.executable, "-m", "tidelog", "reassign"]
    args = ["--bootstrap-server", bs, "--reassignment-json-file", str(plan)]
    extra = ["--throttle", str(throttle)] if throttle is not None else []
    subprocess.run([*base, "execute", *args, *extra], check=True, capture_output=True,
                   timeout=120)
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        out = subprocess.run([*base, "verify", *args], check=True, capture_output=True,
                             text=True, timeout=120).stdout
        if "is completed" in out:
            return
        time.sleep(0.5)
    raise RuntimeError("the move did not complete in 30 minutes")


def move_under_load(bs: str, d: Path, target: list[int], throttle: int | None,
                    rate: int) -> tuple[float, list[float]]:
    """(seconds the move took, the producer's acks=all latencies in ms during it)."""
    latencies: list[float] = []
    stop = threading.Event()

    def produce() -> None:
        p = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 0})
        n = 0
        start = time.monotonic()
        while not stop.is_set() and n < rate * 1800:
            sent = time.monotonic()
            p.produce(TOPIC, b"x" * 100, partition=0, on_delivery=lambda e, m, s=sent: (
                latencies.append((time.monotonic() - s) * 1000) if e is None else None))
            p.poll(0)
            n += 1
            time.sleep(max(0.0, start + n / rate - time.monotonic()))
        p.flush(60)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    time.sleep(2)
    before = len(latencies)
    began = time.monotonic()
    if target:
        reassign(bs, d, target, throttle)
    else:
        time.sleep(15)  # the peer: the same producer with no move
    took = time.monotonic() - began
    during = latencies[before:]
    stop.set()
    t.join(120)
    return took, during


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--history-mb", type=int, default=20)
    ap.add_argument("--throttle", type=int, default=2_000_000, help="bytes/s")
    ap.add_argument("--rate", type=int, default=200, help="producer records/s during the move")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (peer, move, throttled move)")
    ap.add_argument("--doc", action="store_true", help="append the run to docs/benchmarks.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        cluster = LocalCluster(d / "cluster", die_with_parent=True)
        cluster.up(4, timeout_s=120)
        try:
            bs = cluster.bootstrap_servers
            wait_for_metadata([b.address for b in cluster.brokers.values()], 4,
                              time.monotonic() + 60)
            made = kafka_tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bs,
                              "--create", "--topic", TOPIC, "--replica-assignment", "1:2:3")
            if made.returncode:
                raise RuntimeError(made.stderr)
            p = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 20})
            chunk = os.urandom(10_000)
            for _ in range(args.history_mb * 100):
                p.produce(TOPIC, chunk, partition=0)
                p.poll(0)
            p.flush(300)
            rows = []
            for _ in range(args.rounds):
                for target, throttle in (([], None), ([2, 3, 4], None), ([1, 2, 3], None),
                                         ([2, 3, 4], args.throttle), ([1, 2, 3], None)):
                    took, lat = move_under_load(bs, d, target, throttle, args.rate)
                    if target == [1, 2, 3]:
                        continue  # only brings the history back to broker 1 for the next move
                    rows.append((target, throttle, took, lat))
        finally:
            cluster.down(timeout_s=30)
    lines = ["| throttle | took | acks=all p50 | p99 | max | records acked during the move |",
             "|---|---|---|---|---|---|"]
    for target, throttle, took, lat in rows:
        name = ("no move (peer)" if not target else "none" if throttle is None
                else f"{throttle / 1e6:g} MB/s")
        lines.append(f"| {name} | {took:.1f} s | {statistics.median(lat) if lat else 0:.1f} ms"
                     f" | {pct(lat, 0.99):.1f} ms | {max(lat, default=0):.1f} ms | {len(lat)} |")
    table = "\n".join(lines)
    print(table)
    if args.doc:
        intro = ("## reassignment\n\n`bench/reassign.py`: a partition with history moved "
                 "[1, 2, 3] -> [2, 3, 4] under an acks=all producer, unthrottled and throttled "
                 "(docs/reassignment.md).\n")
        block = (f"### run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
                 f"{machine_description()}; history {args.history_mb} MB, producer {args.rate} "
                 f"records/s of 100 bytes, linger.ms=0.\n\n{table}\n")
        append_run(DOC, "## reassignment", intro, block)


if __name__ == "__main__":
    main()
