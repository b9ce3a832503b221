#!/usr/bin/env python3
"""Protocol codec benchmark: tidelog's generated codecs next to kio, in the same run.

Messages: a Produce request and a Fetch response with 10 partitions of 16 KiB and of 100 B of
record data, at a flexible version (Produce v9, Fetch v12) and a non-flexible one (Produce v7,
Fetch v11). tidelog encodes into a list of buffers (what the broker hands to ``writelines``;
record data is not copied); kio encodes into a BytesIO. Decoding reads the body from bytes.

Goals (issue 3): decoding at least as fast as kio, encoding responses at least 5x faster.
Prints a table and, with ``--write``, replaces the "## protocol" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from tidelog.protocol.messages import fetch, produce  # noqa: E402

PARTITIONS = 10


def produce_request(size: int) -> produce.ProduceRequest:
    return produce.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=30000,
        topic_data=[
            produce.TopicProduceData(
                "bench-topic",
                [produce.PartitionProduceData(i, bytes([i]) * size) for i in range(PARTITIONS)],
            )
        ],
    )


def fetch_response(size: int) -> fetch.FetchResponse:
    return fetch.FetchResponse(
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[
            fetch.FetchableTopicResponse(
                topic="bench-topic",
                partitions=[
                    fetch.PartitionData(
                        partition_index=i,
                        error_code=0,
                        high_watermark=1000 + i,
                        last_stable_offset=1000 + i,
                        log_start_offset=0,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        records=bytes([i]) * size,
                    )
                    for i in range(PARTITIONS)
                ],
            )
        ],
    )


def calibrate(fn: Callable[[], Any], min_time: float = 0.2) -> int:
    """How many calls of ``fn`` take at least ``min_time`` seconds."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return number
        number *= 2 if elapsed == 0 else max(2, min(10, int(min_time / elapsed) + 1))


def best_rates(fns: dict[str, Callable[[], Any]], rounds: int = 5) -> dict[str, float]:
    """ops/s of each function, the best of ``rounds`` batches; the functions take turns in
    every round, so that a burst of load from other jobs hits tidelog and kio alike instead of
    whichever happened to be measured at the time."""
    numbers = {name: calibrate(fn) for name, fn in fns.items()}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            number = numbers[name]
            start = time.perf_counter()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / number)
    return {name: 1.0 / t for name, t in best.items()}


def kio_pair(
    api: str, version: int, kind: str
) -> tuple[Callable[[Any], bytes], Callable[[bytes], Any], type]:
    from kio.index import load_entity_module
    from kio.serial import entity_reader, entity_writer
    from kio.static.constants import EntityType

    entity = EntityType.request if kind == "request" else EntityType.response
    module = load_entity_module(api, version, entity)
    cls = getattr(module, "ProduceRequest" if api == "produce" else "FetchResponse")
    writer = entity_writer(cls)
    reader = entity_reader(cls)

    def encode(obj: Any) -> bytes:
        buf = io.BytesIO()
        writer(buf, obj)
        return buf.getvalue()

    return encode, (lambda data: reader(data, 0)), cls


