"""`tidelog produce`: write records to a topic with tidelog's own producer.

Either generated records (``--count N --size S``, with a progress bar) or one record per line of
standard input. Ends with a summary table: records, acked, errors, records/s and the p50/p99
latency from send to acknowledgement.
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import IO, TYPE_CHECKING, NoReturn

import click

if TYPE_CHECKING:
    from tidelog.client.cluster import KafkaClient

COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")

# -- shared with `tidelog consume` ---------------------------------------------------------

bootstrap_option = click.option(
    "--bootstrap-server",
    "bootstrap_server",
    required=True,
    metavar="HOST:PORT[,HOST:PORT...]",
    help="Brokers to bootstrap from; each is tried in turn until one answers.",
)


def fail(message: str) -> NoReturn:
    """One line on stderr, exit status 1."""
    raise click.ClickException(message)


@asynccontextmanager
async def open_client(
    bootstrap: str, request_timeout_ms: int = 30000
) -> AsyncIterator[KafkaClient]:
    """A started KafkaClient, or a one-line error if no bootstrap server answers."""
    from tidelog.client.cluster import KafkaClient
    from tidelog.client.errors import KafkaClientError

    try:
        client = KafkaClient(
            bootstrap, request_timeout_ms=request_timeout_ms, connect_timeout_s=5.0, retries=2
        )
    except ValueError as exc:
        fail(str(exc))
    try:
        await client.start()
    except KafkaClientError as exc:
        await client.close()
        fail(f"cannot reach {bootstrap}: {exc}")
    try:
        yield client
    finally:
        await client.close()


async def require_topic(client: KafkaClient, topic: str) -> list[int]:
    """The topic's partition ids, or a one-line error if it does not exist."""
    from tidelog.client.errors import BrokerResponseError

    try:
        return await client.partitions_for(topic, refresh=True)
    except BrokerResponseError as exc:
        if exc.code_value == 3:  # UNKNOWN_TOPIC_OR_PARTITION
            fail(f"topic {topic!r} does not exist")
        fail(f"topic {topic!r}: {exc}")


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, min(len(sorted_values), math.ceil(pct / 100 * len(sorted_values))))
    return sorted_values[rank - 1]


# -- the command -----------------------------------------------------------------------------


@click.command()
@bootstrap_option
@click.option("--topic", required=True, help="Topic to write to (it must exist).")
@click.option(
    "--partition",
    type=click.IntRange(min=0),
    default=None,
    help="Write every record to this partition. Default: by key (murmur2, as Kafka's "
    "producer), or sticky batches across partitions when there is no key.",
)
@click.option(
    "--acks",
    type=click.Choice(["all", "1", "0"]),
    default="all",
    show_default=True,
    help="all: acknowledged once every in-sync replica has the record; 1: once the leader "
    "has it; 0: not acknowledged at all (offsets are unknown).",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Send this many generated records instead of reading standard input.",
)
@click.option(
    "--size",
    type=click.IntRange(min=0),
    default=100,
    show_default=True,
    help="Value size in bytes of each generated record (with --count).",
)
@click.option(
    "--compression",
    type=click.Choice(COMPRESSIONS),
    default="none",
    show_default=True,
    help="Batch compression (Kafka's compression.type).",
)
@click.option("--key", default=None, help="Key of every record. Default: no key.")
@click.option(
    "--linger-ms",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How long a batch waits for more records before it is sent (linger.ms).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=16384,
    show_default=True,
    help="Bytes that make a batch full (batch.size).",
)
@click.option(
    "--idempotence/--no-idempotence",
    default=None,
    help="Idempotent producer (no duplicates on retry). Default: on with --acks all, off "
    "otherwise (Kafka requires acks=all for it).",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=1),
    default=30000,
    show_default=True,
    help="request.timeout.ms for each produce request.",
)
@click.option(
    "--throughput",
    type=int,
    default=-1,
    show_default=True,
    help="With --count: send at most this many records per second (-1: as fast as "
    "possible). Latencies at full speed include the time records queue in the producer.",
)
def produce(
    bootstrap_server: str,
    topic: str,
    partition: int | None,
    acks: str,
    count: int | None,
    size: int,
    compression: str,
    key: str | None,
    linger_ms: int,
    batch_size: int,
    idempotence: bool | None,
    timeout_ms: int,
    throughput: int,
) -> None:
    """Produce records to TOPIC: --count generated records, or one record per stdin line."""
    if throughput == 0 or throughput < -1:
        fail("--throughput must be positive, or -1 for no limit")
    if idempotence is None:
        idempotence = acks == "all"
    elif idempotence and acks != "all":
        fail("--idempotence requires --acks all")
    stdin = None if count is not None else sys.stdin
    summary = asyncio.run(
        _produce(
            bootstrap_server,
            topic,
            partition,
            acks,
            count,
            size,
            compression,
            key.encode() if key is not None else None,
            linger_ms,
            batch_size,
            idempotence,
            timeout_ms,
            stdin,
            throughput,
        )
    )
    _print_summary(summary)
    if summary["errors"]:
        sys.exit(1)


