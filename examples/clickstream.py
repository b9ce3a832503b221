"""Clickstream on a live tidelog cluster: page views counted per page per minute by Spark.

    python examples/clickstream.py                  # starts a 3-broker cluster in a temp dir
    python examples/clickstream.py --bootstrap 127.0.0.1:9092 --no-kill
    python examples/clickstream.py --connector kafka  # Spark's own Kafka connector

1. a generator produces JSON page-view events ``{"page", "user", "ts"}`` (event time in ms) to
   ``page-views`` (3 partitions, replication factor 3) with tidelog's idempotent producer
   (acks=all) and remembers what was acknowledged;
2. a Structured Streaming job reads ``page-views`` with the ``tidelog`` source (or Spark's own
   ``kafka`` source with ``--connector kafka``; the sink follows the same choice), parses the JSON,
   counts views per page per 1-minute event-time window with a 1-minute watermark, and writes
   each finalized window count both to Parquet and to the ``page-counts`` topic (foreachBatch:
   a replayed micro-batch overwrites its own Parquet directory, so the Parquet side stays exact);
3. mid-stream, the leader of ``page-views`` partition 0 is killed (SIGKILL) and later restarted;
4. at the end a flush event closes the last windows, ``processAllAvailable()`` waits until
   every micro-batch of the input (and the one the watermark then triggers) has run and been
   committed, the query is stopped, and the Parquet counts and the ``page-counts`` topic are
   compared with the counts computed directly from the acknowledged events. Exit status 0 only
   if they are equal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

PAGES = [f"/page/{i}" for i in range(8)]
WINDOW_MS = 60_000
TOPIC, COUNTS = "page-views", "page-counts"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Generator(threading.Thread):
    """Produces ``events`` page views (event time advancing 0.25 s of a simulated clock per
    event) on its own event loop; ``acked`` holds the events the cluster acknowledged."""

    def __init__(self, bootstrap: str, events: int, rate_per_s: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.events = events
        self.rate = rate_per_s
        self.acked: list[dict] = []
        self.failed = 0
        self.error: BaseException | None = None
        self.base_ms = (int(time.time() * 1000) // WINDOW_MS) * WINDOW_MS

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    async def _produce(self) -> None:
        from tidelog.client.cluster import KafkaClient
        from tidelog.client.producer import Producer

        rng = random.Random(7)
        async with KafkaClient(self.bootstrap, client_id="clickstream-gen") as client:
            producer = Producer(client, acks="all", linger_ms=5)
            await producer.start()
            pending = []
            for i in range(self.events):
                event = {
                    "page": rng.choice(PAGES),
                    "user": f"u{rng.randrange(50)}",
                    "ts": self.base_ms + i * 250,
                }
                future = await producer.send(TOPIC, json.dumps(event).encode(), key=None)
                pending.append((event, future))
                await asyncio.sleep(1 / self.rate)
            await producer.flush()
            await producer.close()
            for event, future in pending:
                if future.exception() is None:
                    self.acked.append(event)
                else:
                    self.failed += 1

    def flush_event(self) -> dict:
        """An event far past every window: moves the watermark so the last windows close."""
        return {
            "page": "/flush",
            "user": "-",
            "ts": self.base_ms + self.events * 250 + 10 * WINDOW_MS,
        }


def expected_counts(events: list[dict]) -> Counter:
    return Counter(((e["ts"] // WINDOW_MS) * WINDOW_MS, e["page"]) for e in events)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="an existing cluster (default: start 3 brokers)")
    parser.add_argument("--events", type=int, default=2400,
                        help="page-view events to produce (default: 2400)")
    parser.add_argument("--rate", type=float, default=200.0,
                        help="events per second (default: 200)")
    parser.add_argument("--no-kill", action="store_true",
                        help="do not kill (and restart) the leader of partition 0 mid-stream")
    parser.add_argument("--out", help="output directory (default: a temp dir)")
    parser.add_argument("--connector", choices=("tidelog", "kafka"), default="tidelog",
                        help="read and write the topics with tidelog's connector or with "
                             "Spark's own Kafka connector (fetched once from Maven Central)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds the query may take to process all of its input after "
                             "the generator ends (default: 900)")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    workdir = Path(args.out or tempfile.mkdtemp(prefix="clickstream-"))
    cluster = None
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            from tidelog.cluster.local import LocalCluster

            cluster = LocalCluster(workdir / "cluster")
            log("starting a 3-broker tidelog cluster")
            cluster.up(3, timeout_s=120)
            bootstrap = cluster.bootstrap_servers
        log(f"cluster at {bootstrap}")
        return run(bootstrap, cluster, workdir, args)
    finally:
        if cluster is not None:
            cluster.down()
            log("cluster stopped")
        if not args.out:
            shutil.rmtree(workdir, ignore_errors=True)


def create_topics(bootstrap: str, replication: int) -> None:
    from tidelog.client.cluster import KafkaClient, NewTopic

    async def go() -> None:
        async with KafkaClient(bootstrap) as client:
            result = await client.create_topics(
                [
                    NewTopic(TOPIC, 3, replication, {"min.insync.replicas": "2"}),
                    NewTopic(COUNTS, 1, replication),
                ]
            )
            for name, error in result.items():
                if error is not None and "TOPIC_ALREADY_EXISTS" not in str(error):
                    raise SystemExit(f"create {name}: {error}")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                meta = await client.refresh_metadata([TOPIC, COUNTS])
                if all(
                    t in meta.topics
                    and all(p.leader >= 0 for p in meta.topics[t].partitions.values())
                    for t in (TOPIC, COUNTS)
                ):
                    return
                await asyncio.sleep(0.2)
            raise SystemExit("topics have no leaders after 30 s")

    asyncio.run(go())


def leader_of_partition0(bootstrap: str) -> int | None:
    from tidelog.client.cluster import KafkaClient
    from tidelog.client.metadata import TopicPartition

    async def go() -> int | None:
        async with KafkaClient(bootstrap) as client:
            await client.refresh_metadata([TOPIC])
            return client.leader_for(TopicPartition(TOPIC, 0))

    return asyncio.run(go())


def run(bootstrap: str, cluster, workdir: Path, args: argparse.Namespace) -> int:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import tidelog.spark

    create_topics(bootstrap, 3 if cluster is not None else 1)
    jars = []
    if args.connector == "kafka":
        from tidelog.spark import kafka_connector

        try:
            jars = kafka_connector.fetch()
        except kafka_connector.ConnectorUnavailable as exc:
            raise SystemExit(f"--connector kafka: {exc}") from None
        log(f"Spark's Kafka connector {kafka_connector.connector_version()}")
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", ",".join(jars))
        .appName("clickstream")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidelog.spark.register(spark)
    parquet_dir = workdir / "page-counts.parquet"

    views = (
        spark.readStream.format(args.connector)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
        .select(
            F.from_json(F.col("value").cast("string"), "page string, user string, ts long").alias(
                "e"
            )
        )
        .select("e.page", (F.col("e.ts") / 1000).cast("timestamp").alias("event_time"))
    )
    counts = (
        views.withWatermark("event_time", "1 minute")
        .groupBy(F.window("event_time", "1 minute"), "page")
        .count()
        .select(
            (F.col("window.start").cast("double") * 1000).cast("long").alias("window_ms"),
            "page",
            "count",
        )
    )

    def sink(df, batch_id: int) -> None:
        df = df.where(F.col("page") != "/flush").cache()
        if df.isEmpty():
            df.unpersist()
            return
        # Parquet: one directory per micro-batch, overwritten if the batch is replayed.
        df.write.mode("overwrite").parquet(str(parquet_dir / f"batch={batch_id}"))
        (
            df.select(
                F.col("page").alias("key"),
                F.to_json(F.struct("window_ms", "page", "count")).alias("value"),
            )
            .write.format(args.connector)
            .mode("append")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", COUNTS)
            .save()
        )
        df.unpersist()

    query = (
        counts.writeStream.outputMode("append")
        .foreachBatch(sink)
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    generator = Generator(bootstrap, args.events, args.rate)
    generator.start()
    log(f"producing {args.events} page views at ~{args.rate:.0f}/s")
    killed = None
    if cluster is not None and not args.no_kill:
        time.sleep(args.events / args.rate / 3)
        killed = leader_of_partition0(bootstrap)
        if killed is not None:
            log(f"killing broker {killed}, the leader of {TOPIC}-0 (SIGKILL)")
            cluster.stop_broker(killed, kill=True)
            time.sleep(args.events / args.rate / 3)
            log(f"restarting broker {killed}")
            cluster.start_broker(killed)
    generator.join(timeout=600)
    if generator.error is not None:
        raise SystemExit(f"generator failed: {generator.error!r}")
    log(f"{len(generator.acked)} events acknowledged, {generator.failed} failed")

    # Close the last windows, then let the query run every micro-batch the input holds.
    flush = generator.flush_event()
    asyncio.run(_send_one(bootstrap, flush))
    end_offsets = input_end_offsets(bootstrap)
    log(f"input ends at {end_offsets}; waiting for the query to process and commit it all")
    if not process_all_available(query, timeout_s=args.timeout):
        query.stop()
        spark.stop()
        raise SystemExit(f"the query did not process its input within {args.timeout:.0f} s")
    committed = committed_offsets(query)
    log(f"the query committed up to {committed}")
    query.stop()  # idle now: every batch has run its foreachBatch and is committed
    expected = expected_counts(generator.acked)
    got = read_parquet_counts(spark, parquet_dir)
    topic_counts = read_topic_counts(spark, bootstrap, args.connector)
    spark.stop()
    if committed != end_offsets:
        log(f"MISMATCH: the query committed {committed}, the input ends at {end_offsets}")
        return 1

    ok = got == expected and topic_counts == expected
    log(
        f"windows: expected {len(expected)}, Parquet {len(got)}, {COUNTS} topic "
        f"{len(topic_counts)}; views: expected {sum(expected.values())}, Parquet "
        f"{sum(got.values())}, topic {sum(topic_counts.values())}"
    )
    if killed is not None:
        log(f"broker {killed} was killed and restarted mid-stream")
    log("counts equal the acknowledged events" if ok else "MISMATCH")
    return 0 if ok else 1


def process_all_available(query, timeout_s: float) -> bool:
    """query.processAllAvailable(), bounded: it returns once a trigger finds no new data and
    no batch to run, so the data batch holding the flush event and the batch its watermark
    then triggers (the one emitting the last windows) have both run foreachBatch to the end
    and been committed. A failed query raises here. False if it did not finish in time."""
    outcome: list[BaseException | None] = []

    def wait() -> None:
        try:
            query.processAllAvailable()
            outcome.append(None)
        except BaseException as exc:  # re-raised in the main thread
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(timeout_s)
    if not outcome:
        return False
    if outcome[0] is not None:
        raise SystemExit(f"query failed: {outcome[0]}")
    return True


def input_end_offsets(bootstrap: str) -> dict[str, dict[str, int]]:
    """Each page-views partition's high watermark, in Spark's Kafka offset JSON shape."""
    from tidelog.spark.kafka_io import SyncKafka
    from tidelog.spark.options import Subscription

    with SyncKafka(bootstrap) as kafka:
        tps = kafka.topic_partitions(Subscription("subscribe", topics=(TOPIC,)))
        latest = kafka.latest_offsets(tps)
    return {TOPIC: {str(tp.partition): offset for tp, offset in sorted(latest.items())}}


def committed_offsets(query) -> dict[str, dict[str, int]]:
    """The end offset of the query's last committed micro-batch."""
    progress = query.lastProgress
    if progress is None or not progress["sources"]:
        return {}
    end = progress["sources"][0]["endOffset"]
    return json.loads(end) if isinstance(end, str) else end


async def _send_one(bootstrap: str, event: dict) -> None:
    from tidelog.client.cluster import KafkaClient
    from tidelog.client.producer import Producer

    async with KafkaClient(bootstrap) as client:
        producer = Producer(client, acks="all")
        await producer.start()
        for partition in range(3):  # every partition, so the watermark moves on all of them
            await producer.send(TOPIC, json.dumps(event).encode(), partition=partition)
        await producer.flush()
        await producer.close()


def read_parquet_counts(spark, parquet_dir: Path) -> Counter:
    if not any(parquet_dir.glob("*/*.parquet")):
        return Counter()
    schema = "window_ms long, page string, count long"
    rows = spark.read.schema(schema).parquet(str(parquet_dir)).collect()
    return Counter({(r.window_ms, r.page): r["count"] for r in rows})


def read_topic_counts(spark, bootstrap: str, connector: str) -> Counter:
    rows = (
        spark.read.format(connector)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", COUNTS)
        .load()
        .collect()
    )
    out: Counter = Counter()
    for r in rows:
        record = json.loads(r.value)
        # at-least-once: a replayed batch may repeat a window; the last write wins
        out[(record["window_ms"], record["page"])] = record["count"]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
