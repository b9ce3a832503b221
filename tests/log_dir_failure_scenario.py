"""One scenario, run against tidelog (tests/broker/test_log_dir_failure_broker.py) and Apache
Kafka 3.9 (tests/interop/test_log_dir_failure_kafka.py): broker 1 of two, each with two log dirs,
loses the log dir holding its replica of partition 0 while clients produce and consume.

Topic `jbod`: partitions 0 and 1 led by broker 1, 2 and 3 by broker 2, every one on both.
What a client and an operator must see (Kafka's JBOD handling in ZooKeeper mode): every
acknowledged record is read back; the failed dir's replicas lose their leaderships and ISR
places; the other dir's partitions are untouched; the notification is handled and deleted;
Metadata v5+ lists broker 1 in the failed replicas' offline_replicas; DescribeLogDirs answers the
dir with KAFKA_STORAGE_ERROR."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
from waiting import wait_until

from tidelog.client.connection import BrokerConnection
from tidelog.controller.admin import AdminZkClient
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.protocol.messages import describe_log_dirs as m_dld
from tidelog.protocol.messages import metadata as m_md

TOPIC = "jbod"
KAFKA_STORAGE_ERROR = 56


@dataclass
class Outcome:
    failing_dir: str
    on_failing: list[int]
    elsewhere: list[int]
    leaders_moved_s: float  # from the dir's failure until ZooKeeper shows the new leaders
    produce_s: float  # the records produced during the failure, until all acknowledged


def mount_tmpfs(path: str, size: str = "8m") -> str | None:
    """A small tmpfs at `path` (made if missing); the reason when mounting is not allowed."""
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


def unmount(path: str) -> None:
    if subprocess.run(["umount", path], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", path], capture_output=True)


def fill(log_dir: str) -> None:
    """A real full disk: fill the filesystem of `log_dir`; the broker's next write needing a
    new page fails with ENOSPC."""
    with open(os.path.join(log_dir, "filler"), "wb") as f:
        try:
            for _ in range(1024):
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
        else:
            raise AssertionError(f"{log_dir} did not fill up")


def _send(port: int, req: Any, version: int) -> Any:
    async def go() -> Any:
        conn = BrokerConnection("127.0.0.1", port, request_timeout_ms=15000)
        await conn.connect()
        try:
            return await conn.send(req, version)
        finally:
            await conn.close()
    return asyncio.run(go())


def _produce(bootstrap: str, partitions: list[int], n: int, tag: str) -> float:
    """acks=all with the client's retries (KAFKA_STORAGE_ERROR is retriable); the seconds until
    every record was acknowledged."""
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "message.timeout.ms": 60000, "retry.backoff.ms": 100,
                                  "topic.metadata.refresh.interval.ms": 1000})
    errors: list[Any] = []
    start = time.monotonic()
    for part in partitions:
        for i in range(n):
            p.produce(TOPIC, f"{tag}-{part}-{i}".encode() + b"." * 100, partition=part,
                      on_delivery=lambda err, _m: errors.append(err) if err else None)
    assert p.flush(90) == 0 and errors == []
    return time.monotonic() - start


def produce_once(bootstrap: str, topic: str) -> Any:
    """One record, acks=all, no retry: the delivery error, None if it was acknowledged."""
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all", "retries": 0,
                                  "message.timeout.ms": 10000})
    errors: list[Any] = []
    p.produce(topic, b"x", partition=0, on_delivery=lambda err, _m: errors.append(err))
    p.flush(15)
    return errors[0] if errors else "not answered"


def _consume(bootstrap: str, partition: int, expect: int) -> list[str]:
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"g{partition}",
                                  "enable.auto.commit": False})
    c.assign([confluent_kafka.TopicPartition(TOPIC, partition, 0)])
    out: list[str] = []
    deadline = time.monotonic() + 30
    try:
        while len(out) < expect and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                out.append(m.value().decode().rstrip("."))
    finally:
        c.close()
    return out


def run(zk: KafkaZkClient, ports: dict[int, int], dirs: list[str],
        break_dir: Callable[[str], None], n: int = 50) -> Outcome:
    """The scenario; `ports`: broker id -> port, `dirs`: broker 1's log dirs, `break_dir(d)`
    makes d fail."""
    bootstrap = ",".join(f"127.0.0.1:{p}" for p in ports.values())
    AdminZkClient(zk).create_topic(
        TOPIC, 0, 0, replica_assignment={0: [1, 2], 1: [1, 2], 2: [2, 1], 3: [2, 1]})
    for p in range(4):
        wait_until(lambda p=p: (s := zk.get_partition_state((TOPIC, p))) and len(s.isr) == 2,
                   timeout_s=60, what=f"{TOPIC}-{p} with a full ISR")
    _produce(bootstrap, [0, 1, 2, 3], n, "before")
    dir_of = {p: d for d in dirs for p in range(4) if Path(d, f"{TOPIC}-{p}").is_dir()}
    failing = dir_of[0]
    on_failing = sorted(p for p, d in dir_of.items() if d == failing)
    elsewhere = sorted(p for p, d in dir_of.items() if d != failing)
    assert 1 in elsewhere, dir_of

    failed_at = time.monotonic()
    break_dir(failing)
    took = _produce(bootstrap, [0, 1, 2, 3], n, "after")
    for p in on_failing:
        s = wait_until(lambda p=p: (s := zk.get_partition_state((TOPIC, p))) and s.isr == (2,)
                       and s, timeout_s=60, what=f"{TOPIC}-{p} without broker 1")
        assert s.leader == 2
    moved = time.monotonic() - failed_at
    for p in elsewhere:
        s = zk.get_partition_state((TOPIC, p))
        assert sorted(s.isr) == [1, 2] and s.leader == (1 if p < 2 else 2), (p, s)
    wait_until(lambda: zk.get_all_log_dir_event_notifications() == [], timeout_s=60,
               what="the log dir event handled and deleted")
    for p in range(4):
        got = _consume(f"127.0.0.1:{ports[2]}", p, 2 * n)
        assert got == [f"{tag}-{p}-{i}" for tag in ("before", "after") for i in range(n)], p

    def offline() -> dict[int, list[int]]:
        md = _send(ports[2], m_md.MetadataRequest(
            topics=[m_md.MetadataRequestTopic(name=TOPIC)]), 9)
        return {p.partition_index: p.offline_replicas for p in md.topics[0].partitions}
    want = {p: [1] if p in on_failing else [] for p in range(4)}
    wait_until(lambda: offline() == want, timeout_s=60, what=f"metadata offline replicas {want}")
    logs = _send(ports[1], m_dld.DescribeLogDirsRequest(topics=None), 4)
    got = {os.path.realpath(r.log_dir): r.error_code for r in logs.results}
    assert got == {os.path.realpath(d): KAFKA_STORAGE_ERROR if d == failing else 0
                   for d in dirs}
    return Outcome(failing, on_failing, elsewhere, moved, took)
