"""Appending a benchmark run to its section of docs/benchmarks.md.

    from _doc import append_run   # bench scripts run from bench/ or by path
    append_run(DOC, "## cluster", intro, block)
"""

from __future__ import annotations

from pathlib import Path


def append_run(doc: Path, section: str, intro: str, block: str) -> None:
    """Add `block` (a '### run ...' entry) at the end of `section` (a '## ...' heading line),
    before the next '## ' section; a missing section is started at the end of the file with
    `intro` (which begins with the heading)."""
    text = doc.read_text() if doc.exists() else "# tidelog benchmarks\n"
    lines = text.splitlines(keepends=True)
    if section not in text.splitlines():
        text = text.rstrip("\n") + "\n\n" + intro + "\n" + block
    else:
        start = next(i for i, line in enumerate(lines) if line.rstrip("\n") == section)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        head = "".join(lines[:end]).rstrip("\n") + "\n\n" + block
        tail = "".join(lines[end:])
        text = head + ("\n" + tail if tail else "")
    doc.write_text(text)
