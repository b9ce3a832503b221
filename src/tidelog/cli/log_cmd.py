"""`tidelog log`: write, read and describe partition logs in a log dir (a broker's `log.dirs`
entry), offline: do not point it at the dir of a running broker."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from tidelog.protocol.records.batch import CorruptRecordError
from tidelog.protocol.records.builder import Record, build_batch
from tidelog.storage.checkpoint import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from tidelog.storage.errors import StorageError
from tidelog.storage.file_io import OsFileIO
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig
from tidelog.storage.log_manager import LogManager

COMPRESSION = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_PROGRESS_MIN_RECORDS = 20_000


@contextmanager
def _log_manager(log_dir: str, must_exist: bool) -> Iterator[LogManager]:
    """A LogManager over one dir; shut down cleanly afterwards. Errors become one line."""
    if must_exist and not os.path.isdir(log_dir):
        raise click.ClickException(f"no such log dir: {log_dir}")
    try:
        manager = LogManager([log_dir], LogConfig(), OsFileIO(), now_ms=_now_ms())
    except (StorageError, OSError, ValueError) as exc:
        raise click.ClickException(f"cannot open log dir {log_dir}: {exc}") from None
    if manager.offline_dirs:
        raise click.ClickException(f"log dir {log_dir} is unusable (I/O error)")
    try:
        yield manager
    except (StorageError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        try:
            manager.shutdown()
        except (StorageError, OSError) as exc:
            raise click.ClickException(f"shutdown of {log_dir} failed: {exc}") from None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _existing_log(manager: LogManager, topic: str, partition: int, log_dir: str) -> Log:
    log = manager.get_log(topic, partition)
    if log is None:
        raise click.ClickException(f"no log for {topic}-{partition} in {log_dir}")
    return log


@click.group()
def log() -> None:
    """Write, read and describe partition logs on disk (offline tools)."""


@log.command()
@click.argument("log_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--topic", required=True, help="Topic name.")
@click.option("--partition", type=click.IntRange(min=0), required=True, help="Partition number.")
@click.option("--count", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Number of records to write.")
@click.option("--size", type=click.IntRange(min=0), default=100, show_default=True,
              help="Value size of each record in bytes.")
@click.option("--batch", "batch_size", type=click.IntRange(min=1), default=100,
              show_default=True, help="Records per record batch.")
@click.option("--compression", type=click.Choice(list(COMPRESSION)), default="none",
              show_default=True, help="Compression codec of the batches.")
@click.option("--epoch", type=click.IntRange(min=0), default=None,
              help="Leader epoch to stamp [default: the log's latest epoch, or 0].")
def write(log_dir: str, topic: str, partition: int, count: int, size: int, batch_size: int,
          compression: str, epoch: int | None) -> None:
    """Append COUNT generated records (key `key-N`, a SIZE-byte value) to TOPIC-PARTITION in
    DIR as its leader, creating the log if needed; the HW moves to the new log end."""
    codec = COMPRESSION[compression]
    with _log_manager(log_dir, must_exist=False) as manager:
        try:
            target = manager.get_or_create_log(topic, partition, now_ms=_now_ms())
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        leader_epoch = epoch if epoch is not None else (target.latest_epoch or 0)
        filler = (b"tidelog-" * (size // 8 + 1))[:size]
        first = target.log_end_offset
        written = 0
        with Progress(
            TextColumn("writing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
            disable=count < _PROGRESS_MIN_RECORDS, transient=True,
        ) as progress:
            task = progress.add_task("write", total=count)
            while written < count:
                n = min(batch_size, count - written)
                now = _now_ms()
                records = [
                    Record(value=filler, key=b"key-%d" % (first + written + i)) for i in range(n)
                ]
                try:
                    target.append_as_leader(
                        build_batch(records, compression=codec, base_timestamp=now),
                        leader_epoch, now,
                    )
                except (CorruptRecordError, StorageError) as exc:
                    raise click.ClickException(f"append failed: {exc}") from None
                written += n
                progress.update(task, advance=n)
        target.update_high_watermark(target.log_end_offset)
        click.echo(
            f"wrote {count} records to {topic}-{partition} at offsets "
            f"{first}..{target.log_end_offset - 1} (epoch {leader_epoch})"
        )


def _show(data: bytes | None, width: int = 60) -> str:
    if data is None:
        return "null"
    try:
        text = data.decode("utf-8")
        if not text.isprintable():
            raise UnicodeDecodeError("utf-8", data, 0, 1, "unprintable")
    except UnicodeDecodeError:
        text = data.hex()
    return text if len(text) <= width else text[: width - 1] + "…"


@log.command()
@click.argument("log_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--topic", required=True, help="Topic name.")
@click.option("--partition", type=click.IntRange(min=0), required=True, help="Partition number.")
@click.option("--from", "from_offset", type=int, default=None,
              help="First offset to print [default: the log start offset].")
@click.option("--max", "max_records", type=click.IntRange(min=1), default=20, show_default=True,
              help="Most records to print.")
def read(log_dir: str, topic: str, partition: int, from_offset: int | None,
         max_records: int) -> None:
    """Print records of TOPIC-PARTITION in DIR as a table: offset, timestamp, key, value."""
    from tidelog.protocol.records.decoder import decode_records

    with _log_manager(log_dir, must_exist=True) as manager:
        source = _existing_log(manager, topic, partition, log_dir)
        start = source.log_start_offset if from_offset is None else from_offset
        if not source.log_start_offset <= start <= source.log_end_offset:
            raise click.ClickException(
                f"offset {start} is out of range: {topic}-{partition} holds "
                f"[{source.log_start_offset}, {source.log_end_offset})"
            )
        table = Table(title=f"{topic}-{partition} from offset {start}")
        for column in ("offset", "timestamp", "key", "value"):
            table.add_column(column, justify="right" if column in ("offset", "timestamp") else "left")
        shown = 0
        for batch in source.batches(start):
            try:
                records = decode_records(batch)
            except CorruptRecordError as exc:
                raise click.ClickException(f"corrupt batch at offset {batch.base_offset}: {exc}") from None
            for record in records:
                if record.offset < start:
                    continue
                table.add_row(str(record.offset), str(record.timestamp), _show(record.key),
                              _show(record.value))
                shown += 1
                if shown >= max_records:
                    break
            if shown >= max_records:
                break
        Console(width=160).print(table)
        click.echo(f"{shown} records")


@log.command()
@click.argument("log_dir", metavar="DIR", type=click.Path(file_okay=False))
def describe(log_dir: str) -> None:
    """Print, per partition in DIR: its segments (base offset, size, batches, records), log
    start and end offsets, recovery point, HW from the checkpoint and leader epochs."""
    hw_file = OffsetCheckpointFile(OsFileIO(), os.path.join(log_dir, REPLICATION_OFFSET_CHECKPOINT))
    with _log_manager(log_dir, must_exist=True) as manager:
        try:
            high_watermarks = hw_file.read()
        except StorageError as exc:
            click.echo(f"warning: {exc}", err=True)
            high_watermarks = {}
        console = Console(width=160)
        if not manager.logs:
            click.echo(f"no partition logs in {log_dir}")
        for (topic, partition), plog in sorted(manager.logs.items()):
            table = Table(title=f"{topic}-{partition}")
            for column in ("segment base offset", "size (bytes)", "batches", "records"):
                table.add_column(column, justify="right")
            for segment in plog.segments:
                batches = records = 0
                for b in segment.iter_batches():
                    batches += 1
                    records += b.record_count
                table.add_row(str(segment.base_offset), str(segment.size), str(batches),
                              str(records))
            console.print(table)
            hw = high_watermarks.get((topic, partition))
            epochs = ", ".join(f"{e}@{o}" for e, o in plog.leader_epoch_cache.entries) or "none"
            click.echo(
                f"  log start offset {plog.log_start_offset}, log end offset "
                f"{plog.log_end_offset}, recovery point {plog.recovery_point}, "
                f"HW {hw if hw is not None else 'none'}, leader epochs {epochs}"
            )
