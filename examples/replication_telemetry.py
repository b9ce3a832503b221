"""Replication telemetry: ISR flapping under a bursty producer, legacy vs time-based ISR rule.

    python examples/replication_telemetry.py                     # both policies, ~3 minutes
    python examples/replication_telemetry.py --duration 20 --no-docs

For each policy (seed 003):

- ``legacy``: ``replica.lag.max.messages=N`` (pre-0.9 Kafka: a follower more than N messages
  behind the leader's LEO leaves the ISR) plus ``replica.lag.time.max.ms``;
- ``time``: ``replica.lag.time.max.ms`` only (Kafka >= 0.9: out of the ISR only when not caught
  up to the leader's LEO for that long),

a fresh 3-broker tidelog cluster starts with ``tidelog.replication.events.enable=true`` (and
``replica.fetch.min.bytes=--fetch-min-bytes`` in both runs), a bursty producer (bursts of
``--burst`` records at ``--burst-rate`` records/s with acks=1, then ``--pause`` seconds idle)
writes to a 3-partition topic (replication factor 3) for ``--duration`` seconds, and a Spark batch
job reads ``__replication_events`` with the ``tidelog`` connector and reports per partition: ISR
shrinks and expands (and per hour), time under-replicated (ISR smaller than the replicas) and
leader elections. The table is printed; unless ``--no-docs``, ``docs/telemetry.md`` (both runs
side by side) and ``docs/telemetry-isr.png`` (ISR size over time per policy) are written.
The clusters run in a temporary directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from tidelog.broker.replication_events import EVENTS_TOPIC  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DATA_TOPIC = "bursty"
REPORT_COLUMNS = ("topic", "partition", "replicas", "isr_shrinks", "isr_expands",
                  "shrinks_per_hour", "expands_per_hour", "under_replicated_ms", "elections",
                  "hw_checkpoints")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def policy_overrides(policy: str, lag_max_messages: int, lag_time_max_ms: int,
                     fetch_min_bytes: int = 1) -> dict[str, str]:
    """Broker settings of one run (events on; the ISR rule under test)."""
    out = {
        "tidelog.replication.events.enable": "true",
        "replica.lag.time.max.ms": str(lag_time_max_ms),
        "replica.high.watermark.checkpoint.interval.ms": "2000",
        "replica.fetch.wait.max.ms": "500",
        "replica.fetch.min.bytes": str(fetch_min_bytes),
    }
    if policy == "legacy":
        out["replica.lag.max.messages"] = str(lag_max_messages)
    elif policy != "time":
        raise ValueError(f"unknown policy {policy!r} (legacy or time)")
    return out


# ------------------------------------------------------------------------------ producing
async def create_topic(bootstrap: str, topic: str, partitions: int, replication_factor: int,
                       timeout_s: float = 30.0) -> None:
    """Create ``topic`` and wait (bounded) until every partition has a leader."""
    from tidelog.client.cluster import KafkaClient, NewTopic

    async with KafkaClient(bootstrap, client_id="telemetry-admin") as client:
        errors = await client.create_topics([NewTopic(topic, partitions, replication_factor)])
        if errors.get(topic) is not None:
            raise errors[topic]  # type: ignore[misc]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            meta = await client.refresh_metadata([topic])
            t = meta.topics.get(topic)
            if t is not None and len(t.partitions) == partitions and all(
                    p.leader >= 0 for p in t.partitions.values()):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{topic} has no leaders after {timeout_s} s")


async def bursty_produce(bootstrap: str, topic: str, *, duration_s: float, burst: int,
                         pause_s: float, burst_rate: float = 0.0, value_bytes: int = 100
                         ) -> tuple[int, int]:
    """Bursts of ``burst`` records (acks=1) at ``burst_rate`` records/s (0: as fast as they
    go), each followed by ``pause_s`` idle, until ``duration_s`` is over. Returns (records
    acknowledged, bursts).

    Unpaced, the producer packs a burst into a few large requests that the followers copy in
    one fetch each, so a follower is behind for only milliseconds; paced, the burst is a
    sustained high rate for ``burst / burst_rate`` seconds, during which every follower is
    always a fetch round trip's worth of records behind (rate x round trip), as under the
    traffic peaks seed 003 describes."""
    from tidelog.client.cluster import KafkaClient
    from tidelog.client.producer import Producer

    value = b"x" * value_bytes
    acked = bursts = 0
    end = time.monotonic() + duration_s
    step = max(1, int(burst_rate / 100)) if burst_rate > 0 else burst  # ~10 ms ticks
    async with KafkaClient(bootstrap, client_id="telemetry-bursty") as client:
        producer = Producer(client, acks=1, enable_idempotence=False, linger_ms=2,
                            batch_size=16 * 1024, delivery_timeout_ms=30_000)
        await producer.start()
        try:
            while time.monotonic() < end:
                started = time.monotonic()
                futures = []
                for i in range(burst):
                    if i % step == 0 and burst_rate > 0:
                        await asyncio.sleep(max(0.0, started + i / burst_rate - time.monotonic()))
                    futures.append(await producer.send(topic, value))
                await producer.flush()
                acked += sum(1 for f in futures if f.done() and f.exception() is None)
                bursts += 1
                await asyncio.sleep(max(0.0, min(pause_s, end - time.monotonic())))
        finally:
            await producer.close(timeout_s=10)
    return acked, bursts


# ------------------------------------------------------------------------------ Spark job
def load_events(spark: Any, bootstrap: str, topic: str = EVENTS_TOPIC,
                ending_offset: int | None = None) -> Any:
    """``topic`` (batch: from the beginning up to ``ending_offset``, by default the latest)
    through the ``tidelog`` connector, JSON parsed: one row per event with the event's fields
    plus the record's ``offset``."""
    import json

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("type", T.StringType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("broker", T.IntegerType()),
        T.StructField("leader_epoch", T.IntegerType()),
        T.StructField("old_isr", T.ArrayType(T.IntegerType())),
        T.StructField("new_isr", T.ArrayType(T.IntegerType())),
        T.StructField("leo", T.LongType()),
        T.StructField("hw", T.LongType()),
        T.StructField("time_ms", T.LongType()),
    ])
    raw = (spark.read.format("tidelog")
           .option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic)
           .option("startingOffsets", "earliest")
           .option("endingOffsets", "latest" if ending_offset is None
                   else json.dumps({topic: {"0": ending_offset}}))
           .load())
    return (raw.select(F.col("offset"),
                       F.from_json(F.col("value").cast("string"), schema).alias("e"))
            .select("offset", "e.*"))


