"""A real application that needs a compacted topic: a Kafka Streams 3.9.1 KTable
(interop/src/main/java/tidelog/interop/KTableApp.java) counting records per key, its state in the
changelog topic Streams creates with cleanup.policy=compact. Against Kafka and tidelog alike:
the table holds the right counts, the changelog is compacted by the broker's cleaner (fewer
records than offsets, the latest count of each key kept), and the application started again
with no local state restores the same table from that compacted changelog."""

from __future__ import annotations

import struct
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import ConfigResource
from differential import Pair, Target, create_ready, outcome

from tidelog.testing.kafka_cluster import kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tidelog.interop.KTableApp"
KEYS = [f"key-{i:02d}" for i in range(20)]
UPDATES_PER_KEY = 30


def run_app(t: Target, app_id: str, state_dir: Path, total: int) -> list[str]:
    r = kafka_tool(APP, t.bootstrap, app_id, "streams-in", "streams-out", str(state_dir),
                   str(total), timeout_s=240, heap_mb=384)
    assert r.returncode == 0, f"{t.name}: {r.stderr[-3000:]}"
    return r.stdout.splitlines()


def read_all(t: Target, topic: str, partitions: int) -> tuple[int, int, dict[str, int]]:
    """The whole topic from the beginning: (records read, offsets spanned, latest value per
    key, values as Streams' Long serde writes them)."""
    c = t.consumer()
    try:
        spanned = 0
        ends: dict[int, int] = {}
        for p in range(partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            spanned += high - low
            if high > low:
                ends[p] = high
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        latest: dict[str, int] = {}
        read = 0
        deadline = time.monotonic() + 60
        while ends:
            assert time.monotonic() < deadline, f"{topic}: not read to its end in time"
            msg = c.poll(1.0)
            if msg is None or msg.error() is not None:
                continue
            read += 1
            latest[msg.key().decode()] = struct.unpack(">q", msg.value())[0]
            if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                ends.pop(msg.partition(), None)
        return read, spanned, latest
    finally:
        c.close()


def test_a_kafka_streams_ktable_on_a_compacted_changelog(pair: Pair, tmp_path: Path) -> None:
    expected = {k: UPDATES_PER_KEY for k in KEYS}
    total = len(KEYS) * UPDATES_PER_KEY

    def scenario(t: Target) -> object:
        app_id = f"ktable-{uuid.uuid4().hex[:6]}"
        changelog = f"{app_id}-counts-changelog"
        create_ready(t, "streams-in", 3, 3)
        create_ready(t, "streams-out", 3, 3)
        producer = t.producer(acks="all")
        for _ in range(UPDATES_PER_KEY):
            for k in KEYS:
                producer.produce("streams-in", key=k.encode(), value=b"x")
        assert producer.flush(60) == 0

        table = run_app(t, app_id, tmp_path / t.name / "first", total)
        admin = t.admin()
        res = ConfigResource("topic", changelog)
        policy = outcome(admin.describe_configs([res])[res])["cleanup.policy"].value
        # Every update of a count went to the changelog; the cleaner keeps the latest per key.
        deadline = time.monotonic() + 90
        while True:
            read, spanned, latest = read_all(t, changelog, 3)
            if read < spanned or time.monotonic() > deadline:
                break
            time.sleep(1)
        restored = run_app(t, app_id, tmp_path / t.name / "restored", total)
        return {"table": table, "changelog policy": policy, "changelog spans": spanned,
                "compacted": read < spanned, "changelog latest": latest, "restored": restored}

    got = pair.same(scenario)
    assert got["table"] == [f"{k}={n}" for k, n in sorted(expected.items())]
    assert got["changelog policy"] == "compact"
    assert got["changelog spans"] == total and got["compacted"]
    assert got["changelog latest"] == expected
    assert got["restored"] == got["table"]
