"""`tidelog consume`: read records from a topic's partitions with tidelog's own consumer."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from typing import TYPE_CHECKING

import click

from tidelog.cli.produce_cmd import bootstrap_option, fail, open_client, require_topic

if TYPE_CHECKING:
    from tidelog.client.consumer import ConsumerRecord


@click.command()
@bootstrap_option
@click.option("--topic", required=True, help="Topic to read (it must exist).")
@click.option(
    "--partition",
    type=click.IntRange(min=0),
    default=None,
    help="Read only this partition. Default: every partition of the topic.",
)
@click.option(
    "--from-beginning",
    is_flag=True,
    default=False,
    help="Start at each partition's log start offset. Default: at its end (new records only).",
)
@click.option(
    "--offset",
    type=click.IntRange(min=0),
    default=None,
    help="Start at this offset (in every partition read). Offsets before the log start or "
    "after its end restart at the log start.",
)
@click.option(
    "--max-messages",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many records. Default: no limit.",
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=0),
    default=10000,
    show_default=True,
    help="Stop when no record arrives for this long; 0 waits until interrupted (Ctrl-C).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["value", "table", "json"]),
    default="value",
    show_default=True,
    help="value: each value on its own line (UTF-8, invalid bytes replaced); table: a table "
    "of partition, offset, timestamp, key and value at the end; json: one JSON object per "
    "record (key/value as text, or base64 under key_b64/value_b64 if not UTF-8).",
)
def consume(
    bootstrap_server: str,
    topic: str,
    partition: int | None,
    from_beginning: bool,
    offset: int | None,
    max_messages: int | None,
    timeout_ms: int,
    fmt: str,
) -> None:
    """Consume records from TOPIC and print them to standard output."""
    if from_beginning and offset is not None:
        fail("--from-beginning and --offset are mutually exclusive")
    try:
        records = asyncio.run(
            _consume(
                bootstrap_server,
                topic,
                partition,
                from_beginning,
                offset,
                max_messages,
                timeout_ms,
                fmt,
            )
        )
    except KeyboardInterrupt:
        records = []
    if fmt == "table":
        _print_table(topic, records)


async def _consume(
    bootstrap: str,
    topic: str,
    partition: int | None,
    from_beginning: bool,
    offset: int | None,
    max_messages: int | None,
    timeout_ms: int,
    fmt: str,
) -> list[ConsumerRecord]:
    from tidelog.client.consumer import OFFSET_BEGINNING, OFFSET_END, Consumer
    from tidelog.client.errors import KafkaClientError
    from tidelog.client.metadata import TopicPartition

    kept: list[ConsumerRecord] = []
    async with open_client(bootstrap) as client:
        partitions = await require_topic(client, topic)
        if partition is not None:
            if partition not in partitions:
                fail(f"topic {topic!r} has no partition {partition} (it has {len(partitions)})")
            partitions = [partition]
        start = (
            offset if offset is not None else (OFFSET_BEGINNING if from_beginning else OFFSET_END)
        )
        consumer = Consumer(client, auto_offset_reset="earliest")
        consumer.assign([(TopicPartition(topic, p), start) for p in partitions])
        seen = 0
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        try:
            while max_messages is None or seen < max_messages:
                want = 500 if max_messages is None else min(500, max_messages - seen)
                batch = await consumer.poll(want, timeout_ms=500)
                if not batch:
                    if timeout_ms and (loop.time() - idle_since) * 1000 >= timeout_ms:
                        break
                    continue
                idle_since = loop.time()
                seen += len(batch)
                if fmt == "table":
                    kept.extend(batch)
                else:
                    _write(batch, fmt)
        except KafkaClientError as exc:
            fail(f"consuming {topic!r} failed: {exc}")
        finally:
            await consumer.close()
    return kept


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def _json_field(out: dict[str, object], name: str, data: bytes | None) -> None:
    if data is None:
        out[name] = None
        return
    try:
        out[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        out[f"{name}_b64"] = base64.b64encode(data).decode()


def _write(records: list[ConsumerRecord], fmt: str) -> None:
    lines: list[str] = []
    for rec in records:
        if fmt == "value":
            lines.append(_text(rec.value) or "")
        else:
            obj: dict[str, object] = {
                "topic": rec.topic,
                "partition": rec.partition,
                "offset": rec.offset,
                "timestamp": rec.timestamp,
            }
            _json_field(obj, "key", rec.key)
            _json_field(obj, "value", rec.value)
            obj["headers"] = {k: _text(v) for k, v in rec.headers}
            lines.append(json.dumps(obj, ensure_ascii=False))
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def _print_table(topic: str, records: list[ConsumerRecord]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{topic}: {len(records)} record(s)")
    for column in ("partition", "offset", "timestamp", "key", "value"):
        table.add_column(column, justify="right" if column in ("partition", "offset") else "left")
    for rec in records:
        table.add_row(
            str(rec.partition),
            str(rec.offset),
            str(rec.timestamp),
            _text(rec.key) or "",
            _text(rec.value) or "",
        )
    Console(file=sys.stdout).print(table)
