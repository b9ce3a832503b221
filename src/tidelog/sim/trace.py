"""The run's trace: one tuple of plain values per notable event, formatted only when printed.

Tuples keep the hot path cheap (no string formatting while the run goes); `digest()` hashes
their reprs, so two runs of one seed can be compared by a single hex string.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

TraceEntry = tuple[Any, ...]  # (time_ms, kind, node, *details)


class Trace:
    def __init__(self, enabled: bool = True, limit: int | None = None) -> None:
        self.enabled = enabled
        self.entries: list[TraceEntry] = []
        self.limit = limit  # keep only the last `limit` entries in memory (hash covers all)
        self._hash = hashlib.blake2b(digest_size=16)
        self._hashed = 0
        self.count = 0

    def add(self, entry: TraceEntry) -> None:
        if not self.enabled:
            return
        self.count += 1
        self.entries.append(entry)
        if self.limit is not None and len(self.entries) > 2 * self.limit:
            self._absorb(len(self.entries) - self.limit)

    def _absorb(self, n: int) -> None:
        """Fold the oldest `n` entries into the running hash and forget them."""
        h = self._hash
        for e in self.entries[:n]:
            h.update(repr(e).encode())
            h.update(b"\n")
        self._hashed += n
        del self.entries[:n]

    def digest(self) -> str:
        h = self._hash.copy()
        for e in self.entries:
            h.update(repr(e).encode())
            h.update(b"\n")
        return h.hexdigest()

    def tail(self, n: int = 60) -> list[TraceEntry]:
        return self.entries[-n:]

    def lines(self, entries: Iterable[TraceEntry] | None = None) -> list[str]:
        return [format_entry(e) for e in (self.entries if entries is None else entries)]


def format_entry(e: TraceEntry) -> str:
    time_ms, kind, node, *details = e
    who = "" if node is None else f"n{node}"
    rest = " ".join(_fmt(d) for d in details)
    return f"{time_ms:>8}ms {who:>4} {kind:<18} {rest}"


def _fmt(v: Any) -> str:
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
        return f"{v[0]}={v[1]}"
    return str(v)
