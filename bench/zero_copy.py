"""Zero-copy fetches (#12 item 3): records sent with sendfile from the segment files against
the in-memory path (pread, copies, writelines), in the same run on the same data.

    .venv/bin/python bench/zero_copy.py [--mib 1024] [--follower-mib 512] [--rounds 3]
                                        [--new HEAD] [--baseline "HEAD without C1,C2"]
                                        [--no-write-doc] [--threshold-only]

A 2-broker local cluster holds three topics written once: `zc-1k` and `zc-100k` (1 KiB and
100 KiB records, `--mib` each, one partition on broker 1) and `zc-f` (`--follower-mib`, one
partition on [1, 2]). Each round restarts both brokers on one code (the `--new` revision or
the baseline revision, both exported and built by _baseline.py), alternating, then:

- a catch-up consumer (confluent-kafka, default fetch sizes) reads each consumer topic from
  offset 0 to the end: MB/s and broker 1's CPU seconds per MB read;
- a raw client fetches zc-100k at 64 KiB, 1 MiB and 8 MiB per fetch (batch headers only);
- follower catch-up: broker 2 stops, loses its copy of zc-f, starts again and fetches it all
  from broker 1: seconds until it is back in the ISR, and the leader's CPU over that time.

Medians over `--rounds` rounds of each code. The machine is shared: the load average is part
of every record. `--threshold-only`: the socket server alone, a slice against a copy per
answer size (where SENDFILE_MIN_BYTES comes from).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import confluent_kafka
from _baseline import baseline_source, tidelog_from
from _doc import append_run
from _machine import cpu_seconds, load_average, machine_description
from confluent_kafka.admin import AdminClient, NewTopic

from tidelog.cluster.local import LocalCluster
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.codec import decode_response, encode_request
from tidelog.protocol.messages.fetch import FetchPartition, FetchRequest, FetchTopic
from tidelog.protocol.records.batch import iter_batches

MIB = 1024 * 1024
DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
# The commits that added the sendfile path: the baseline is HEAD without them.
DEFAULT_BASELINE = "HEAD without 5b8171f,4ece585,1261f86,793a867"
CONSUMER_TOPICS = {"zc-1k": 1024, "zc-100k": 100 * 1024}
FOLLOWER_TOPIC = "zc-f"
# Fetches of the zc-100k topic by a raw client at these partition sizes (a consumer's default
# max.partition.fetch.bytes is 1 MiB; a replica's replica.fetch.max.bytes too).
RAW_FETCH_SIZES = (64 * 1024, 1024 * 1024, 8 * 1024 * 1024)


def produce(bootstrap: str, topic: str, size: int, total_bytes: int) -> int:
    """`total_bytes` of `size`-byte random records (incompressible); returns the count."""
    p = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 20, "batch.size": 1_000_000,
        "queue.buffering.max.kbytes": 512 * 1024, "message.max.bytes": 2_000_000,
    })
    payloads = [os.urandom(size) for _ in range(16)]
    n = max(1, total_bytes // size)
    for i in range(n):
        while True:
            try:
                p.produce(topic, payloads[i % 16], partition=0)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    if p.flush(300) != 0:
        raise RuntimeError(f"{topic}: records left unsent")
    return n


def consume_all(bootstrap: str, topic: str, expected: int) -> tuple[int, float]:
    """Read `topic` from offset 0 until `expected` records: (value bytes, seconds)."""
    c = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"zc-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False, "check.crcs": False,
    })
    try:
        start = time.perf_counter()
        c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        n = size = 0
        deadline = start + 600
        while n < expected and time.perf_counter() < deadline:
            for m in c.consume(10_000, timeout=0.5):
                if m.error() is None:
                    n += 1
                    size += len(m.value())
        if n < expected:
            raise RuntimeError(f"{topic}: {n} of {expected} records in 600 s")
        return size, time.perf_counter() - start
    finally:
        c.close()


def raw_fetch_all(address: str, topic: str, partition_max_bytes: int) -> tuple[int, float]:
    """Fetch `topic` from offset 0 to its end with plain Fetch v12 requests, one at a time,
    reading only batch headers (no record decoding: the client costs little, the broker's
    sending is what is measured): (record bytes, seconds)."""
    host, port = address.rsplit(":", 1)
    total = offset = corr = 0
    start = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        while True:
            corr += 1
            req = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=64 << 20,
                               topics=[FetchTopic(topic=topic, partitions=[FetchPartition(
                                   partition=0, fetch_offset=offset,
                                   partition_max_bytes=partition_max_bytes)])])
            s.sendall(b"".join(bytes(b) for b in encode_request(req, 12, corr)))
            head = s.recv(4, socket.MSG_WAITALL)
            frame = bytearray(struct.unpack(">i", head)[0])
            view = memoryview(frame)
            got = 0
            while got < len(frame):
                n = s.recv_into(view[got:])
                if not n:
                    raise ConnectionError("broker closed the connection")
                got += n
            _, resp = decode_response(ApiKey.FETCH, 12, frame)
            records = resp.responses[0].partitions[0].records
            if not records:
                return total, time.perf_counter() - start
            total += len(records)
            for batch in iter_batches(records):
                offset = batch.last_offset + 1


def threshold_table(rounds: int) -> str:
    """The socket server alone (its loop in a thread, uvloop when installed), answering one
    fetch at a time with N bytes of whole batches as a FileSlice or as a copy (the in-memory
    path: pread, then the replica manager's bytes()): the server thread's CPU per answer."""
    from tidelog.broker.socket_server import SocketServer
    from tidelog.cluster.zookeeper import pick_free_port
    from tidelog.protocol.messages import fetch as m_fetch
    from tidelog.protocol.records.builder import build_values
    from tidelog.storage.file_io import OsFileIO
    from tidelog.storage.log import Log
    from tidelog.storage.log_config import LogConfig

    work = Path(tempfile.mkdtemp(prefix="zc-threshold-"))
    log = Log(str(work / "t-0"), LogConfig.from_dict({}), OsFileIO())
    batch = build_values([os.urandom(4000)])  # ~4 KiB batches: any size in whole batches
    for _ in range(600):
        log.append_as_leader(batch, 0, 0)
    mode = {"slice": True, "size": 0}

    async def handler(ctx: object, request: object) -> object:
        if mode["slice"]:
            records = log.read_slice(0, mode["size"], min_slice_bytes=1).records
        else:
            records = bytes(log.read(0, mode["size"]).records)
        return m_fetch.FetchResponse(error_code=0, session_id=0, responses=[
            m_fetch.FetchableTopicResponse(topic="t", partitions=[m_fetch.PartitionData(
                partition_index=0, high_watermark=600, last_stable_offset=600,
                log_start_offset=0, records=records)])])

    try:
        import uvloop
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_loop(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)

    async def thread_cpu() -> float:
        return time.thread_time()

    server = SocketServer("127.0.0.1", pick_free_port(), handler)
    port = on_loop(server.start())
    sizes = [4, 8, 16, 32, 64, 128, 256, 1024]
    per_answer: dict[tuple[int, bool], list[float]] = {}
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:
            frame = b"".join(bytes(b) for b in encode_request(FetchRequest(topics=[]), 12, 1))
            buffer = bytearray(8 << 20)
            for _ in range(rounds):
                for kib in sizes:
                    for as_slice in (True, False):
                        mode.update(slice=as_slice, size=kib * 1024)
                        n = max(200, 40_000 // kib)
                        before = on_loop(thread_cpu())
                        for _ in range(n):
                            s.sendall(frame)
                            size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
                            view = memoryview(buffer)[:size]
                            while len(view):
                                view = view[s.recv_into(view):]
                        cpu = on_loop(thread_cpu()) - before
                        per_answer.setdefault((kib, as_slice), []).append(1e6 * cpu / n)
    finally:
        on_loop(server.shutdown(grace_s=0.2))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    rows = ["| records per answer | sendfile: server CPU µs per answer | copy | sendfile / copy |",
            "|---:|---:|---:|---:|"]
    for kib in sizes:
        a, b = med(per_answer[(kib, True)]), med(per_answer[(kib, False)])
        rows.append(f"| {kib} KiB | {a:.0f} | {b:.0f} | {a / b:.2f} |")
    return "\n".join(rows)


def isr(bootstrap: str, topic: str) -> list[int]:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return sorted(md.topics[topic].partitions[0].isrs)


@dataclass
class Rounds:
    consume_mb_s: dict[str, list[float]] = field(default_factory=dict)
    consume_cpu_ms_per_mb: dict[str, list[float]] = field(default_factory=dict)
    catch_up_s: list[float] = field(default_factory=list)
    leader_cpu_ms_per_mb: list[float] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)


def restart(cluster: LocalCluster, src: Path | None) -> None:
    for broker_id in sorted(cluster.brokers, reverse=True):
        cluster.stop_broker(broker_id)
    with tidelog_from(src):
        for broker_id in sorted(cluster.brokers):
            cluster.start_broker(broker_id, timeout_s=120)


def wait_for(condition: object, what: str, timeout_s: float = 300) -> float:
    start = time.monotonic()
    while not condition():  # type: ignore[operator]
        if time.monotonic() - start > timeout_s:
            raise RuntimeError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - start


def one_round(cluster: LocalCluster, src: Path | None, counts: dict[str, int],
              follower_bytes: int, out: Rounds) -> None:
    restart(cluster, src)
    bootstrap = cluster.bootstrap_servers
    wait_for(lambda: isr(bootstrap, FOLLOWER_TOPIC) == [1, 2], "zc-f ISR after the restart")
    leader = cluster.brokers[1]
    out.loads.append(load_average())
    for topic, expected in counts.items():
        before = cpu_seconds(leader.pid or 0)
        size, seconds = consume_all(bootstrap, topic, expected)
        cpu = cpu_seconds(leader.pid or 0) - before
        key = f"consumer catch-up {topic}"
        out.consume_mb_s.setdefault(key, []).append(size / MIB / seconds)
        out.consume_cpu_ms_per_mb.setdefault(key, []).append(1000 * cpu / (size / MIB))
    for max_bytes in RAW_FETCH_SIZES:
        before = cpu_seconds(leader.pid or 0)
        size, seconds = raw_fetch_all(leader.address, "zc-100k", max_bytes)
        cpu = cpu_seconds(leader.pid or 0) - before
        key = f"raw fetches of zc-100k, {max_bytes // 1024} KiB each"
        out.consume_mb_s.setdefault(key, []).append(size / MIB / seconds)
        out.consume_cpu_ms_per_mb.setdefault(key, []).append(1000 * cpu / (size / MIB))
    # Follower catch-up: broker 2 comes back without its copy of zc-f.
    cluster.stop_broker(2)
    wait_for(lambda: isr(bootstrap, FOLLOWER_TOPIC) == [1], "broker 2 out of the zc-f ISR")
    shutil.rmtree(Path(cluster.brokers[2].log_dir) / f"{FOLLOWER_TOPIC}-0")
    before = cpu_seconds(leader.pid or 0)
    start = time.monotonic()
    with tidelog_from(src):
        cluster.start_broker(2, timeout_s=120)
    wait_for(lambda: isr(bootstrap, FOLLOWER_TOPIC) == [1, 2], "broker 2 back in the zc-f ISR")
    out.catch_up_s.append(time.monotonic() - start)
    out.leader_cpu_ms_per_mb.append(
        1000 * (cpu_seconds(leader.pid or 0) - before) / (follower_bytes / MIB))


def med(values: list[float]) -> float:
    return statistics.median(values)


def table(new: Rounds, old: Rounds) -> str:
    rows = ["| workload | sendfile | in-memory (baseline) | ratio |", "|---|---:|---:|---:|"]
    for topic in new.consume_mb_s:
        a, b = med(new.consume_mb_s[topic]), med(old.consume_mb_s[topic])
        rows.append(f"| {topic}: MB/s | {a:,.0f} | {b:,.0f} | {a / b:.2f}x |")
        a = med(new.consume_cpu_ms_per_mb[topic])
        b = med(old.consume_cpu_ms_per_mb[topic])
        rows.append(f"| {topic}: broker CPU ms per MB | {a:.2f} | {b:.2f} "
                    f"| {a / b:.2f}x |")
    a, b = med(new.catch_up_s), med(old.catch_up_s)
    rows.append(f"| follower catch-up {FOLLOWER_TOPIC}: seconds to the ISR | {a:.1f} | {b:.1f} "
                f"| {a / b:.2f}x |")
    a, b = med(new.leader_cpu_ms_per_mb), med(old.leader_cpu_ms_per_mb)
    rows.append(f"| follower catch-up {FOLLOWER_TOPIC}: leader CPU ms per MB | {a:.2f} | {b:.2f} "
                f"| {a / b:.2f}x |")
    return "\n".join(rows)


def raw(new: Rounds, old: Rounds) -> str:
    def fmt(values: list[float]) -> str:
        return ", ".join(f"{v:.1f}" for v in values)

    lines = []
    for name, rounds in (("sendfile", new), ("in-memory", old)):
        lines.append(f"- {name}: " + "; ".join(
            [f"{t} MB/s {fmt(rounds.consume_mb_s[t])}, CPU ms/MB "
             f"{fmt(rounds.consume_cpu_ms_per_mb[t])}" for t in rounds.consume_mb_s]
            + [f"catch-up s {fmt(rounds.catch_up_s)}, leader CPU ms/MB "
               f"{fmt(rounds.leader_cpu_ms_per_mb)}", f"load {' / '.join(rounds.loads)}"]))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="MiB per consumer topic")
    ap.add_argument("--follower-mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=DEFAULT_BASELINE)
    ap.add_argument("--new", default="HEAD",
                    help="the revision with the sendfile path (exported: other work in the "
                         "tree stays out of the comparison)")
    ap.add_argument("--no-write-doc", action="store_true")
    ap.add_argument("--threshold-only", action="store_true",
                    help="only the in-process sendfile-or-copy threshold table")
    args = ap.parse_args()
    if args.threshold_only:
        print(f"load {load_average()}")
        print(threshold_table(max(3, args.rounds)))
        print(f"load {load_average()}")
        return 0

    work = Path(tempfile.mkdtemp(prefix="zc-bench-"))
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = machine_description(str(work))
    src = baseline_source(args.baseline, work / "baseline")
    new_src = baseline_source(args.new, work / "new")
    cluster = LocalCluster(work / "cluster", die_with_parent=True)
    try:
        with tidelog_from(new_src):
            cluster.up(2, {"num.partitions": "1", "offsets.topic.replication.factor": "1",
                           "message.max.bytes": "2000000", "replica.lag.time.max.ms": "10000"},
                       timeout_s=120)
        bootstrap = cluster.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = [NewTopic(t, num_partitions=1, replica_assignment=[[1]]) for t in CONSUMER_TOPICS]
        topics.append(NewTopic(FOLLOWER_TOPIC, num_partitions=1, replica_assignment=[[1, 2]]))
        for f in admin.create_topics(topics, operation_timeout=30).values():
            f.result(timeout=60)
        counts = {}
        for topic, size in CONSUMER_TOPICS.items():
            t0 = time.perf_counter()
            counts[topic] = produce(bootstrap, topic, size, args.mib * MIB)
            print(f"produced {args.mib} MiB to {topic} in {time.perf_counter() - t0:.0f} s",
                  flush=True)
        produce(bootstrap, FOLLOWER_TOPIC, 100 * 1024, args.follower_mib * MIB)
        follower_bytes = args.follower_mib * MIB
        new, old = Rounds(), Rounds()
        for r in range(args.rounds):
            for name, code, out in (("sendfile", new_src, new), ("in-memory", src, old)):
                one_round(cluster, code, counts, follower_bytes, out)
                print(f"round {r + 1} {name}: "
                      + ", ".join(f"{t} {out.consume_mb_s[t][-1]:.0f} MB/s "
                                  f"{out.consume_cpu_ms_per_mb[t][-1]:.2f} ms/MB"
                                  for t in out.consume_mb_s)
                      + f", catch-up {out.catch_up_s[-1]:.1f} s "
                        f"{out.leader_cpu_ms_per_mb[-1]:.2f} ms/MB, load {out.loads[-1]}",
                      flush=True)
    finally:
        cluster.down()
        shutil.rmtree(work, ignore_errors=True)

    body = table(new, old)
    print(body)
    print(raw(new, old))
    if not args.no_write_doc:
        command = "bench/zero_copy.py " + " ".join(sys.argv[1:])
        intro = ("## zero-copy fetch\n\nbench/zero_copy.py: a catch-up consumer and a catch-up "
                 "follower read the same segments with the sendfile path (this tree) and the "
                 "in-memory path (the baseline revision), alternating round by round in one "
                 "run; medians of the rounds. CPU is the serving broker's (user + system).\n")
        block = (f"### run {started}\n\n`{command}` ({args.mib} MiB per consumer topic, "
                 f"{args.follower_mib} MiB follower topic, {args.rounds} rounds each, "
                 f"`{args.new}` against the baseline `{args.baseline}`)\n\n{machine}\n\n"
                 f"{body}\n\n{raw(new, old)}\n")
        append_run(DOC, "## zero-copy fetch", intro, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
