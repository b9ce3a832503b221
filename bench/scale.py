"""Scale benchmark (issue 12 item 6, the idle part): a 3-broker tidelog cluster with many
partitions at RF=3, idle.

    .venv/bin/python bench/scale.py [--partitions 1000 5000] [--idle-seconds 20] [--no-write-doc]

For each partition count, on a fresh cluster (private ZooKeeper, 3 broker processes on
127.0.0.1): create one topic with that many partitions at RF=3 (time until every partition has
a leader), wait for full ISR (every partition's ISR has 3 replicas, bounded by --isr-timeout),
then, with no client traffic, read each broker's CPU time (/proc/<pid>/stat utime+stime) over
an --idle-seconds window: the idle CPU per broker as a share of one core, and its RSS. The
brokers' replica fetchers keep fetching the whole time (fetch sessions make these fetches
incremental). The machine's load average is recorded with each row: the figure is only as
quiet as the machine.

Goal (issue 12 item 2): idle CPU <= 2% of a core per broker at 5,000 partitions, <= 3% at 10,000.
Appends a table to docs/benchmarks.md (section "## scale").
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from _baseline import baseline_source, tidelog_from
from _doc import append_run
from _machine import cpu_seconds, load_average, machine_description
from confluent_kafka.admin import AdminClient, NewTopic

from tidelog.cluster.local import LocalCluster

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## scale"
TOPIC = "scale"
OVERRIDES = {"auto.leader.rebalance.enable": "false"}


@dataclass
class Row:
    source: str  # "working tree", or the --baseline spec the brokers ran
    partitions: int
    create_s: float
    full_isr_s: float | None
    idle_cpu_pct: list[float]  # per broker, % of one core
    rss_mib: list[float]
    load_before: str
    load_after: str


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def create(admin: AdminClient, partitions: int, timeout_s: float) -> float:
    t0 = time.monotonic()
    futures = admin.create_topics([NewTopic(TOPIC, partitions, 3)], operation_timeout=60,
                                  request_timeout=120)
    futures[TOPIC].result(timeout=timeout_s)
    while True:
        md = admin.list_topics(TOPIC, timeout=30).topics.get(TOPIC)
        if md is not None and md.error is None and len(md.partitions) == partitions and all(
                pm.leader >= 0 for pm in md.partitions.values()):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"partitions without a leader after {timeout_s:.0f} s")
        time.sleep(0.5)


def wait_full_isr(admin: AdminClient, partitions: int, timeout_s: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        md = admin.list_topics(TOPIC, timeout=30).topics.get(TOPIC)
        if md is not None and len(md.partitions) == partitions and all(
                len(pm.isrs) == 3 for pm in md.partitions.values()):
            return time.monotonic() - t0
        time.sleep(1.0)
    return None


def measure(partitions: int, args: argparse.Namespace, source: str = "working tree",
            src: Path | None = None) -> Row:
    workdir = Path(tempfile.mkdtemp(prefix=f"tidelog-scale-{partitions}-"))
    cluster = LocalCluster(workdir)
    try:
        print(f"{partitions} partitions, {source}: starting 3 brokers in {workdir} ...",
              flush=True)
        with tidelog_from(src):
            cluster.up(3, OVERRIDES, timeout_s=120)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        create_s = create(admin, partitions, args.isr_timeout)
        print(f"  created in {create_s:.1f} s", flush=True)
        full_isr_s = wait_full_isr(admin, partitions, args.isr_timeout)
        print(f"  full ISR after {full_isr_s} s", flush=True)
        time.sleep(args.settle_seconds)  # let the first fetch rounds and checkpoints pass
        pids = [b.pid for b in cluster.brokers.values() if b.pid]
        load_before = load_average()
        before = {pid: cpu_seconds(pid) for pid in pids}
        t0 = time.monotonic()
        time.sleep(args.idle_seconds)
        elapsed = time.monotonic() - t0
        used = [cpu_seconds(pid) - before[pid] for pid in pids]
        md = admin.list_topics(TOPIC, timeout=30).topics[TOPIC]
        shrunk = sum(1 for pm in md.partitions.values() if len(pm.isrs) < 3)
        if shrunk:  # idle followers must stay in the ISR: a cheap idle that drops them is no win
            print(f"  WARNING: {shrunk} partitions left full ISR during the idle window", flush=True)
        row = Row(source, partitions, create_s, full_isr_s,
                  [100 * u / elapsed for u in used], [rss_mib(pid) for pid in pids],
                  load_before, load_average())
        print(f"  idle CPU per broker: {', '.join(f'{c:.2f}%' for c in row.idle_cpu_pct)}; "
              f"RSS {', '.join(f'{r:.0f}' for r in row.rss_mib)} MiB; load {row.load_before}"
              f" -> {row.load_after}", flush=True)
        return row
    finally:
        cluster.down(timeout_s=60)
        shutil.rmtree(workdir, ignore_errors=True)


def table(rows: list[Row]) -> str:
    lines = ["| tidelog | partitions (RF=3) | create | full ISR | idle CPU per broker (% of a "
             "core) | median | RSS per broker | load avg before -> after |",
             "|---|---:|---:|---:|---|---:|---|---|"]
    for r in rows:
        isr = "not reached" if r.full_isr_s is None else f"{r.full_isr_s:.1f} s"
        lines.append(
            f"| {r.source} | {r.partitions:,} | {r.create_s:.1f} s | {isr} | "
            f"{', '.join(f'{c:.2f}' for c in r.idle_cpu_pct)} | "
            f"{statistics.median(r.idle_cpu_pct):.2f}% | "
            f"{', '.join(f'{m:.0f}' for m in r.rss_mib)} MiB | {r.load_before} -> {r.load_after} |")
    return "\n".join(lines)


def write_doc(command: str, machine: str, body: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = f"### run {stamp}\n\nMachine: {machine}.\nCommand: `{command}`\n\n{body}\n"
    intro = (f"{SECTION}\n\n`bench/scale.py`. A fresh 3-broker cluster per row, one topic at "
             "RF=3; after full ISR and a settling pause, each broker's CPU time "
             "(/proc/<pid>/stat utime+stime) over an idle window with no client traffic, "
             "as a share of one core. Goal (issue 12 item 2): <= 2% per broker at 5,000 "
             "partitions, <= 3% at 10,000.\n")
    append_run(DOC, SECTION, intro, block)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--partitions", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--idle-seconds", type=float, default=20.0)
    ap.add_argument("--settle-seconds", type=float, default=5.0)
    ap.add_argument("--isr-timeout", type=float, default=600.0,
                    help="bound on topic creation and on reaching full ISR, each")
    ap.add_argument("--baseline", metavar="REV", action="append", default=[],
                    help="also measure tidelog at git revision REV ('REV without C1,C2': with "
                         "those commits' changes to src reverted), after the working tree at "
                         "each partition count: before/after in the same run")
    ap.add_argument("--no-write-doc", action="store_true")
    args = ap.parse_args()
    machine = machine_description()
    sources: list[tuple[str, Path | None]] = [("working tree", None)]
    with tempfile.TemporaryDirectory(prefix="tidelog-scale-src-") as tmp:
        for n, spec in enumerate(args.baseline):
            print(f"tidelog at {spec}: exporting and building ...", flush=True)
            sources.append((spec, baseline_source(spec, Path(tmp) / str(n))))
        rows = [measure(n, args, label, src) for n in args.partitions for label, src in sources]
    body = table(rows)
    print("\n" + body)
    if not args.no_write_doc:
        write_doc("python bench/scale.py " + " ".join(sys.argv[1:]), machine, body)
        print(f"\nappended to {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
