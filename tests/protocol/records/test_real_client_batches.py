"""Batches written by real clients (the kafka-python and aiokafka builders; librdkafka via
confluent-kafka, captured off the wire by tools/capture_record_fixtures.py) parse, validate and
decode to exactly the records the tool gave the client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tidelog.protocol.records import (
    RecordBatch,
    complete_batches_size,
    decode_columns,
    decode_records,
    iter_batches,
)
from tidelog.protocol.records.compression import CODECS_BY_NAME, XERIAL_MAGIC

FIXTURES = Path(__file__).parents[2] / "fixtures" / "records"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text())
ENTRIES: list[dict[str, Any]] = MANIFEST["fixtures"]


def _unhex(value: str | None) -> bytes | None:
    return None if value is None else bytes.fromhex(value)


EXPECTED = [
    (
        _unhex(r["key"]),
        _unhex(r["value"]),
        tuple((k, _unhex(v)) for k, v in r["headers"]),
        r["timestamp"],
    )
    for r in MANIFEST["records"]
]


def _batches(entry: dict[str, Any]) -> list[RecordBatch]:
    data = (FIXTURES / entry["file"]).read_bytes()
    assert complete_batches_size(data) == len(data), "the file is whole batches, nothing else"
    return list(iter_batches(data))


def test_every_client_and_codec_is_covered() -> None:
    covered = {(e["client"], e["codec"]) for e in ENTRIES}
    for client in ("kafka-python", "aiokafka", "confluent-kafka"):
        for codec in CODECS_BY_NAME:
            assert (client, codec) in covered


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_fixture_parses_validates_and_decodes_to_what_was_produced(entry: dict[str, Any]) -> None:
    batches = _batches(entry)
    assert batches
    decoded = []
    for batch in batches:
        batch.ensure_valid()
        assert batch.compression_type == CODECS_BY_NAME[entry["codec"]]
        assert not batch.is_control_batch
        decoded += decode_records(batch)
    assert [(r.key, r.value, r.headers, r.timestamp) for r in decoded] == EXPECTED
    # Clients number a produce request's records from offset 0; the broker assigns real ones.
    assert [r.offset for r in decoded] == list(range(len(EXPECTED)))
    assert sum(b.record_count for b in batches) == len(EXPECTED)
    assert max(b.max_timestamp for b in batches) == max(r[3] for r in EXPECTED)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_producer_fields_match_the_producer_configuration(entry: dict[str, Any]) -> None:
    producer = entry["producer"]
    for batch in _batches(entry):
        if "producer_id" in producer:  # kafka-python: set explicitly
            assert batch.producer_id == producer["producer_id"]
            assert batch.producer_epoch == producer["producer_epoch"]
            assert batch.base_sequence == producer["base_sequence"]
        elif producer.get("idempotent") or producer.get("transactional_id"):  # from the broker
            assert batch.has_producer_id and batch.producer_epoch >= 0 and batch.has_sequence
        else:
            assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (-1, -1, -1)
        transactional = bool(producer.get("transactional") or producer.get("transactional_id"))
        assert batch.is_transactional is transactional


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_in_place_offset_assignment_keeps_client_batches_valid(entry: dict[str, Any]) -> None:
    data = bytearray((FIXTURES / entry["file"]).read_bytes())
    next_offset = 1_000
    for batch in iter_batches(memoryview(data)):
        batch.set_base_offset(next_offset)
        batch.set_partition_leader_epoch(3)
        next_offset = batch.next_offset
    offsets = []
    for batch in iter_batches(data):
        batch.ensure_valid()
        assert batch.partition_leader_epoch == 3
        offsets += decode_columns(batch).offsets
    assert offsets == list(range(1_000, 1_000 + len(EXPECTED)))


def test_snappy_framing_differs_by_client_and_both_are_read() -> None:
    """kafka-python writes xerial framing (like the Java client); librdkafka a raw block."""
    by_file = {e["file"]: e for e in ENTRIES}
    kafka_python = _batches(by_file["kafka-python-snappy.bin"])[0]
    librdkafka = _batches(by_file["confluent-kafka-snappy.bin"])[0]
    assert bytes(kafka_python.records_data[:8]) == XERIAL_MAGIC
    assert bytes(librdkafka.records_data[:8]) != XERIAL_MAGIC
