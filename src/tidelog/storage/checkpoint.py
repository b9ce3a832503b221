"""Kafka's checkpoint files: a version line, a count line, then one entry per line.

    0
    2
    orders 0 1234
    orders 1 99

`replication-offset-checkpoint` (HW), `recovery-point-offset-checkpoint` and
`log-start-offset-checkpoint` hold `topic partition offset` entries, one file per log dir;
`leader-epoch-checkpoint` (in each partition dir) holds `epoch start_offset` entries.
Writes are atomic (temp file, fsync, rename, fsync dir), so a crash leaves the old or the new file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from tidelog.storage.errors import KafkaStorageError
from tidelog.storage.file_io import FileIO, write_file_atomically

__all__ = [
    "CURRENT_VERSION",
    "CheckpointFile",
    "LOG_START_OFFSET_CHECKPOINT",
    "OffsetCheckpointFile",
    "RECOVERY_POINT_CHECKPOINT",
    "REPLICATION_OFFSET_CHECKPOINT",
    "TopicPartition",
]

CURRENT_VERSION = 0
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"

TopicPartition = tuple[str, int]
T = TypeVar("T")

_MAX_READ = 64 * 1024 * 1024  # a checkpoint larger than this is not one of ours


class CheckpointFile(Generic[T]):
    """One checkpoint file; `format_entry`/`parse_entry` map an entry to/from its line."""

    def __init__(
        self,
        file_io: FileIO,
        path: str,
        format_entry: Callable[[T], str],
        parse_entry: Callable[[list[str]], T],
        version: int = CURRENT_VERSION,
    ) -> None:
        self.file_io = file_io
        self.path = path
        self.version = version
        self._format_entry = format_entry
        self._parse_entry = parse_entry

    def write(self, entries: Iterable[T]) -> None:
        items = list(entries)
        lines = [str(self.version), str(len(items))]
        lines.extend(self._format_entry(item) for item in items)
        try:
            write_file_atomically(self.file_io, self.path, ("\n".join(lines) + "\n").encode())
        except OSError as exc:
            raise KafkaStorageError(f"error writing checkpoint {self.path}: {exc}") from exc

    def read(self) -> list[T]:
        """The entries; [] when the file does not exist. A malformed file (wrong version, a count
        that does not match, a bad line) raises KafkaStorageError naming the file and the fault."""
        try:
            if not self.file_io.exists(self.path):
                return []
            handle = self.file_io.open(self.path)
            try:
                size = handle.size()
                if size > _MAX_READ:
                    raise KafkaStorageError(f"checkpoint {self.path} is too large ({size} bytes)")
                raw = bytes(handle.read(0, size))
            finally:
                handle.close()
        except OSError as exc:
            raise KafkaStorageError(f"error reading checkpoint {self.path}: {exc}") from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise KafkaStorageError(f"malformed checkpoint {self.path}: not text") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) < 2:
            raise KafkaStorageError(f"malformed checkpoint {self.path}: missing header lines")
        try:
            version = int(lines[0].strip())
        except ValueError:
            raise KafkaStorageError(
                f"malformed checkpoint {self.path}: bad version line {lines[0]!r}"
            ) from None
        if version != self.version:
            raise KafkaStorageError(
                f"unrecognized version {version} of checkpoint {self.path} "
                f"(expected {self.version})"
            )
        try:
            expected = int(lines[1].strip())
        except ValueError:
            raise KafkaStorageError(
                f"malformed checkpoint {self.path}: bad count line {lines[1]!r}"
            ) from None
        body = lines[2:]
        if expected != len(body):
            raise KafkaStorageError(
                f"malformed checkpoint {self.path}: expected {expected} entries, found {len(body)}"
            )
        entries: list[T] = []
        for number, line in enumerate(body, start=3):
            try:
                entries.append(self._parse_entry(line.split()))
            except (ValueError, IndexError):
                raise KafkaStorageError(
                    f"malformed checkpoint {self.path}: bad line {number}: {line!r}"
                ) from None
        return entries


def _format_offset(entry: tuple[TopicPartition, int]) -> str:
    (topic, partition), offset = entry
    return f"{topic} {partition} {offset}"


def _parse_offset(parts: list[str]) -> tuple[TopicPartition, int]:
    if len(parts) != 3:
        raise ValueError("expected: topic partition offset")
    return (parts[0], int(parts[1])), int(parts[2])


class OffsetCheckpointFile:
    """`topic partition offset` checkpoints (HW, recovery point, log start offset)."""

    def __init__(self, file_io: FileIO, path: str) -> None:
        self._file = CheckpointFile(file_io, path, _format_offset, _parse_offset)
        self.path = path

    def write(self, offsets: dict[TopicPartition, int]) -> None:
        self._file.write(sorted(offsets.items()))

    def read(self) -> dict[TopicPartition, int]:
        return dict(self._file.read())

    @staticmethod
    def in_dir(file_io: FileIO, log_dir: str, name: str) -> OffsetCheckpointFile:
        return OffsetCheckpointFile(file_io, os.path.join(log_dir, name))
