"""Partition offsets in Spark's Kafka JSON format: ``{"topic":{"0":23,"1":-2}}``.

The same shape is the streaming source's offset (Spark stores it in the checkpoint's offset log),
so a checkpoint written by ``format("tidelog")`` reads like one written by ``format("kafka")``.
In option values, -2 means earliest and -1 latest; in streaming offsets every value is a real
offset (the next offset to read).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from tidelog.client.metadata import TopicPartition

__all__ = [
    "EARLIEST",
    "LATEST",
    "from_offset_dict",
    "parse_partition_offsets",
    "partition_offsets_json",
    "to_offset_dict",
]

EARLIEST = -2
LATEST = -1


def to_offset_dict(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{tp: offset}`` -> ``{"topic": {"partition": offset}}``, sorted (stable checkpoints)."""
    result: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        result.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return result


def from_offset_dict(value: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    """The inverse of :func:`to_offset_dict`; raises ValueError for anything else."""
    if not isinstance(value, Mapping):
        raise ValueError(f"expected an object of topics, got {type(value).__name__}")
    result: dict[TopicPartition, int] = {}
    for topic, parts in value.items():
        if not isinstance(topic, str) or not isinstance(parts, Mapping):
            raise ValueError(f"topic {topic!r} must map to an object of partition offsets")
        for partition, offset in parts.items():
            try:
                number = int(partition)
            except (TypeError, ValueError):
                raise ValueError(f"partition {partition!r} of {topic!r} is not a number") from None
            if number < 0:
                raise ValueError(f"partition {number} of {topic!r} is negative")
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise ValueError(f"offset {offset!r} of {topic}-{number} is not an integer")
            result[TopicPartition(topic, number)] = offset
    return result


def parse_partition_offsets(text: str) -> dict[TopicPartition, int]:
    """Parse ``{"topic":{"0":23}}``; raises ValueError with the reason."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg})") from None
    offsets = from_offset_dict(value)
    if not offsets:
        raise ValueError("no topic-partitions given")
    return offsets


def partition_offsets_json(offsets: Mapping[TopicPartition, int]) -> str:
    return json.dumps(to_offset_dict(offsets), separators=(",", ":"))
