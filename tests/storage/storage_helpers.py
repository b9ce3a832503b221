"""Helpers for the storage tests: small configs and batch builders."""

from __future__ import annotations

from tidelog.protocol.records.builder import build_values
from tidelog.storage.log_config import LogConfig


def batch(*values: bytes, timestamp: int = 0, epoch: int = -1, base_offset: int = 0) -> bytearray:
    """One uncompressed v2 batch holding `values` (default one value)."""
    return build_values(
        values or (b"v",), base_timestamp=timestamp, partition_leader_epoch=epoch,
        base_offset=base_offset,
    )


def small_config(**overrides: object) -> LogConfig:
    """Tiny segments and a dense index, so a few batches exercise rolls and index lookups."""
    props: dict[str, object] = {"segment.bytes": 1024, "index.interval.bytes": 128}
    props.update({k.replace("_", "."): v for k, v in overrides.items()})
    return LogConfig.from_dict(props)
