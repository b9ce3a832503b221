"""Pieces of Kafka's `org.apache.kafka.common.utils` that several packages need (one copy)."""

from __future__ import annotations

__all__ = ["java_string_hash"]


def java_string_hash(s: str) -> int:
    """Java's `String.hashCode` (over UTF-16 code units, 32-bit signed overflow): Kafka places
    groups, transactional ids and fetcher ids by it."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h