def isr_timeline(events: Any) -> Any:
    """The ISR-bearing events (elections, shrinks, expands) with ``isr_size``: the ISR of the
    partition from ``time_ms`` until the next one. HW checkpoints are left out: a follower's
    view of the ISR is not maintained."""
    from pyspark.sql import functions as F

    return (events.where(F.col("type").isin("leader_election", "isr_shrink", "isr_expand"))
            .select("topic", "partition", "time_ms", "offset", "type",
                    F.size("new_isr").alias("isr_size"), F.size("old_isr").alias("old_size")))


def telemetry_report(events: Any, *, start_ms: int | None = None, end_ms: int | None = None,
                     replicas: int | None = None) -> Any:
    """Per (topic, partition): ISR shrinks/expands (total and per hour of the observed window
    ``start_ms``..``end_ms``, by default the first..last event), time under-replicated (the sum
    of the intervals whose ISR is smaller than ``replicas``; by default the largest ISR seen for
    the partition; the last interval runs to ``end_ms``), elections and HW checkpoints."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    bounds = events.agg(F.min("time_ms").alias("lo"), F.max("time_ms").alias("hi")).first()
    lo = start_ms if start_ms is not None else (bounds["lo"] or 0)
    hi = end_ms if end_ms is not None else (bounds["hi"] or lo)
    hours = max(hi - lo, 1) / 3_600_000
    timeline = isr_timeline(events)
    by_tp = Window.partitionBy("topic", "partition")
    ordered = by_tp.orderBy("time_ms", "offset")
    timeline = (timeline
                .withColumn("replicas", F.lit(replicas) if replicas is not None else
                            F.max(F.greatest("isr_size", "old_size")).over(by_tp))
                .withColumn("until", F.greatest(
                    F.coalesce(F.lead("time_ms").over(ordered), F.lit(hi)), F.col("time_ms")))
                .withColumn("under_ms", F.when(F.col("isr_size") < F.col("replicas"),
                                               F.col("until") - F.col("time_ms")).otherwise(0)))
    isr = timeline.groupBy("topic", "partition").agg(
        F.first("replicas").alias("replicas"),
        F.sum(F.when(F.col("type") == "isr_shrink", 1).otherwise(0)).alias("isr_shrinks"),
        F.sum(F.when(F.col("type") == "isr_expand", 1).otherwise(0)).alias("isr_expands"),
        F.sum(F.when(F.col("type") == "leader_election", 1).otherwise(0)).alias("elections"),
        F.sum("under_ms").alias("under_replicated_ms"),
    )
    checkpoints = (events.where(F.col("type") == "hw_checkpoint")
                   .groupBy("topic", "partition").agg(F.count("*").alias("hw_checkpoints")))
    return (isr.join(checkpoints, ["topic", "partition"], "full_outer")
            .na.fill(0, ["isr_shrinks", "isr_expands", "elections", "under_replicated_ms",
                         "hw_checkpoints"])
            .withColumn("shrinks_per_hour", F.round(F.col("isr_shrinks") / F.lit(hours), 1))
            .withColumn("expands_per_hour", F.round(F.col("isr_expands") / F.lit(hours), 1))
            .select(*REPORT_COLUMNS)
            .orderBy("topic", "partition"))


# ------------------------------------------------------------------------------ one run
@dataclass
class PolicyRun:
    policy: str
    overrides: dict[str, str]
    start_ms: int = 0
    end_ms: int = 0
    produced: int = 0
    bursts: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # data topic's ISR changes
    events: int = 0


def run_policy(spark: Any, policy: str, workdir: Path, args: argparse.Namespace) -> PolicyRun:
    from tidelog.cluster.local import LocalCluster

    run = PolicyRun(policy, policy_overrides(policy, args.lag_max_messages, args.lag_time_ms,
                                             args.fetch_min_bytes))
    cluster = LocalCluster(workdir / f"cluster-{policy}")
    log(f"[{policy}] starting 3 brokers: {run.overrides}")
    cluster.up(3, overrides=run.overrides, timeout_s=120)
    try:
        bootstrap = cluster.bootstrap_servers
        run.start_ms = int(time.time() * 1000)
        asyncio.run(create_topic(bootstrap, DATA_TOPIC, args.partitions, 3))
        log(f"[{policy}] bursty producer: {args.burst} records per burst at {args.burst_rate}/s, "
            f"{args.pause} s pauses, "
            f"{args.duration} s")
        run.produced, run.bursts = asyncio.run(bursty_produce(
            bootstrap, DATA_TOPIC, duration_s=args.duration, burst=args.burst,
            pause_s=args.pause, burst_rate=args.burst_rate))
        time.sleep(args.settle)  # followers catch up; last expands and HW checkpoint land
        run.end_ms = int(time.time() * 1000)
        log(f"[{policy}] {run.produced} records in {run.bursts} bursts; Spark job over "
            f"{EVENTS_TOPIC}")
        events = load_events(spark, bootstrap).cache()
        run.events = events.count()
        report = telemetry_report(events, start_ms=run.start_ms, end_ms=run.end_ms)
        run.rows = [r.asDict() for r in report.collect()]
        run.timeline = [r.asDict() for r in isr_timeline(events)
                        .where(f"topic = '{DATA_TOPIC}'").orderBy("time_ms", "offset").collect()]
        events.unpersist()
    finally:
        cluster.down()
    return run


# ------------------------------------------------------------------------------ output
def format_table(rows: Sequence[dict[str, Any]]) -> str:
    header = "| " + " | ".join(REPORT_COLUMNS) + " |"
    lines = [header, "|" + "---|" * len(REPORT_COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[c]) for c in REPORT_COLUMNS) + " |")
    return "\n".join(lines)


def totals(run: PolicyRun, topic: str = DATA_TOPIC) -> dict[str, Any]:
    rows = [r for r in run.rows if r["topic"] == topic]
    return {k: sum(r[k] for r in rows) for k in
            ("isr_shrinks", "isr_expands", "under_replicated_ms", "elections")}


def plot(runs: Sequence[PolicyRun], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.2 * len(runs)), sharey=True,
                             squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        end_s = (run.end_ms - run.start_ms) / 1000
        for p in sorted({e["partition"] for e in run.timeline}):
            pts = [e for e in run.timeline if e["partition"] == p]
            xs = [(e["time_ms"] - run.start_ms) / 1000 for e in pts] + [end_s]
            ys = [e["isr_size"] for e in pts] + [pts[-1]["isr_size"]]
            ax.step(xs, [y + 0.04 * p for y in ys], where="post", label=f"partition {p}")
        t = totals(run)
        ax.set_title(f"{run.policy}: {t['isr_shrinks']} shrinks, {t['isr_expands']} expands, "
                     f"{t['under_replicated_ms'] / 1000:.1f} s under-replicated "
                     f"({', '.join(f'{k}={v}' for k, v in run.overrides.items() if 'lag' in k)})",
                     fontsize=9)
        ax.set_ylabel("ISR size")
        ax.set_yticks([1, 2, 3])
        ax.set_ylim(0.5, 3.5)
        ax.set_xlim(0, end_s)
        ax.legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the topic was created")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_docs(runs: Sequence[PolicyRun], args: argparse.Namespace, docs: Path,
               png_name: str = "telemetry-isr.png") -> Path:
    import platform

    by = {r.policy: r for r in runs}
    lines = [
        "# Replication telemetry: ISR flapping, legacy vs time-based ISR rule",
        "",
        "Written by `python examples/replication_telemetry.py` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores, "
        f"Python {platform.python_version()}). Brokers publish their ISR changes, elections and "
        "HW checkpoints to `__replication_events` when `tidelog.replication.events.enable=true` "
        "(a tidelog extension, default false; see `tidelog.broker.replication_events`); a Spark "
        "batch job reads that topic with the `tidelog` connector (`telemetry_report` in the "
        "example).",
        "",
        f"Each run: a fresh 3-broker cluster, topic `{DATA_TOPIC}` ({args.partitions} partitions, "
        f"replication factor 3), a producer sending bursts of {args.burst} records (100 bytes, "
        f"acks=1) at {args.burst_rate:.0f} records/s (0: unpaced), then idle {args.pause} s, "
        f"for {args.duration} s; then "
        f"{args.settle} s to settle. Both runs use `replica.lag.time.max.ms={args.lag_time_ms}` "
        f"(so `isr-expiration` checks every {args.lag_time_ms // 2} ms) and "
        f"`replica.fetch.min.bytes={args.fetch_min_bytes}` with `replica.fetch.wait.max.ms=500` "
        "(a follower's fetch returns once that much is new: a fetch cycle of tens of ms during "
        "a burst, where a localhost round trip is ~1 ms); the legacy run adds "
        f"`replica.lag.max.messages={args.lag_max_messages}`.",
        "",
        f"## Totals over the `{DATA_TOPIC}` partitions",
        "",
        "| | " + " | ".join(r.policy for r in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for label, fn in (
        ("records produced (bursts)", lambda r: f"{r.produced} ({r.bursts})"),
        ("observed window (s)", lambda r: f"{(r.end_ms - r.start_ms) / 1000:.1f}"),
        ("ISR shrinks", lambda r: totals(r)["isr_shrinks"]),
        ("ISR expands", lambda r: totals(r)["isr_expands"]),
        ("shrinks per hour (per partition, mean)",
         lambda r: f"{_mean(r, 'shrinks_per_hour'):.0f}"),
        ("time under-replicated (s, summed over partitions)",
         lambda r: f"{totals(r)['under_replicated_ms'] / 1000:.1f}"),
        ("leader elections", lambda r: totals(r)["elections"]),
        ("events in `__replication_events`", lambda r: r.events),
    ):
        lines.append(f"| {label} | " + " | ".join(str(fn(r)) for r in runs) + " |")
    for run in runs:
        lines += ["", f"## Per partition: {run.policy} "
                  f"(`{'`, `'.join(f'{k}={v}' for k, v in run.overrides.items())}`)", "",
                  format_table(run.rows)]
    lines += ["", f"![ISR size over time per policy]({png_name})", "", "## Reading", ""]
    legacy, timed = by.get("legacy"), by.get("time")
    if legacy is not None and timed is not None:
        lt, tt = totals(legacy), totals(timed)
        if lt["isr_shrinks"] > 0 and tt["isr_shrinks"] == 0:
            verdict = (f"The legacy rule flapped: {lt['isr_shrinks']} shrinks and "
                       f"{lt['isr_expands']} expands on {args.partitions} partitions, "
                       f"{lt['under_replicated_ms'] / 1000:.1f} s under-replicated in total; the "
                       "time rule shrank nothing.")
        elif lt["isr_shrinks"] > tt["isr_shrinks"]:
            verdict = (f"The legacy rule flapped ({lt['isr_shrinks']} shrinks) and the time rule "
                       f"much less ({tt['isr_shrinks']} shrinks; see the table for which "
                       "partitions: a burst longer than the lag time also trips the time rule).")
        else:
            verdict = (f"The legacy rule did not flap more than the time rule here "
                       f"({lt['isr_shrinks']} vs {tt['isr_shrinks']} shrinks): the bursts did not "
                       "leave a follower more than replica.lag.max.messages behind at an "
                       "isr-expiration check.")
        lines += [verdict, ""]
    lines += [
        "Why (seed 003): before Kafka 0.9 a follower left the ISR when it was more than "
        "`replica.lag.max.messages` behind the leader's LEO. A burst of a few thousand records "
        "puts every follower thousands of messages behind for as long as the burst takes to "
        "replicate, however healthy the follower is, so any `isr-expiration` check that falls "
        "inside a burst shrinks the ISR; the follower catches up within a fetch or two after "
        "the burst and is added back: a shrink/expand pair per caught burst, the ISR flapping "
        "with the traffic pattern. The number that would be safe depends on the producer's "
        "burst size, which the operator can only guess, and it is one global setting for "
        "topics with very different rates. Kafka 0.9 removed it, leaving one rule: "
        "a follower is out of sync only when it has not been caught up to the leader's LEO "
        "within `replica.lag.time.max.ms`. A burst that replicates within that time never "
        "removes anyone, so the ISR only shrinks for followers that are really stuck or slow.",
        "",
        "Metrics: shrinks/expands count `isr_shrink`/`isr_expand` events (written by the leader "
        "after its ZooKeeper compare-and-set succeeded); per hour divides by the observed "
        "window; under-replicated time sums, per partition, the intervals between "
        "ISR-bearing events (election, shrink, expand) whose ISR is smaller than the "
        "replication factor (the largest ISR seen), the last one running to the end of the "
        "window; elections count `leader_election` events (a broker became leader in a new "
        "epoch, the topic's creation included). Expands outnumber shrinks about two to one "
        "because one `isr-expiration` check drops both followers of a partition at once "
        "(3 -> 1) while each follower is added back by its own fetch (1 -> 2 -> 3). The test "
        "`tests/spark/test_telemetry_pipeline.py` checks these numbers against the events read "
        "directly with tidelog's consumer.",
        "",
    ]
    docs.mkdir(parents=True, exist_ok=True)
    out = docs / "telemetry.md"
    out.write_text("\n".join(lines))
    return out


def _mean(run: PolicyRun, key: str) -> float:
    rows = [r for r in run.rows if r["topic"] == DATA_TOPIC]
    return sum(r[key] for r in rows) / len(rows) if rows else 0.0


# ------------------------------------------------------------------------------ main
def new_spark() -> Any:
    from pyspark.sql import SparkSession

    import tidelog.spark

    spark = (SparkSession.builder.master("local[2]").appName("replication-telemetry")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    tidelog.spark.register(spark)
    return spark


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--policies", default="legacy,time",
                        help="comma-separated: legacy (replica.lag.max.messages) and/or time")
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds of bursty production per policy")
    parser.add_argument("--burst", type=int, default=5000, help="records per burst")
    parser.add_argument("--burst-rate", type=float, default=10_000.0,
                        help="records/s within a burst (0: as fast as the producer goes)")
    parser.add_argument("--pause", type=float, default=1.5, help="seconds idle between bursts")
    parser.add_argument("--partitions", type=int, default=3, help="partitions of the data topic")
    parser.add_argument("--lag-max-messages", type=int, default=25,
                        help="replica.lag.max.messages of the legacy run")
    parser.add_argument("--lag-time-ms", type=int, default=2000,
                        help="replica.lag.time.max.ms of both runs")
    parser.add_argument("--fetch-min-bytes", type=int, default=32768,
                        help="replica.fetch.min.bytes of both runs: a follower's fetch returns "
                             "once this much is new (or after replica.fetch.wait.max.ms=500), "
                             "a longer fetch cycle than localhost's ~1 ms round trip")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds after the producer stops before the Spark job")
    parser.add_argument("--docs", default=str(ROOT / "docs"), help="where to write the results")
    parser.add_argument("--no-docs", action="store_true",
                        help="print the tables only; do not write docs/telemetry.md and the PNG")
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.burst < 1 or args.pause < 0 or args.partitions < 1:
        parser.error("--duration > 0, --burst >= 1, --pause >= 0, --partitions >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in ("legacy", "time"):
            print(f"--policies: unknown policy {p!r} (legacy, time)", file=sys.stderr)
            return 2
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    workdir = Path(tempfile.mkdtemp(prefix="telemetry-"))
    spark = new_spark()
    runs: list[PolicyRun] = []
    try:
        for policy in policies:
            run = run_policy(spark, policy, workdir, args)
            runs.append(run)
            print(f"\n{policy}: {run.overrides}\n{format_table(run.rows)}\n", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    for run in runs:
        t = totals(run)
        log(f"{run.policy}: {t['isr_shrinks']} shrinks, {t['isr_expands']} expands, "
            f"{t['under_replicated_ms'] / 1000:.1f} s under-replicated, {t['elections']} "
            f"elections on {DATA_TOPIC}")
    if not args.no_docs:
        docs = Path(args.docs)
        docs.mkdir(parents=True, exist_ok=True)
        plot(runs, docs / "telemetry-isr.png")
        log(f"wrote {write_docs(runs, args, docs)} and {docs / 'telemetry-isr.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
