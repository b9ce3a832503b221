"""First acks=all produce after a topic's creation and after a leader move (issue 12: a follower
joins a newly led partition only after its fetch held at the leader returns).

    .venv/bin/python bench/first_produce.py --rev HEAD --rev "HEAD without C1,C2" [--rounds 3]

Each `--rev` is tidelog at that git revision (`git archive`, its own ZooKeeper and 3 brokers,
bench/cluster.py's overrides), and Apache Kafka 3.9 (ZooKeeper mode, 3 brokers) runs as a peer in
the same run; rounds take turns over the targets and medians are reported. Every cluster keeps a
3-partition RF=3 background topic with a leader on each broker, so each follower has a fetch
held at each leader when a measurement starts (as in a cluster that carries other topics).

- **create**: from the CreateTopics call (6 partitions, RF=3, min.insync.replicas=2) until one
  acks=all record (linger.ms=0, sent as soon as the producer's metadata names every
  partition's leader, polled every 5 ms) is acknowledged on every partition; and from
  CreateTopics' answer until then.
- **leader move**: a broker is stopped (controlled shutdown) and started again, which leaves
  its preferred leaderships with the other brokers (auto.leader.rebalance.enable=false); the
  background topic's preferred leaders are elected untimed; then from the ElectLeaders call
  (PREFERRED) for the measured topic's partitions until one acks=all record to each moved
  partition (sent once the producer's metadata names the new leaders, polled every 5 ms) is
  acknowledged.

Not a timed test: the figures go to docs/benchmarks.md (section "## first produce").
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import confluent_kafka
from _baseline import baseline_source, tidelog_from
from _doc import append_run
from _machine import load_average, machine_description
from cluster import (
    KAFKA_HEAP_MB,
    KAFKA_JVM_OPTIONS,
    OVERRIDES,
    RF3_CONFIG,
    create_topic,
    prime_topic,
    start_tidelog,
)
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tidelog.cluster.local import LocalCluster
from tidelog.testing.kafka_cluster import KafkaCluster

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## first produce"
PARTITIONS = 6
BACKGROUND = "bench-background"


@dataclass
class Target:
    name: str
    bootstrap: str
    stop: Callable[[int], object]
    start: Callable[[int], object]
    create_s: list[float] = field(default_factory=list)
    after_create_s: list[float] = field(default_factory=list)
    move_s: list[float] = field(default_factory=list)
    # within after_create_s: until the producer's metadata named every leader
    metadata_s: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)


def producer(bootstrap: str) -> confluent_kafka.Producer:
    # Quick metadata refreshes and retries: the client's own back-offs are not what is measured.
    return confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "log_level": 0,
        "topic.metadata.refresh.fast.interval.ms": 10, "retry.backoff.ms": 10,
        "retry.backoff.max.ms": 50, "message.timeout.ms": 60_000,
    })


def acks_all(p: confluent_kafka.Producer, topic: str, partitions: list[int]) -> float:
    """One acks=all record to each partition; the monotonic time the last was acknowledged."""
    acked: list[float] = []
    failed: list[object] = []

    def done(err: object, _msg: object) -> None:
        (failed if err else acked).append(err or time.monotonic())

    for partition in partitions:
        p.produce(topic, b"first", partition=partition, on_delivery=done)
    if p.flush(60) or failed:
        raise RuntimeError(f"{topic}: {failed[:1] or 'not acknowledged within 60 s'}")
    return max(acked)  # type: ignore[type-var]


def await_leaders(p: confluent_kafka.Producer, topic: str,
                  ready: Callable[[dict[int, int]], bool], timeout_s: float = 60) -> None:
    """Poll the producer's metadata every 5 ms until ``ready({partition: leader})``: librdkafka
    left to itself may wait a second or more before it asks again for a topic it did not find
    (seen on both brokers), which is not what is measured."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = p.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is None and ready(
                {n: m.leader for n, m in md.partitions.items()}):
            return
        time.sleep(0.005)
    raise RuntimeError(f"{topic}: leaders not as expected after {timeout_s:g} s")


def measure_create(t: Target, topic: str) -> None:
    p = producer(t.bootstrap)
    p.list_topics(timeout=10)  # connected before the clock starts
    admin = AdminClient({"bootstrap.servers": t.bootstrap})
    start = time.monotonic()
    admin.create_topics([NewTopic(topic, PARTITIONS, 3, config=RF3_CONFIG)],
                        operation_timeout=30, request_timeout=60)[topic].result(timeout=90)
    created = time.monotonic()
    await_leaders(p, topic, lambda led: len(led) == PARTITIONS and min(led.values()) >= 0)
    t.metadata_s.append(time.monotonic() - created)
    last = acks_all(p, topic, list(range(PARTITIONS)))
    t.create_s.append(last - start)
    t.after_create_s.append(last - created)


