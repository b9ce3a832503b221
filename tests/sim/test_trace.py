"""The trace: cheap tuples, formatted lazily, hashed for replay comparison."""

from __future__ import annotations

from tidelog.sim.trace import Trace, format_entry


def test_digest_covers_entries_folded_out_of_memory():
    a, b = Trace(limit=5), Trace()
    for i in range(100):
        a.add((i, "append", 1, ("offset", i)))
        b.add((i, "append", 1, ("offset", i)))
    assert len(a.entries) <= 10 and a.digest() == b.digest()
    b.add((100, "append", 1, ("offset", 100)))
    assert a.digest() != b.digest()


def test_entries_format_as_readable_lines():
    line = format_entry((1234, "elect", None, "t-0", ("leader", 2), ("epoch", 3)))
    assert "1234ms" in line and "elect" in line and "leader=2 epoch=3" in line