async def _produce(
    bootstrap: str,
    topic: str,
    partition: int | None,
    acks: str,
    count: int | None,
    size: int,
    compression: str,
    key: bytes | None,
    linger_ms: int,
    batch_size: int,
    idempotence: bool,
    timeout_ms: int,
    stdin: IO[str] | None,
    throughput: int = -1,
) -> dict[str, object]:
    from tidelog.client.producer import Producer

    async with open_client(bootstrap, request_timeout_ms=timeout_ms) as client:
        partitions = await require_topic(client, topic)
        if partition is not None and partition not in partitions:
            fail(f"topic {topic!r} has no partition {partition} (it has {len(partitions)})")
        producer = Producer(
            client,
            acks=acks,
            enable_idempotence=idempotence,
            compression=compression,
            linger_ms=linger_ms,
            batch_size=batch_size,
            request_timeout_ms=timeout_ms,
        )
        latencies: list[float] = []
        errors: Counter[str] = Counter()
        acked = 0
        sent = 0

        def on_done(started: float, future: asyncio.Future[object]) -> None:
            nonlocal acked
            if future.cancelled():
                errors["cancelled"] += 1
            elif future.exception() is not None:
                errors[str(future.exception()).split(":")[0]] += 1
            else:
                acked += 1
                latencies.append(time.perf_counter() - started)

        async def send(value: bytes) -> None:
            nonlocal sent
            started = time.perf_counter()
            future = await producer.send(topic, value, key=key, partition=partition)
            future.add_done_callback(lambda f, s=started: on_done(s, f))
            sent += 1

        start = time.perf_counter()
        async with producer:
            if count is not None:
                from rich.progress import Progress

                # uppercase letters, as Kafka's ProducerPerformance: printable when consumed
                payload = bytes(random.choices(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=size))
                with Progress(transient=True, console=_stderr_console()) as progress:
                    task = progress.add_task(f"producing to {topic}", total=count)
                    for i in range(count):
                        if throughput > 0:
                            # pace to the target rate (ProducerPerformance's throttler)
                            ahead = start + i / throughput - time.perf_counter()
                            if ahead > 0.001:
                                await asyncio.sleep(ahead)
                        await send(payload)
                        if i % 1000 == 999 or i == count - 1:
                            progress.update(task, completed=i + 1)
                    progress.update(task, description="waiting for acks")
                    await producer.flush()
            else:
                assert stdin is not None
                loop = asyncio.get_running_loop()
                while True:
                    line = await loop.run_in_executor(None, stdin.readline)
                    if not line:
                        break
                    await send(line.rstrip("\r\n").encode())
                await producer.flush()
        elapsed = time.perf_counter() - start
    return {
        "topic": topic,
        "records": sent,
        "acked": acked if acks != "0" else 0,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "elapsed": elapsed,
        "latencies": sorted(latencies),
        "acks": acks,
    }


def _stderr_console():  # type: ignore[no-untyped-def]
    from rich.console import Console

    return Console(stderr=True)


def _print_summary(summary: dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    latencies: list[float] = summary["latencies"]  # type: ignore[assignment]
    elapsed: float = summary["elapsed"]  # type: ignore[assignment]
    records: int = summary["records"]  # type: ignore[assignment]
    table = Table(title=f"produce to {summary['topic']}")
    for column in ("records", "acked", "errors", "records/s", "p50 latency", "p99 latency"):
        table.add_column(column, justify="right")
    no_acks = summary["acks"] == "0"
    table.add_row(
        str(records),
        "-" if no_acks else str(summary["acked"]),
        str(summary["errors"]),
        f"{records / elapsed:,.0f}" if elapsed > 0 else "-",
        "-" if no_acks or not latencies else f"{percentile(latencies, 50) * 1000:.2f} ms",
        "-" if no_acks or not latencies else f"{percentile(latencies, 99) * 1000:.2f} ms",
    )
    console = Console(file=sys.stdout)  # the stream in use now (click swaps it in tests)
    console.print(table)
    kinds: dict[str, int] = summary["error_kinds"]  # type: ignore[assignment]
    for kind, n in sorted(kinds.items()):
        console.print(f"[red]{n} record(s) failed: {kind}")