def leaders(admin: AdminClient, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    md = admin.list_topics(topic, timeout=10).topics[topic]
    return {p: (m.leader, list(m.replicas), list(m.isrs)) for p, m in md.partitions.items()}


def wait_full_isr(admin: AdminClient, topics: list[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(len(isr) == len(replicas) and leader >= 0
               for topic in topics for leader, replicas, isr in leaders(admin, topic).values()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{topics}: ISR not full after {timeout_s:g} s")


def elect_preferred(admin: AdminClient, topic: str, partitions: list[int]) -> None:
    if partitions:
        tps = [TopicPartition(topic, p) for p in partitions]
        admin.elect_leaders(ElectionType.PREFERRED, tps).result(timeout=90)


def measure_move(t: Target, topic: str, broker: int) -> None:
    """``broker`` leaves and comes back (its preferred leaderships stay elsewhere); then the
    timed preferred election of ``topic``'s partitions it should lead."""
    admin = AdminClient({"bootstrap.servers": t.bootstrap})
    t.stop(broker)
    t.start(broker)
    wait_full_isr(admin, [BACKGROUND, topic])
    moving = [p for p, (leader, replicas, _) in leaders(admin, topic).items()
              if replicas[0] == broker and leader != broker]
    if not moving:
        raise RuntimeError(f"{t.name}: no leadership of {topic} left broker {broker}")
    elect_preferred(admin, BACKGROUND, [p for p, (leader, replicas, _) in
                                        leaders(admin, BACKGROUND).items()
                                        if replicas[0] != leader])
    time.sleep(1.0)  # the followers' fetches to the returned broker are held there
    p = producer(t.bootstrap)
    p.list_topics(topic, timeout=10)
    start = time.monotonic()
    elect_preferred(admin, topic, moving)
    await_leaders(p, topic, lambda led: all(led.get(n) == broker for n in moving))
    t.move_s.append(acks_all(p, topic, moving) - start)


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:,.0f} ms" if values else "-"


def spread_ms(values: list[float]) -> str:
    return ", ".join(f"{v * 1000:,.0f}" for v in values)


def table(targets: list[Target]) -> str:
    lines = ["| target | create -> every partition acked | CreateTopics answered -> acked | "
             "preferred election -> every moved partition acked |",
             "|---|---:|---:|---:|"]
    for t in targets:
        lines.append(f"| {t.name} | {median_ms(t.create_s)} ({spread_ms(t.create_s)}) | "
                     f"{median_ms(t.after_create_s)} ({spread_ms(t.after_create_s)}) | "
                     f"{median_ms(t.move_s)} ({spread_ms(t.move_s)}) |")
    lines.append("")
    lines.append("Medians of the rounds (each round's figure in ms in parentheses); load "
                 "average after each target's rounds: "
                 + "; ".join(f"{t.name} {', '.join(f'{x:.1f}' for x in t.loads)}"
                             for t in targets) + ".")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", action="append", default=[],
                    help="tidelog at this git revision ('REV without C1,C2' reverts those "
                         "commits' changes to src); repeatable")
    ap.add_argument("--no-kafka", action="store_true", help="skip Apache Kafka")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=str(ROOT / "bench-data" / "first-produce"))
    ap.add_argument("--no-write-doc", action="store_true")
    args = ap.parse_args()
    if not args.rev or args.rounds < 1:
        ap.error("at least one --rev and one round")
    workdir = Path(args.dir).resolve()
    machine = machine_description(str(ROOT))
    print(f"machine: {machine}", flush=True)
    clusters: list[tuple[LocalCluster, Path]] = []
    kafka: KafkaCluster | None = None
    targets: list[Target] = []
    try:
        for n, rev in enumerate(args.rev):
            base = workdir / f"tidelog-{n}"
            print(f"tidelog at {rev}: exporting, building, 3 brokers ...", flush=True)
            src = baseline_source(rev, base / "source")
            c = start_tidelog(base / "cluster", src)
            clusters.append((c, base))

            def start(b: int, c: LocalCluster = c, src: Path = src) -> None:
                with tidelog_from(src):  # a restarted broker runs the revision too
                    c.start_broker(b, timeout_s=120)

            targets.append(Target(f"tidelog {rev}", c.bootstrap_servers,
                                  lambda b, c=c: c.stop_broker(b), start))
        if not args.no_kafka:
            print("Apache Kafka 3.9: 3 brokers ...", flush=True)
            shutil.rmtree(workdir / "kafka", ignore_errors=True)
            kafka = KafkaCluster(workdir / "kafka", heap_mb=KAFKA_HEAP_MB,
                                 jvm_options=KAFKA_JVM_OPTIONS).up(3, OVERRIDES)
            k = kafka
            targets.append(Target("Apache Kafka 3.9.1", k.bootstrap_servers, k.stop_broker,
                                  k.start_broker))
        for t in targets:
            create_topic(t.bootstrap, BACKGROUND, 3, 3, RF3_CONFIG)
            prime_topic(t.bootstrap, BACKGROUND, 3)
        for r in range(args.rounds):
            for t in targets:
                topic = f"bench-first-{uuid.uuid4().hex[:6]}"
                measure_create(t, topic)
                measure_move(t, topic, 1 + r % 3)
                t.loads.append(float(load_average().split()[0].rstrip(",")))
                print(f"  round {r + 1}, {t.name}: create {t.create_s[-1] * 1000:,.0f} ms "
                      f"(after the answer {t.after_create_s[-1] * 1000:,.0f} ms, of which metadata "
                      f"{t.metadata_s[-1] * 1000:,.0f} ms), move "
                      f"{t.move_s[-1] * 1000:,.0f} ms; load {t.loads[-1]:.1f}", flush=True)
    finally:
        for c, base in clusters:
            c.down(timeout_s=20)
            shutil.rmtree(base, ignore_errors=True)
        if kafka is not None:
            kafka.down(timeout_s=30)
            shutil.rmtree(workdir / "kafka", ignore_errors=True)
    body = table(targets)
    print()
    print(body)
    if not args.no_write_doc:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        command = "python bench/first_produce.py " + " ".join(sys.argv[1:])
        intro = (f"{SECTION}\n\n`bench/first_produce.py` (issue 12): how long a new topic's "
                 "and a moved leadership's first acks=all produce waits for the followers to "
                 "join (see the script's docstring for what each column times).\n")
        append_run(DOC, SECTION, intro,
                   f"### run {stamp}\n\nMachine: {machine}.\nCommand: `{command}`\n\n"
                   f"{body}\n")
        print(f"\nappended to {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
