"""The broker runs the log cleaner: a compacted topic written with many duplicates is cleaned
in the background, and a consumer reading it from the beginning gets each key's latest value at
its original offset (the active segment, never cleaned, keeps its duplicates)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from harness import ActingController, BrokerThread, broker_props, fetch, produce

from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import Record, build_batch
from tidelog.protocol.records.decoder import decode_records
from tidelog.storage.cleaner.log_cleaner import CLEANER_OFFSET_CHECKPOINT

pytestmark = pytest.mark.integration


@pytest.fixture
def cleaning_broker(module_zk: str, tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[BrokerThread, ActingController]]:
    b = BrokerThread(broker_props(7, module_zk, tmp_path_factory.mktemp("b7"),
                                  **{"log.cleaner.backoff.ms": "50"})).start()
    ctl = ActingController(module_zk, [b])
    try:
        yield b, ctl
    finally:
        ctl.close()
        b.stop()


def read_all(port: int, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    out: list[tuple[int, bytes | None, bytes | None]] = []
    offset = 0
    for _ in range(1000):
        part = fetch(port, topic, 0, offset)
        assert part.error_code == 0
        batches = list(iter_batches(part.records)) if part.records else []
        if not batches:
            return out
        for batch in batches:
            out.extend((r.offset, r.key, r.value) for r in decode_records(batch)
                       if r.offset >= offset)
        offset = batches[-1].last_offset + 1
    raise AssertionError("the fetch loop did not reach the end")


def test_a_compacted_topic_is_cleaned_and_read_back_with_the_latest_value_per_key(
        cleaning_broker: tuple[BrokerThread, ActingController]) -> None:
    broker, controller = cleaning_broker
    controller.create_topic("compacted", {0: [7]}, config={
        "cleanup.policy": "compact", "segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01"})
    written: list[tuple[int, bytes, bytes]] = []
    for i in range(300):
        key, value = b"key-%d" % (i % 10), b"value-%d" % i
        error, offset = produce(broker.port, "compacted", 0,
                                build_batch([Record(value, key=key)]), acks=1)
        assert error == 0
        written.append((offset, key, value))
    latest = {k: (o, v) for o, k, v in written}
    log = broker.call(lambda: broker.server.log_manager.get_log("compacted", 0))
    active_base = broker.call(lambda: log.active_segment.base_offset)
    manager = broker.server.log_cleaner.manager
    deadline = time.monotonic() + 30
    while broker.call(manager.all_checkpoints).get(("compacted", 0), -1) < active_base:
        assert time.monotonic() < deadline, "the cleaner did not clean the topic in 30 s"
        time.sleep(0.05)
    got = read_all(broker.port, "compacted")
    # Every key's latest value, at its offset, in order; each record one that was written.
    assert {k: (o, v) for o, k, v in got} == latest
    assert [r[0] for r in got] == sorted(r[0] for r in got)
    assert set(got) <= set(written)
    # Below the active segment (all cleaned) a key appears once at most.
    cleaned_keys = [k for o, k, _ in got if o < active_base]
    assert len(cleaned_keys) == len(set(cleaned_keys)) <= 10
    assert broker.call(lambda: sum(s.size for s in log.segments[:-1])) < 2048
    with open(os.path.join(broker.config.log_dirs[0], CLEANER_OFFSET_CHECKPOINT)) as f:
        assert f"compacted 0 {active_base}" in f.read()


def test_an_unkeyed_record_in_a_compacted_topic_is_refused_with_invalid_record(
        cleaning_broker: tuple[BrokerThread, ActingController]) -> None:
    broker, controller = cleaning_broker
    controller.create_topic("needs-keys", {0: [7]}, config={"cleanup.policy": "compact,delete"})
    assert produce(broker.port, "needs-keys", 0, build_batch([Record(b"x")]), acks=1)[0] == 87
    assert produce(broker.port, "needs-keys", 0, build_batch([Record(b"x", key=b"k")]),
                   acks=1)[0] == 0
