"""The CPU one acks=all record costs on the replication path, without queueing (issue 12 item 1).

    .venv/bin/python bench/replication_cost.py [--records 2000] [--rounds 3] [--baseline REV]

bench/cluster.py's fixed-rate rows at linger.ms=0 mix two things: what a record costs and how
the brokers, the producer and the rest of a 2-core machine queue for the CPUs (which also
batches records, so the CPU per record falls as the load rises). Here the producer keeps one
record in flight (produce, flush, next: linger.ms=0, acks=all, 1 KiB, keyless, partitions in
turn) against a 3-broker tidelog cluster, so every record is its own produce request and its
own replication round trip, and nothing overlaps. Per record, in rounds alternating RF=3
(min.insync.replicas=2) and RF=1 topics of 6 partitions on the same brokers:

- the brokers' CPU (user + system of the 3 broker processes, /proc/<pid>/stat) and the share
  of it in the kernel;
- the broker processes' context switches (/proc/<pid>/task/*/status): their wake-ups;
- the producer process's CPU (getrusage: confluent-kafka's threads and this loop);
- latency p50 / p99 (produce to delivery report).

Then the floor: the cores that one produce request per record at each of ``--rates`` needs,
(brokers' + producer's CPU per record) x rate, against this machine's cores. With
``--baseline REV`` tidelog at REV (``git archive``, its own brokers and ZooKeeper) takes its
turn in every round: a before/after of a change to the per-record path that the fixed-rate
rows' noise hides. Prints the table; nothing is written to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import confluent_kafka
from _baseline import baseline_source
from _machine import cpu_seconds, cpu_ticks, load_average, machine_description, thread_files
from cluster import (
    RF3_CONFIG,
    STAMP,
    broker_pids,
    create_topic,
    delete_topic,
    payload,
    prime_topic,
    producer_config,
    start_tidelog,
)

from tidelog.cluster.local import LocalCluster

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 6
SIZE = 1024
WARMUP_RECORDS = 200


@dataclass
class Round:
    brokers_us: float  # brokers' CPU per record
    kernel_share: float  # of the brokers' CPU
    switches: float  # broker context switches per record
    producer_us: float
    p50_ms: float
    p99_ms: float
    records_s: float
    load: float


@dataclass
class Target:
    name: str
    cluster: LocalCluster
    rf: int
    rounds: list[Round] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return list(broker_pids(self.cluster).values())


def _context_switches(pids: list[int]) -> int:
    return sum(int(line.split()[1]) for status in thread_files(pids, "status")
               for line in status.splitlines()
               if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")))


def _producer_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_round(target: Target, records: int) -> Round:
    """``records`` acks=all records one at a time to a new primed topic of ``target``."""
    bootstrap = target.cluster.bootstrap_servers
    topic = f"cost-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, PARTITIONS, target.rf,
                 RF3_CONFIG if target.rf == 3 else None)
    prime_topic(bootstrap, topic, PARTITIONS)
    producer = confluent_kafka.Producer(producer_config(bootstrap, **{"linger.ms": 0}))
    pad = payload(SIZE)
    perf = time.perf_counter_ns
    failed: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    def send(n: int) -> list[int]:
        latencies = []
        for i in range(n):
            start = perf()
            producer.produce(topic, STAMP.pack(start) + pad, partition=i % PARTITIONS,
                             on_delivery=on_delivery)
            producer.flush(30)
            latencies.append(perf() - start)
        return latencies

    send(WARMUP_RECORDS)  # connections, metadata, the followers' sessions
    pids = target.pids
    ticks0, switches0, cpu0 = cpu_ticks(*pids), _context_switches(pids), cpu_seconds(*pids)
    producer0, wall0 = _producer_cpu_s(), time.monotonic()
    latencies = sorted(send(records))
    wall = time.monotonic() - wall0
    producer_s = _producer_cpu_s() - producer0
    used = cpu_seconds(*pids) - cpu0
    ticks1, switches = cpu_ticks(*pids), _context_switches(pids) - switches0
    delete_topic(bootstrap, topic)
    if failed:
        raise RuntimeError(f"{target.name}: {len(failed)} records failed: {failed[0]}")
    user, system = ticks1[0] - ticks0[0], ticks1[1] - ticks0[1]
    return Round(
        brokers_us=used * 1e6 / records, kernel_share=system / max(1, user + system),
        switches=switches / records, producer_us=producer_s * 1e6 / records,
        p50_ms=latencies[len(latencies) // 2] / 1e6,
        p99_ms=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] / 1e6,
        records_s=records / wall, load=os.getloadavg()[0])


def table(targets: list[Target], rates: list[int], cores: int) -> str:
    def med(t: Target, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in t.rounds)

    lines = [
        "| target | brokers' CPU per record µs | per round | in the kernel | broker context "
        "switches per record | producer CPU per record µs | p50 ms | p99 ms | records/s | "
        "load per round | "
        + " | ".join(f"cores for {rate:,}/s" for rate in rates) + " |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|" + "---:|" * len(rates),
    ]
    for t in targets:
        per_record_s = (med(t, "brokers_us") + med(t, "producer_us")) / 1e6
        lines.append(
            f"| {t.name} | {med(t, 'brokers_us'):,.0f} | "
            + ", ".join(f"{r.brokers_us:,.0f}" for r in t.rounds)
            + f" | {med(t, 'kernel_share'):.0%} | {med(t, 'switches'):.1f} | "
            f"{med(t, 'producer_us'):,.0f} | {med(t, 'p50_ms'):.2f} | {med(t, 'p99_ms'):.2f} | "
            f"{med(t, 'records_s'):,.0f} | " + ", ".join(f"{r.load:.1f}" for r in t.rounds)
            + " | " + " | ".join(f"{per_record_s * rate:.1f} of {cores}" for rate in rates)
            + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--records", type=int, default=2000, help="timed records per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (medians are reported)")
    ap.add_argument("--rates", type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                    default="1000,5000,10000",
                    help="records/s for the cores-needed columns (one request per record)")
    ap.add_argument("--baseline", metavar="REV", default=None,
                    help="also measure tidelog at git revision REV (RF=3, its own cluster; "
                         "'REV without C1,C2' as in bench/cluster.py)")
    ap.add_argument("--dir", default=str(ROOT / "bench-data" / "replication-cost"),
                    help="the clusters' directory (wiped first)")
    args = ap.parse_args()
    if args.records < 1 or args.rounds < 1:
        ap.error("--records and --rounds must be >= 1")
    workdir = Path(args.dir).resolve()
    print(f"machine: {machine_description(str(ROOT))}", flush=True)
    clusters: list[LocalCluster] = []
    targets: list[Target] = []
    try:
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"tidelog: ZooKeeper and 3 brokers in {workdir / 'cluster'} ...", flush=True)
        cluster = start_tidelog(workdir / "cluster")
        clusters.append(cluster)
        if args.baseline:
            print(f"tidelog at {args.baseline}: exporting, building, 3 brokers ...", flush=True)
            src = baseline_source(args.baseline, workdir / "baseline-source")
            base = start_tidelog(workdir / "baseline", src)
            clusters.append(base)
            targets.append(Target(f"tidelog {args.baseline} RF=3", base, 3))
        targets += [Target("tidelog RF=3", cluster, 3), Target("tidelog RF=1", cluster, 1)]
        for n in range(args.rounds):
            for t in targets:
                r = one_round(t, args.records)
                t.rounds.append(r)
                print(f"  round {n + 1}: {t.name}: brokers {r.brokers_us:,.0f} µs per record "
                      f"({r.kernel_share:.0%} kernel, {r.switches:.1f} context switches), "
                      f"producer {r.producer_us:,.0f} µs; p50 {r.p50_ms:.2f} ms, p99 "
                      f"{r.p99_ms:.2f} ms; {r.records_s:,.0f} records/s (load {r.load:.1f})",
                      flush=True)
    finally:
        for c in clusters:
            c.down(timeout_s=20)
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(table(targets, args.rates, os.cpu_count() or 1))
    print(f"\nLoad average at the end: {load_average()}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
