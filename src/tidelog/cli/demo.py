"""`tidelog demo`: what `make demo` runs — a live 3-broker cluster losing a leader to kill -9.

The story, on real processes (a private ZooKeeper and broker processes under `--dir`):

1. `cluster up` with a small `replica.lag.time.max.ms`, topic `demo` with RF=3 and
   `min.insync.replicas=2`;
2. tidelog's idempotent producer (acks=all) writes a steady, numbered stream round-robin over
   the partitions;
3. the leader of partition 0 is killed with SIGKILL: the leaders of the other partitions drop it
   from their ISR after `replica.lag.time.max.ms` (the `isr-expiration` task), and once its
   ZooKeeper session expires the controller elects a new leader for partition 0 from the ISR
   with a higher leader epoch; the producer's writes to partition 0 wait and are retried;
4. the killed broker is started again: it truncates its log of partition 0 to where its last
   leader epoch ended on the new leader (uncommitted records, never acknowledged, go), catches
   up and rejoins every ISR;
5. everything is consumed back and compared with what was acknowledged: every acked record at
   its offset, no record twice. The exit status is 0 only if that holds.

Every wait is bounded; the cluster is stopped at the end (also on Ctrl-C, SIGTERM or an error)
unless `--keep`. `--storage-only` runs the earlier offline walk-through of the storage engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from tidelog.client.cluster import KafkaClient
    from tidelog.cluster.local import LocalCluster
    from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch

DEFAULT_DIR = "demo-data"
TOPIC = "demo"
MARKER = ".tidelog-demo"  # only a dir carrying it (or an empty one) is ever wiped
SESSION_TIMEOUT_MS = 6000

PartitionStates = dict[int, "LeaderIsrAndControllerEpoch"]


class DemoError(RuntimeError):
    """A step of the demo did not happen within its bound."""


# -- small pieces ------------------------------------------------------------------------------


def on_disk_log_end_offset(partition_dir: Path) -> int | None:
    """The log end offset of a partition directory as its segment files hold it, read without
    opening the log (no recovery, nothing written): the last complete batch of the newest
    segment. None if there is no segment."""
    segments = sorted(partition_dir.glob("*.log"), key=lambda p: int(p.stem))
    if not segments:
        return None
    data = segments[-1].read_bytes()
    leo = int(segments[-1].stem)
    pos = 0
    # Batch framing: base_offset int64, batch_length int32, ..., last_offset_delta int32 at 23.
    while pos + 27 <= len(data):
        base_offset, batch_length = struct.unpack_from(">qi", data, pos)
        if batch_length < 49 or pos + 12 + batch_length > len(data):
            break  # a torn or zeroed tail: recovery would cut it off too
        (last_delta,) = struct.unpack_from(">i", data, pos + 23)
        leo = base_offset + last_delta + 1
        pos += 12 + batch_length
    return leo


def _isr(s: LeaderIsrAndControllerEpoch | None) -> str:
    return ",".join(map(str, s.isr)) if s is not None else "?"


@dataclass
class Stream:
    """What the producer sent and what was acknowledged, per record number."""

    partitions: int
    sent: int = 0
    acked: list[tuple[int, int, int]] = field(default_factory=list)  # (partition, offset, i)
    failed: list[tuple[int, str]] = field(default_factory=list)
    acked_per_partition: dict[int, int] = field(default_factory=dict)
    last_ack: dict[int, float] = field(default_factory=dict)  # partition -> monotonic time
    killed_at: float | None = None  # when the leader of partition 0 was seen dead
    resumed_at: float | None = None  # first ack of partition 0 after that
    done: bool = False

    def acked_in(self, partition: int) -> int:
        return self.acked_per_partition.get(partition, 0)


def value_of(i: int) -> bytes:
    return b"demo-%08d" % i


# -- the demo ----------------------------------------------------------------------------------


class ClusterDemo:
    """The demo's steps over a started `LocalCluster`; `run()` returns True when every acked
    record was consumed back once."""

    def __init__(self, cluster: LocalCluster, console: Console, partitions: int, records: int,
                 rate: float, lag_ms: int) -> None:
        self.cluster = cluster
        self.console = console
        self.partitions = partitions
        self.records = records
        self.rate = rate
        self.lag_ms = lag_ms
        self.bootstrap = cluster.bootstrap_servers
        self.stream = Stream(partitions)
        self.zk: Any = None
        self.t0 = time.monotonic()

    # narration -----------------------------------------------------------------------------
    def step(self, title: str) -> None:
        self.console.rule(f"[bold]{title}")

    def say(self, text: str) -> None:
        self.console.print(f"[cyan]  {text}")

    def event(self, text: str) -> None:
        self.console.print(f"[bold yellow]{time.monotonic() - self.t0:6.1f} s[/] {text}")

    # state ----------------------------------------------------------------------------------
    def _states_sync(self) -> PartitionStates:
        out: PartitionStates = {}
        for p in range(self.partitions):
            s = self.zk.get_partition_state((TOPIC, p))
            if s is not None:
                out[p] = s
        return out

    async def states(self) -> PartitionStates:
        return await asyncio.to_thread(self._states_sync)

    async def wait_for(self, cond: Callable[[], Any], timeout_s: float, what: str,
                       interval_s: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            got = await cond()
            if got:
                return got
            if time.monotonic() >= deadline:
                raise DemoError(f"timed out after {timeout_s:g} s waiting for {what}")
            await asyncio.sleep(interval_s)

    async def table(self, title: str) -> dict[int, Any]:
        """Kafka's describe plus every replica's LEO; returns {partition: description}."""
        from tidelog.cli.topics_cmd import describe_topics

        try:
            _meta, parts = await asyncio.wait_for(describe_topics(self.bootstrap, [TOPIC]), 20)
        except Exception as e:  # noqa: BLE001 - a table is narration: show why it is missing
            self.say(f"(could not describe {TOPIC}: {e})")
            return {}
        states = await self.states()
        brokers = sorted(self.cluster.brokers)
        t = Table(title=title, title_justify="left")
        for col in ("partition", "leader", "epoch", "replicas", "isr", "HW"):
            t.add_column(col, justify="right")
        for b in brokers:
            t.add_column(f"LEO b{b}", justify="right")
        out = {}
        for d in parts:
            s = states.get(d.partition)  # ZooKeeper is the truth; metadata may lag a moment
            leos = {o.broker: o.log_end_offset for o in d.offsets}
            t.add_row(
                f"{TOPIC}-{d.partition}",
                str(s.leader if s is not None else d.leader),
                str(s.leader_epoch if s is not None else d.leader_epoch),
                ",".join(map(str, d.replicas)),
                _isr(s),
                "?" if d.high_watermark is None else f"{d.high_watermark:,}",
                *("-" if b not in leos else ("down" if leos[b] is None else f"{leos[b]:,}")
                  for b in brokers),
            )
            out[d.partition] = d
        self.console.print(t)
        return out

    # producer -------------------------------------------------------------------------------
    async def produce(self, client: KafkaClient) -> None:
        from tidelog.client.producer import Producer

        s = self.stream
        loop = asyncio.get_running_loop()

        def done(i: int, partition: int, fut: asyncio.Future[Any]) -> None:
            if fut.cancelled():
                s.failed.append((i, "cancelled"))
            elif (exc := fut.exception()) is not None:
                s.failed.append((i, str(exc)))
            else:
                tp, offset = fut.result()
                s.acked.append((tp.partition, offset, i))
                s.acked_per_partition[tp.partition] = s.acked_in(tp.partition) + 1
                now = loop.time()  # time.monotonic() on Linux's event loops
                s.last_ack[partition] = now
                # acks already on the wire when the leader died do not count as resumed
                if (partition == 0 and s.killed_at is not None and s.resumed_at is None
                        and now > s.killed_at + 0.2):
                    s.resumed_at = now

        producer = Producer(client, acks="all", enable_idempotence=True, linger_ms=5,
                            delivery_timeout_ms=120_000, request_timeout_ms=10_000)
        await producer.start()
        try:
            start = time.monotonic()
            while s.sent < self.records:
                due = min(self.records, int((time.monotonic() - start) * self.rate) + 1)
                while s.sent < due:
                    i = s.sent
                    partition = i % self.partitions
                    fut = await producer.send(TOPIC, value_of(i), partition=partition)
                    fut.add_done_callback(lambda f, i=i, p=partition: done(i, p, f))
                    s.sent += 1
                await asyncio.sleep(0.01)
            await asyncio.wait_for(producer.flush(), 120)
        finally:
            await producer.close(timeout_s=5)
            s.done = True

    def progress_line(self) -> str:
        now = asyncio.get_running_loop().time()
        parts = []
        for p in range(self.partitions):
            last = self.stream.last_ack.get(p)
            waiting = last is not None and now - last > 1 and not self.stream.done
            stalled = f" [red](no ack for {now - last:.1f} s)[/]" if waiting else ""
            parts.append(f"{TOPIC}-{p}: {self.stream.acked_in(p):,}{stalled}")
        return (f"producer: {self.stream.sent:,} sent, {len(self.stream.acked):,} acked  "
                + " | ".join(parts))

    # the phases -----------------------------------------------------------------------------
    async def watch(self, prev: PartitionStates, until: Callable[[PartitionStates], bool],
                    timeout_s: float, what: str,
                    explain: Callable[[int, Any, Any], str]) -> PartitionStates:
        """Print every partition-state change in ZooKeeper since `prev` (with `explain`'s
        reason) and the producer's progress every second, until `until(states)`."""
        deadline = time.monotonic() + timeout_s
        next_progress = time.monotonic() + 1.0
        while True:
            cur = await self.states()
            for p in sorted(cur):
                a, b = prev.get(p), cur[p]
                if a is None or (a.leader, a.leader_epoch, a.isr) != (b.leader, b.leader_epoch,
                                                                       b.isr):
                    self.event(explain(p, a, b))
            prev = cur
            if until(cur):
                return cur
            if time.monotonic() >= next_progress:
                self.console.print(f"[dim]{time.monotonic() - self.t0:6.1f} s "
                                   f"{self.progress_line()}")
                next_progress += 1.0
            if time.monotonic() >= deadline:
                raise DemoError(f"timed out after {timeout_s:g} s waiting for {what}")
            await asyncio.sleep(0.1)

    async def run(self) -> bool:
        from tidelog.client.cluster import KafkaClient, NewTopic
        from tidelog.controller.zk_client import KafkaZkClient

        self.zk = KafkaZkClient(self.cluster.zookeeper, session_timeout_ms=10_000,
                                connection_timeout_ms=5000).start(create_top_level_paths=False)
        client = KafkaClient(self.bootstrap, request_timeout_ms=10_000, retries=8)
        producing: asyncio.Task[None] | None = None
        try:
            await client.start()
            rf = 3
            self.step(f"2. topic {TOPIC}: {self.partitions} partitions, replication factor {rf}, "
                      "min.insync.replicas=2")
            errors = await client.create_topics([NewTopic(
                TOPIC, self.partitions, rf, {"min.insync.replicas": "2"})])
            if errors.get(TOPIC) is not None:
                raise DemoError(f"creating {TOPIC} failed: {errors[TOPIC]}")

            async def online() -> bool:
                st = await self.states()
                return len(st) == self.partitions and all(
                    s.leader >= 0 and len(s.isr) == rf for s in st.values())

            await self.wait_for(online, 60, "every partition online with a full ISR")
            self.say("The controller assigned the replicas round-robin (as Kafka's "
                     "AdminUtils) and made the first replica of each partition its leader.")
            await self.table("partitions of demo, from ZooKeeper and each broker")

            self.step(f"3. a steady stream: idempotent producer, acks=all, "
                      f"{self.records:,} records at {self.rate:g}/s round-robin")
            self.say("acks=all: a record is acknowledged once every replica in the ISR has it; "
                     "with min.insync.replicas=2 the ISR may shrink to 2 and writes go on.")
            producing = asyncio.create_task(self.produce(client))
            first = max(10, min(self.records // 6, int(self.rate * 3)))

            async def warmed_up() -> bool:
                if producing.done():
                    producing.result()  # raises what stopped the producer
                return min(self.stream.acked_in(p) for p in range(self.partitions)) * \
                    self.partitions >= first

            await self.wait_for(warmed_up, 60, f"{first} acknowledged records")
            before = await self.table("before the kill")
            states = await self.states()
            victim = states[0].leader
            old_epoch = states[0].leader_epoch
            victim_leads = sorted(p for p, s in states.items() if s.leader == victim)
            hw_before = before[0].high_watermark if 0 in before else None

            self.step(f"4. kill -9 broker {victim}, the leader of {TOPIC}-0")
            self.t0 = time.monotonic()
            self.event(await asyncio.to_thread(self.cluster.stop_broker, victim, True))
            self.stream.killed_at = time.monotonic()
            self.say(f"No controlled shutdown: broker {victim} leads "
                     f"{', '.join(f'{TOPIC}-{p}' for p in victim_leads)} and follows the rest. "
                     f"Its followers' fetches fail; the leaders it followed stop seeing its "
                     f"fetches; its ZooKeeper registration lives until the session times out "
                     f"({SESSION_TIMEOUT_MS} ms).")
            self.say(f"Meanwhile writes to every partition wait: acks=all needs every ISR "
                     f"member, and broker {victim} stays in each ISR until a leader or the "
                     f"controller removes it.")
            acked_at_kill = self.stream.acked_in(0)

            def explain(p: int, a: Any, b: Any) -> str:
                head = f"{TOPIC}-{p}: "
                if a is None:
                    return head + f"leader {b.leader} epoch {b.leader_epoch} isr [{_isr(b)}]"
                if a.leader != b.leader:
                    return (head + f"leader {a.leader} -> [bold]{b.leader}[/], leader epoch "
                            f"{a.leader_epoch} -> [bold]{b.leader_epoch}[/], ISR "
                            f"[{_isr(a)}] -> [{_isr(b)}]\n         [cyan]the controller saw "
                            f"broker {a.leader}'s session expire and elected the new leader "
                            f"from the ISR; the new epoch fences anything the old one still "
                            f"sends[/]")
                if a.leader_epoch != b.leader_epoch:
                    return (head + f"ISR [{_isr(a)}] -> [{_isr(b)}], leader epoch "
                            f"{a.leader_epoch} -> {b.leader_epoch}\n         [cyan]the "
                            f"controller took the dead broker out of the ISR (a new leader "
                            f"epoch, same leader {b.leader})[/]")
                grow = len(b.isr) > len(a.isr)
                if grow:
                    return (head + f"ISR [{_isr(a)}] -> [bold green][{_isr(b)}][/]\n"
                            f"         [cyan]leader {b.leader} added the follower: its log end "
                            f"offset reached the high watermark (maybe_expand_isr), written to "
                            f"ZooKeeper with a compare-and-set on the state's zk version[/]")
                return (head + f"ISR [{_isr(a)}] -> [bold red][{_isr(b)}][/]\n         [cyan]"
                        f"leader {b.leader} dropped the follower: no fetch up to its log end for "
                        f"replica.lag.time.max.ms={self.lag_ms} (isr-expiration task, "
                        f"maybe_shrink_isr); acks=all writes go on with {len(b.isr)} in-sync "
                        f"replicas (min.insync.replicas=2)[/]")

            def failed_over(st: PartitionStates) -> bool:
                return (0 in st and st[0].leader not in (victim, -1)
                        and all(victim not in s.isr for s in st.values())
                        and self.stream.resumed_at is not None)

            states = await self.watch(states, failed_over, 90, "a new leader of demo-0 and writes to it",
                                      explain)
            new_leader = states[0].leader
            resumed = self.stream.resumed_at
            self.event(f"writes to {TOPIC}-0 acknowledged again by broker {new_leader} "
                       f"({self.stream.acked_in(0) - acked_at_kill:,} more so far); the "
                       f"producer retried what was in flight, the idempotent sequence numbers "
                       f"keep the retries from being written twice")
            if resumed is not None:
                self.say(f"{TOPIC}-0 took no writes for {resumed - self.t0:.1f} s: the "
                         f"ZooKeeper session timeout, the election, LeaderAndIsr to the "
                         f"brokers and the producer's metadata refresh and retry.")
            await self.table(f"after the failover: broker {victim} is down")

            # What the dead broker holds on disk vs where its epoch ended on the new leader.
            from tidelog.client.metadata import TopicPartition

            tp0 = TopicPartition(TOPIC, 0)
            ended = await client.offsets_for_leader_epoch(tp0, old_epoch, broker_id=new_leader)
            on_disk = on_disk_log_end_offset(
                Path(self.cluster.brokers[victim].log_dir) / f"{TOPIC}-0")
            self.say(f"On disk, broker {victim}'s {TOPIC}-0 ends at offset {on_disk}; the high "
                     f"watermark was about {hw_before} just before the kill. On the new leader, "
                     f"leader epoch {old_epoch} ended at offset {ended.offset} "
                     f"(OffsetsForLeaderEpoch).")
            if on_disk is not None and ended.offset >= 0 and on_disk > ended.offset:
                self.say(f"So broker {victim} must truncate {on_disk - ended.offset} records "
                         f"(offsets {ended.offset}..{on_disk - 1}): written by the old leader "
                         f"but never replicated to the ISR, hence never acknowledged.")
            else:
                self.say(f"Nothing to truncate: every record broker {victim} wrote reached the "
                         f"new leader; it resumes fetching from its log end.")

            self.step(f"5. restart broker {victim}")
            msg = await asyncio.to_thread(self.cluster.start_broker, victim, 60.0,
                                          lambda m: self.console.print(f"[dim]  {m}"))
            registered_at = time.monotonic()
            self.event(msg)
            hw_at_restart = (await client.list_offsets({tp0: -1}))[tp0].offset
            self.say("It registers with a new broker epoch; the controller sends it "
                     "LeaderAndIsr (follower of every partition); it truncates to the leader "
                     "epoch boundaries (KIP-101) and fetches until it has caught up.")

            def rejoined(st: PartitionStates) -> bool:
                return all(victim in s.isr for s in st.values())

            await self.watch(states, rejoined, 90, f"broker {victim} back in every ISR",
                             explain)
            if on_disk is not None and hw_at_restart >= 0:
                self.say(f"Broker {victim} was down {registered_at - self.t0:.1f} s: its "
                         f"{TOPIC}-0 ended at {on_disk:,} and the high watermark was "
                         f"{hw_at_restart:,} when it registered, so it fetched at least "
                         f"{max(0, hw_at_restart - on_disk):,} records of {TOPIC}-0 and was back "
                         f"in every ISR {time.monotonic() - registered_at:.1f} s after "
                         f"registering.")
            after = await self.table(f"broker {victim} is back in every ISR")
            if 0 in after:
                leo = next((o.log_end_offset for o in after[0].offsets if o.broker == victim),
                           None)
                self.say(f"broker {victim}'s {TOPIC}-0 now ends at {leo} like the leader's; "
                         f"leadership stays with broker {new_leader} "
                         f"(auto.leader.rebalance.enable=false here).")

            self.step("6. the producer finishes its stream")
            remaining = (self.records - self.stream.sent) / self.rate
            await asyncio.wait_for(asyncio.shield(producing), remaining + 150)
            self.say(self.progress_line())
            return await self.verify(client)
        finally:
            if producing is not None and not producing.done():
                producing.cancel()
                with contextlib.suppress(BaseException):
                    await producing
            await client.close()
            self.zk.close()

    async def verify(self, client: KafkaClient) -> bool:
        from tidelog.client.consumer import OFFSET_BEGINNING, Consumer
        from tidelog.client.metadata import TopicPartition

        self.step("7. consume everything and compare with what was acknowledged")
        tps = [TopicPartition(TOPIC, p) for p in range(self.partitions)]
        ends = await client.list_offsets({tp: -1 for tp in tps})
        high = {tp.partition: ends[tp].offset for tp in tps}
        consumer = Consumer(client, auto_offset_reset="earliest")
        consumer.assign([(tp, OFFSET_BEGINNING) for tp in tps])
        got: dict[int, list[tuple[int, bytes | None]]] = {p: [] for p in range(self.partitions)}
        deadline = time.monotonic() + 90
        try:
            while any((consumer.position(tp) or 0) < high[tp.partition] for tp in tps):
                if time.monotonic() >= deadline:
                    raise DemoError("timed out consuming up to the high watermarks")
                for r in await consumer.poll(2000, timeout_ms=1000):
                    got[r.partition].append((r.offset, r.value))
        finally:
            await consumer.close()

        t = Table(title="acked vs consumed", title_justify="left")
        for col in ("partition", "sent", "acked", "failed", "consumed", "acked, missing",
                    "duplicates", "not acked"):
            t.add_column(col, justify="right")
        total = dict.fromkeys(("sent", "acked", "failed", "consumed", "missing", "dup", "extra"),
                              0)
        for p in range(self.partitions):
            by_offset = dict(got[p])
            acked = [(o, i) for q, o, i in self.stream.acked if q == p]
            acked_ids = {i for _o, i in acked}
            missing = sum(1 for o, i in acked if by_offset.get(o) != value_of(i))
            values = [v for _o, v in got[p]]
            dup = len(values) - len(set(values))
            extra = sum(1 for v in set(values) if v is None or not v.startswith(b"demo-")
                        or int(v[5:]) not in acked_ids)
            row = {
                "sent": sum(1 for i in range(self.stream.sent) if i % self.partitions == p),
                "acked": len(acked),
                "failed": sum(1 for i, _e in self.stream.failed if i % self.partitions == p),
                "consumed": len(values), "missing": missing, "dup": dup, "extra": extra,
            }
            for k, v in row.items():
                total[k] += v
            t.add_row(f"{TOPIC}-{p}", *(f"{row[k]:,}" for k in row))
        t.add_row("[bold]total", *(f"[bold]{total[k]:,}" for k in total))
        self.console.print(t)
        self.say("'not acked': consumed records whose send was not acknowledged (a send that "
                 "failed after the broker wrote it); allowed, but there should be none here.")
        if self.stream.failed:
            self.say(f"first failed sends: {self.stream.failed[:3]}")
        ok = total["acked"] > 0 and total["missing"] == 0 and total["dup"] == 0
        verdict = "[bold green]holds[/]" if ok else "[bold red]VIOLATED[/]"
        subset = "⊆" if "utf" in (self.console.encoding or "").lower() else "subset of"
        self.console.print(f"acked {subset} consumed and no duplicates: {verdict} "
                           f"({total['acked']:,} acked, {total['consumed']:,} consumed, "
                           f"{total['missing']:,} missing, {total['dup']:,} duplicates)")
        return ok


# -- process lifetime ----------------------------------------------------------------------------


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP end the demo like Ctrl-C, so the cleanup below runs."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for sig in previous:
        signal.signal(sig, signal.default_int_handler)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _prepare_dir(root: Path, console: Console) -> None:
    """Stop a cluster a previous `--keep` run left here, then wipe the dir (only a demo dir)."""
    from tidelog.cluster.local import ClusterError, LocalCluster

    if not root.exists():
        return
    if not (root / MARKER).exists() and any(root.iterdir()):
        raise click.ClickException(f"{root} is not empty and not a demo dir (no {MARKER}); "
                                   "refusing to wipe it: pick another --dir")
    if (root / "cluster" / "cluster.json").exists():
        try:
            old = LocalCluster.load(root / "cluster")
            if any(s.alive for s in old.status(ask_zookeeper=False)):
                console.print(f"[dim]stopping the cluster a previous run left in {old.dir}")
            old.down(timeout_s=15)
        except ClusterError:
            pass
    shutil.rmtree(root)


def run_cluster_demo(data_dir: str, brokers: int, partitions: int, records: int, rate: float,
                     lag_ms: int, keep: bool, console: Console) -> bool:
    from tidelog.cluster.local import ClusterError, LocalCluster

    root = Path(data_dir).resolve()
    _prepare_dir(root, console)
    root.mkdir(parents=True)
    (root / MARKER).write_text("written by tidelog demo; the dir is wiped on every run\n")
    cluster = LocalCluster(root / "cluster")
    overrides = {
        "replica.lag.time.max.ms": str(lag_ms),
        "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
        "min.insync.replicas": "2",
        "default.replication.factor": "3",
        "auto.leader.rebalance.enable": "false",
    }
    ok = False
    with _terminate_as_interrupt():
        try:
            console.rule(f"[bold]1. cluster up: ZooKeeper and {brokers} brokers in {cluster.dir}")
            console.print("[dim]" + "  ".join(f"{k}={v}" for k, v in overrides.items()))
            try:
                cluster.up(brokers, overrides, timeout_s=90,
                           progress=lambda m: console.print(f"[dim]  {m}"))
            except ClusterError as e:
                raise click.ClickException(f"cluster up failed: {e}") from None
            console.print(f"  bootstrap servers: [bold]{cluster.bootstrap_servers}[/]  "
                          f"(broker logs: {cluster.dir}/broker-N/server.log)")
            demo = ClusterDemo(cluster, console, partitions, records, rate, lag_ms)
            try:
                ok = asyncio.run(demo.run())
            except DemoError as e:
                console.print(f"[bold red]demo failed: {e}")
                ok = False
        finally:
            if keep:
                console.print(f"[bold]--keep: the cluster stays up[/]; bootstrap servers "
                              f"{cluster.bootstrap_servers}; stop it with "
                              f"`tidelog cluster down --dir {cluster.dir}`")
            else:
                console.rule("[bold]cluster down")
                cluster.down(timeout_s=20, progress=lambda m: console.print(f"[dim]  {m}"))
    return ok


def run_storage_demo(data_dir: str, count: int, console: Console) -> None:
    """The offline storage walk-through: write a partition log, read it back, describe it."""
    from tidelog.cli.main import cli

    root = Path(data_dir).resolve()
    _prepare_dir(root, console)
    root.mkdir(parents=True)
    (root / MARKER).write_text("written by tidelog demo; the dir is wiped on every run\n")
    log_dir = str(root / "logs")
    steps = [
        (
            f"write {count} records to demo-0 (lz4, batches of 100)",
            ["log", "write", log_dir, "--topic", "demo", "--partition", "0",
             "--count", str(count), "--batch", "100", "--compression", "lz4"],
        ),
        ("read the first records back", ["log", "read", log_dir, "--topic", "demo",
                                          "--partition", "0", "--from", "0", "--max", "5"]),
        ("describe the log directory", ["log", "describe", log_dir]),
    ]
    for title, args in steps:
        console.rule(f"[bold]{title}")
        console.print(f"$ tidelog {' '.join(args)}", style="dim")
        cli.main(args, prog_name="tidelog", standalone_mode=False)
    console.rule("[bold green]demo finished")


@click.command()
@click.option("--dir", "data_dir", default=DEFAULT_DIR, show_default=True,
              help="Where the demo keeps its cluster (ZooKeeper, broker logs and data); wiped "
                   "at the start of every run (only a dir an earlier demo made, or an empty "
                   "one).")
@click.option("--brokers", default=3, show_default=True, type=click.IntRange(3, 9),
              help="Brokers to start (the topic has 3 replicas).")
@click.option("--partitions", default=3, show_default=True, type=click.IntRange(1, 64),
              help="Partitions of the topic `demo`.")
@click.option("--records", default=20_000, show_default=True, type=click.IntRange(60),
              help="Records the producer writes.")
@click.option("--rate", default=1000.0, show_default=True, type=click.FloatRange(10),
              help="Records per second the producer writes (a steady stream).")
@click.option("--lag-ms", default=2500, show_default=True, type=click.IntRange(500, 30_000),
              help="replica.lag.time.max.ms of the brokers: how soon a silent follower leaves "
                   "the ISR.")
@click.option("--keep", is_flag=True, help="Leave the cluster running at the end.")
@click.option("--storage-only", is_flag=True,
              help="Only the offline storage walk-through (no cluster): write a partition "
                   "log, read it back, describe it.")
@click.option("--count", default=20_000, show_default=True,
              help="Records to write with --storage-only.")
def demo(data_dir: str, brokers: int, partitions: int, records: int, rate: float, lag_ms: int,
         keep: bool, storage_only: bool, count: int) -> None:
    """A live cluster: kill -9 the leader under an acks=all stream, watch the ISR shrink and a
    new leader take over, restart the broker and watch it rejoin, then check that every
    acknowledged record is there exactly once (exit status 1 if not)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=110)  # piped: room for the tables
    if storage_only:
        run_storage_demo(data_dir, count, console)
        return
    started = time.monotonic()
    ok = run_cluster_demo(data_dir, brokers, partitions, records, rate, lag_ms, keep, console)
    console.print(f"demo {'finished' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    sys.exit(0 if ok else 1)