def run() -> list[dict[str, Any]]:
    rows = []
    cases = [
        ("Produce request", produce, "request", produce_request, (9, 7)),
        ("Fetch response", fetch, "response", fetch_response, (12, 11)),
    ]
    for title, module, kind, build, versions in cases:
        for version in versions:
            for size in (16384, 100):
                message = build(size)
                encode = getattr(module, f"encode_{kind}")
                decode = getattr(module, f"decode_{kind}")
                py_decode = getattr(module, f"py_decode_{kind}")
                wire = b"".join(encode(version, message))
                k_encode, k_decode, _ = kio_pair(module.API_NAME, version, kind)
                k_message = k_decode(wire)[0]
                assert k_encode(k_message) == wire, "kio and tidelog disagree on the bytes"
                row: dict[str, Any] = {
                    "message": f"{title} v{version}",
                    "records": f"{PARTITIONS} x {size // 1024} KiB"
                    if size >= 1024
                    else f"{PARTITIONS} x {size} B",
                    "bytes": len(wire),
                }
                row |= best_rates(
                    {
                        "enc_tidelog": lambda m=message, v=version, e=encode: e(v, m),
                        "enc_tidelog_joined": (
                            lambda m=message, v=version, e=encode: b"".join(e(v, m))
                        ),
                        "enc_kio": lambda m=k_message, e=k_encode: e(m),
                        "dec_tidelog": lambda w=wire, v=version, d=decode: d(v, w),
                        "dec_kio": lambda w=wire, d=k_decode: d(w),
                        # the pure-Python twin (the fallback without the C extension)
                        "dec_tidelog_py": lambda w=wire, v=version, d=py_decode: d(v, w),
                    }
                )
                rows.append(row)
    return rows


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))  # type: ignore[union-attr]
        ram = f"{mem_kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, AttributeError):
        ram = "unknown RAM"
    kio_version = subprocess.run(
        [sys.executable, "-c", "import kio; print(kio.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} CPUs (nproc), {cpu}, {ram}, Python {platform.python_version()}, "
        f"kio {kio_version}; load average {load} (machine shared with other jobs)"
    )


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| message | records | bytes | encode tidelog (ops/s) | encode tidelog + join | encode kio | enc x | decode tidelog | decode kio | dec x | decode tidelog, pure Python | py x |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['message']} | {r['records']} | {r['bytes']} | {r['enc_tidelog']:,.0f} | "
            f"{r['enc_tidelog_joined']:,.0f} | {r['enc_kio']:,.0f} | "
            f"{r['enc_tidelog'] / r['enc_kio']:.1f} | {r['dec_tidelog']:,.0f} | "
            f"{r['dec_kio']:,.0f} | {r['dec_tidelog'] / r['dec_kio']:.2f} | "
            f"{r['dec_tidelog_py']:,.0f} | {r['dec_tidelog_py'] / r['dec_kio']:.2f} |"
        )
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]]) -> str:
    enc = [r["enc_tidelog"] / r["enc_kio"] for r in rows if "response" in r["message"]]
    dec = [r["dec_tidelog"] / r["dec_kio"] for r in rows]
    py = [r["dec_tidelog_py"] / r["dec_kio"] for r in rows]
    enc_ok = "met" if min(enc) >= 5 else "not met"
    dec_ok = "met" if min(dec) >= 1 else "not met"
    below = [r["message"] + ", " + r["records"] for r in rows if r["dec_tidelog"] < r["dec_kio"]]
    if produce.NATIVE:
        how = (
            "tidelog decodes with its C extension (tidelog.protocol._native_decoder, "
            "interpreting the generator's per-version programs), kio 0.6.5 with its native "
            "`_kio_native` extension"
        )
    else:
        how = (
            "tidelog decodes with its generated pure-Python decoders (the C extension is not "
            "built, or TIDELOG_PURE_PYTHON=1), kio 0.6.5 with its native `_kio_native` extension"
        )
    return (
        f"Encoding responses: {min(enc):.1f}x to {max(enc):.1f}x kio (goal >= 5x: {enc_ok}). "
        f"Decoding: {min(dec):.2f}x to {max(dec):.2f}x kio (goal >= 1x: {dec_ok}"
        + (f"; below 1x: {'; '.join(below)}" if below else "; every row")
        + f"). {how}. The pure-Python decoders (py_decode_*, the fallback) reach "
        f"{min(py):.2f}x to {max(py):.2f}x kio. tidelog returns record data as memoryview slices of the frame where kio "
        "copies it into bytes, which is why the 16 KiB rows are far ahead and the 100 B rows, "
        "where both build the same number of objects, are closest."
    )


def write_section(text: str) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    path.parent.mkdir(exist_ok=True)
    doc = path.read_text() if path.exists() else "# tidelog benchmarks\n"
    section = f"## protocol\n\n{text}\n"
    pattern = re.compile(r"^## protocol\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(doc):
        doc = pattern.sub(lambda _: section + "\n", doc).rstrip() + "\n"
    else:
        doc = doc.rstrip() + "\n\n" + section
    path.write_text(doc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    rows = run()
    text = table(rows)
    print(text)
    if args.write:
        when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        write_section(
            "`bench/protocol.py`: body encode/decode of a Produce request and a Fetch response "
            "with 10 partitions of record data; tidelog's generated codecs next to kio in the "
            'same process. "encode tidelog" is the list of buffers handed to `writelines` '
            '(record data uncopied); "+ join" adds one `b\'\'.join`. "decode tidelog" is '
            "`decode_request`/`decode_response` (native when the C extension is built), "
            '"pure Python" their generated Python twins. x = tidelog / kio. Each rate is the '
            "best of 5 batches of >= 0.2 s, the six functions of a row taking turns.\n\n"
            f"Run {when} on {machine()}.\n\n{text}\n\n{verdict(rows)}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
