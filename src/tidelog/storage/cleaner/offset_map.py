"""OffsetMap: the log cleaner's key -> latest offset map (Kafka's SkimpyOffsetMap).

Keys are stored as their MD5 digest (16 bytes) next to an 8-byte offset, so the map holds
`memory // 24` slots; the cleaner fills it to `load_factor` of that (Kafka's
log.cleaner.io.buffer.load.factor, 0.9) and cleans only the dirty section it covers.
"""

from __future__ import annotations

import hashlib

__all__ = ["OffsetMap"]

_HASH_SIZE = 16  # MD5, Kafka's default hash algorithm
_BYTES_PER_ENTRY = _HASH_SIZE + 8


class OffsetMap:
    def __init__(self, memory: int, load_factor: float = 0.9) -> None:
        if memory < _BYTES_PER_ENTRY:
            raise ValueError(f"an offset map needs at least {_BYTES_PER_ENTRY} bytes, got {memory}")
        self.slots = memory // _BYTES_PER_ENTRY
        self.max_desired_size = max(1, int(self.slots * load_factor))
        self._offsets: dict[bytes, int] = {}
        self.latest_offset = -1

    @staticmethod
    def _hash(key: bytes | bytearray | memoryview) -> bytes:
        return hashlib.md5(key, usedforsecurity=False).digest()

    def put(self, key: bytes | bytearray | memoryview, offset: int) -> None:
        digest = self._hash(key)
        if digest not in self._offsets and len(self._offsets) >= self.slots:
            raise OverflowError("the offset map is full")
        self._offsets[digest] = offset
        self.latest_offset = offset

    def put_all(self, keys: list[bytes], offsets: list[int]) -> None:
        """`put` of each (key, offset) in order (one loop: the cleaner's hot path)."""
        table = self._offsets
        md5 = hashlib.md5
        slots = self.slots
        for key, offset in zip(keys, offsets, strict=True):
            digest = md5(key, usedforsecurity=False).digest()
            if len(table) >= slots and digest not in table:
                raise OverflowError("the offset map is full")
            table[digest] = offset
        if offsets:
            self.latest_offset = offsets[-1]

    def get_all(self, keys: list[bytes]) -> list[int]:
        """`get` of each key."""
        get = self._offsets.get
        md5 = hashlib.md5
        return [get(md5(key, usedforsecurity=False).digest(), -1) for key in keys]

    def get(self, key: bytes | bytearray | memoryview) -> int:
        """The latest offset put for `key`, or -1."""
        return self._offsets.get(self._hash(key), -1)

    def update_latest_offset(self, offset: int) -> None:
        self.latest_offset = offset

    @property
    def size(self) -> int:
        return len(self._offsets)

    @property
    def is_full(self) -> bool:
        return len(self._offsets) >= self.max_desired_size

    def clear(self) -> None:
        self._offsets.clear()
        self.latest_offset = -1
