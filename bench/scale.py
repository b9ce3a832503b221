"""Scale benchmark (issue 12 items 2 and 6): a 3-broker cluster with many partitions at RF=3 —
tidelog and Apache Kafka 3.9 in ZooKeeper mode, in the same run.

    .venv/bin/python bench/scale.py [--partitions 1000 5000 10000] [--targets tidelog,kafka]
        [--cycles 3] [--idle-seconds 20] [--no-write-doc]

For each partition count and target, on a fresh cluster (private ZooKeeper, 3 broker processes
on 127.0.0.1, `zookeeper.session.timeout.ms` 6000 and `auto.leader.rebalance.enable` false on
both): create one topic with that many partitions at RF=3 (time until every partition has a
leader), wait for full ISR (every partition's ISR has 3 replicas), then, with no client traffic,
read each broker's CPU time (/proc/<pid>/stat utime+stime) over an --idle-seconds window: the idle
CPU per broker as a share of one core, and its RSS. Then --cycles times, on a broker that is not
the controller (the two such brokers take turns):

- controlled shutdown: SIGTERM; the time until no partition lists that broker as its leader (in
  the Metadata of the controller's broker, one connection polled back to back) and until the
  process has exited;
- restart after the clean shutdown: the time until the broker is registered in ZooKeeper (both
  load every log before registering) and until every partition's ISR is full again;
- a preferred leader election (ElectLeaders) to give the broker its leaderships back, untimed;
- kill -9: the time until every partition has a leader other than that broker (dominated by the
  ZooKeeper session timeout, 6 s, on both);
- restart after the kill: registered (log recovery after an unclean shutdown), full ISR;
- the preferred election again.

Every wait is bounded (--step-timeout). Medians over the cycles; the ratios tidelog / Kafka are of
the same run. The machine's load average is recorded with each row: the figures are only as quiet
as the machine. Anchors: Kafka 1.1 moved the leaderships of a broker with ~10,000 partitions in
3 s on controlled shutdown; Kafka's guidance is up to 4,000 partitions per broker.

Goal (issue 12 item 2): idle CPU <= 2% of a core per broker at 5,000 partitions, <= 3% at 10,000.
Appends the tables to docs/benchmarks.md (section "## scale").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from _baseline import baseline_source, tidelog_from
from _doc import append_run
from _machine import cpu_seconds, load_average, machine_description
from cluster import KAFKA_HEAP_MB, KAFKA_JVM_OPTIONS
from confluent_kafka import ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tidelog.client.connection import BrokerConnection
from tidelog.cluster.local import LocalCluster
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.protocol.messages.metadata import MetadataRequest, MetadataRequestTopic
from tidelog.testing.kafka_cluster import KafkaCluster, kafka_classpath

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## scale"
TOPIC = "scale"
# The same on both: leaderships stay where the benchmark puts them, and a killed broker's
# ZooKeeper session (LocalCluster's default for tidelog) expires after 6 s.
OVERRIDES = {"auto.leader.rebalance.enable": "false", "zookeeper.session.timeout.ms": "6000"}
POLL_S = 0.05

# partition -> (leader, replicas, isr)
Partitions = dict[int, tuple[int, list[int], list[int]]]


@dataclass
class Cycle:
    victim: int
    leaderships: int  # partitions the victim led at the controlled shutdown
    killed_leaderships: int = 0  # ... and when it was killed
    shutdown_leaders_s: float | None = None
    shutdown_exit_s: float | None = None
    clean_registered_s: float | None = None
    clean_full_isr_s: float | None = None
    failover_s: float | None = None
    unclean_registered_s: float | None = None
    unclean_full_isr_s: float | None = None


@dataclass
class Row:
    target: str  # "tidelog", "tidelog <baseline spec>", "Apache Kafka 3.9"
    partitions: int
    create_s: float
    full_isr_s: float | None
    idle_cpu_pct: list[float]  # per broker, % of one core
    rss_mib: list[float]
    load_before: str
    load_after: str
    cycles: list[Cycle] = field(default_factory=list)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- the two kinds of cluster ---------------------------------------------------------------------


class Target:
    """A running 3-broker cluster of either kind: its processes, signals and restarts."""

    name: str
    zookeeper: str

    def address(self, broker_id: int) -> str:
        raise NotImplementedError

    def pid(self, broker_id: int) -> int:
        raise NotImplementedError

    def broker_ids(self) -> list[int]:
        raise NotImplementedError

    def exited(self, broker_id: int) -> bool:
        raise NotImplementedError

    def spawn(self, broker_id: int) -> None:
        raise NotImplementedError

    def down(self) -> None:
        raise NotImplementedError

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(self.address(b) for b in self.broker_ids())

    def signal(self, broker_id: int, sig: int) -> None:
        os.kill(self.pid(broker_id), sig)


class Tidelog(Target):
    def __init__(self, workdir: Path, label: str) -> None:
        self.name = label
        self.cluster = LocalCluster(workdir, die_with_parent=True)
        self.cluster.up(3, OVERRIDES, timeout_s=120)
        self.zookeeper = self.cluster.zookeeper

    def address(self, broker_id: int) -> str:
        return self.cluster.brokers[broker_id].address

    def pid(self, broker_id: int) -> int:
        pid = self.cluster.brokers[broker_id].pid
        assert pid is not None
        return pid

    def broker_ids(self) -> list[int]:
        return sorted(self.cluster.brokers)

    def exited(self, broker_id: int) -> bool:
        return not self.cluster.alive(broker_id)

    def spawn(self, broker_id: int) -> None:
        self.cluster._spawn(broker_id)  # the bench times registration itself, below

    def down(self) -> None:
        self.cluster.down(timeout_s=60)


class Kafka(Target):
    def __init__(self, workdir: Path) -> None:
        self.name = "Apache Kafka 3.9"
        self.cluster = KafkaCluster(workdir, heap_mb=KAFKA_HEAP_MB, jvm_options=KAFKA_JVM_OPTIONS)
        self.cluster.up(3, OVERRIDES, timeout_s=180)
        assert self.cluster.zookeeper is not None
        self.zookeeper = self.cluster.zookeeper.connect_string

    def address(self, broker_id: int) -> str:
        return self.cluster.brokers[broker_id].address

    def pid(self, broker_id: int) -> int:
        proc = self.cluster.brokers[broker_id].proc
        assert proc is not None
        return proc.pid

    def broker_ids(self) -> list[int]:
        return sorted(self.cluster.brokers)

    def exited(self, broker_id: int) -> bool:
        return not self.cluster.brokers[broker_id].alive()

    def spawn(self, broker_id: int) -> None:
        self.cluster._spawn(self.cluster.brokers[broker_id], kafka_classpath())

    def down(self) -> None:
        self.cluster.down(timeout_s=60)


# -- observing ---------------------------------------------------------------------------------------


async def _metadata(conn: BrokerConnection) -> Partitions:
    r = await conn.send(MetadataRequest(topics=[MetadataRequestTopic(name=TOPIC)],
                                        allow_auto_topic_creation=False))
    for t in r.topics:
        if t.name == TOPIC and t.error_code == 0:
            return {p.partition_index: (p.leader_id, list(p.replica_nodes), list(p.isr_nodes))
                    for p in t.partitions}
    return {}


def wait_metadata(address: str, done: Callable[[Partitions], bool], timeout_s: float,
                  t0: float | None = None) -> float | None:
    """Seconds from `t0` (default: now) until `done(partitions)` holds in `address`'s Metadata,
    polled back to back on one connection; None after `timeout_s`."""
    start = time.monotonic() if t0 is None else t0

    async def run() -> float | None:
        host, port = address.rsplit(":", 1)
        conn: BrokerConnection | None = None
        while time.monotonic() - start < timeout_s:
            try:
                if conn is None:
                    conn = BrokerConnection(host, int(port), request_timeout_ms=30_000)
                    await conn.connect(timeout_s=10)
                asked = time.monotonic()
                if done(await _metadata(conn)):
                    return time.monotonic() - start
                # at most half the observed broker's time on answering the poll: a Metadata
                # of 10,000 partitions is not free, and the broker is the one being timed
                await asyncio.sleep(max(POLL_S, time.monotonic() - asked))
                continue
            except Exception:  # noqa: BLE001 - a busy or restarting broker: reconnect and retry
                if conn is not None:
                    await conn.close()
                conn = None
            await asyncio.sleep(POLL_S)
        return None

    return asyncio.run(run())


def led_by(address: str, broker_id: int) -> int:
    """How many partitions `address`'s Metadata shows `broker_id` leading."""
    async def count() -> int:
        host, port = address.rsplit(":", 1)
        conn = BrokerConnection(host, int(port), request_timeout_ms=30_000)
        await conn.connect(timeout_s=10)
        try:
            return sum(1 for leader, _, _ in (await _metadata(conn)).values()
                       if leader == broker_id)
        finally:
            await conn.close()

    return asyncio.run(count())


def full_isr(n: int) -> Callable[[Partitions], bool]:
    return lambda ps: len(ps) == n and all(len(isr) == 3 for _, _, isr in ps.values())


@contextmanager
def zookeeper(connect: str) -> Iterator[KafkaZkClient]:
    zk = KafkaZkClient(connect, session_timeout_ms=6000, connection_timeout_ms=5000).start(
        create_top_level_paths=False)
    try:
        yield zk
    finally:
        zk.close()


def wait_exit(target: Target, broker_id: int, t0: float, timeout_s: float) -> float | None:
    while time.monotonic() - t0 < timeout_s:
        if target.exited(broker_id):
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def wait_registered(zk: KafkaZkClient, broker_id: int, t0: float, timeout_s: float,
                    target: Target) -> float | None:
    while time.monotonic() - t0 < timeout_s:
        if broker_id in zk.get_all_broker_ids():
            return time.monotonic() - t0
        if target.exited(broker_id):
            raise RuntimeError(f"{target.name}: broker {broker_id} exited during its restart")
        time.sleep(0.05)
    return None


# -- the steps -----------------------------------------------------------------------------------------


def create(admin: AdminClient, address: str, partitions: int, timeout_s: float) -> float:
    t0 = time.monotonic()
    # operation_timeout 0: answered once the assignment is written, without waiting for the
    # leaders (a wait the broker bounds at 60 s, less than 10,000 partitions take here); the
    # Metadata poll below is the measure on both.
    futures = admin.create_topics([NewTopic(TOPIC, partitions, 3)], operation_timeout=0,
                                  request_timeout=120)
    futures[TOPIC].result(timeout=timeout_s)
    print(f"  CreateTopics answered after {time.monotonic() - t0:.1f} s", flush=True)
    took = wait_metadata(address, lambda ps: len(ps) == partitions and all(
        leader >= 0 for leader, _, _ in ps.values()), timeout_s, t0)
    if took is None:
        raise RuntimeError(f"partitions without a leader after {timeout_s:.0f} s")
    return took


def elect_preferred(target: Target, observer: str, partitions: int, timeout_s: float) -> None:
    """Give every partition back to its first replica (untimed: it only resets the cluster
    between cycles), and wait until the Metadata shows it."""
    admin = AdminClient({"bootstrap.servers": observer, "log_level": 0})
    tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
    try:
        # (no request_timeout: confluent-kafka 2.16 fails to parse it for this call)
        admin.elect_leaders(ElectionType.PREFERRED, tps).result(timeout=timeout_s)
    except Exception as e:  # noqa: BLE001 - partitions already on their preferred leader answer an error
        print(f"  elect_leaders: {str(e)[:160]}", flush=True)
    if wait_metadata(observer, lambda ps: len(ps) == partitions and all(
            leader == replicas[0] for leader, replicas, _ in ps.values()), timeout_s) is None:
        print(f"  {target.name}: preferred leaders not all back after {timeout_s:.0f} s", flush=True)


def restart(target: Target, zk: KafkaZkClient, observer: str, victim: int, partitions: int,
            timeout_s: float, prof: Profiler, step: str) -> tuple[float | None, float | None]:
    t0 = time.monotonic()
    target.spawn(victim)
    prof.start(f"restart-{step}", victim)
    registered = wait_registered(zk, victim, t0, timeout_s, target)
    isr = wait_metadata(observer, full_isr(partitions), timeout_s, t0)
    prof.stop()
    return registered, isr


class Profiler:
    """py-spy on broker processes over one step (--profile DIR): collapsed stacks, one file per
    step and broker, for finding what a step spends its time on. Off: does nothing."""

    def __init__(self, out: Path | None, target: Target, partitions: int) -> None:
        self.out = out if isinstance(target, Tidelog) else None  # Python brokers only
        self.target = target
        self.partitions = partitions
        self.procs: list[subprocess.Popen[bytes]] = []

    def keep_logs(self, label: str, out: Path | None) -> None:
        """Copy each tidelog broker's server.log (the controller logs its slow events and
        requests) into ``out`` before the cluster's dir is removed."""
        if out is None or not isinstance(self.target, Tidelog):
            return
        out.mkdir(parents=True, exist_ok=True)
        tag = "".join(c if c.isalnum() else "_" for c in label)
        for b, broker in self.target.cluster.brokers.items():
            if broker.log_file and Path(broker.log_file).exists():
                shutil.copyfile(broker.log_file, out / f"{self.partitions}-{tag}-broker{b}.log")

    def start(self, step: str, *broker_ids: int) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        for b in broker_ids:
            self.procs.append(subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record",
                 "--pid", str(self.target.pid(b)), "--format", "raw", "--rate", "50", "--duration", "600", "--nonblocking",
                 "-o", str(self.out / f"{self.partitions}-{step}-broker{b}.txt")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def cycle(target: Target, victim: int, observer: str, partitions: int,
          timeout_s: float, profile: Path | None = None) -> Cycle:
    c = Cycle(victim, led_by(observer, victim))
    prof = Profiler(profile, target, partitions)
    controller = next(b for b in target.broker_ids() if target.address(b) == observer)
    with zookeeper(target.zookeeper) as zk:
        # controlled shutdown
        exit_at: list[float | None] = [None]
        prof.start("controlled-shutdown", controller, victim)
        t0 = time.monotonic()
        target.signal(victim, signal.SIGTERM)
        waiter = threading.Thread(
            target=lambda: exit_at.__setitem__(0, wait_exit(target, victim, t0, timeout_s)))
        waiter.start()
        c.shutdown_leaders_s = wait_metadata(observer, lambda ps: len(ps) == partitions and all(
            leader != victim for leader, _, _ in ps.values()), timeout_s, t0)
        waiter.join()
        c.shutdown_exit_s = exit_at[0]
        prof.stop()
        if c.shutdown_exit_s is None:
            target.signal(victim, signal.SIGKILL)
            wait_exit(target, victim, time.monotonic(), 30)
        print(f"  controlled shutdown of broker {victim} ({c.leaderships} leaderships): leaders "
              f"moved {c.shutdown_leaders_s} s, exited {c.shutdown_exit_s} s", flush=True)
        # the previous registration must be gone before the broker can register again
        while victim in zk.get_all_broker_ids():
            time.sleep(0.1)
        c.clean_registered_s, c.clean_full_isr_s = restart(target, zk, observer, victim,
                                                           partitions, timeout_s, prof, "clean")
        print(f"  restart (clean): registered {c.clean_registered_s} s, full ISR "
              f"{c.clean_full_isr_s} s", flush=True)
        elect_preferred(target, observer, partitions, timeout_s)
        # kill -9
        c.killed_leaderships = led_by(observer, victim)
        prof.start("failover", controller)
        t0 = time.monotonic()
        target.signal(victim, signal.SIGKILL)
        c.failover_s = wait_metadata(observer, lambda ps: len(ps) == partitions and all(
            leader >= 0 and leader != victim for leader, _, _ in ps.values()), timeout_s, t0)
        prof.stop()
        wait_exit(target, victim, time.monotonic(), 30)
        print(f"  kill -9 of broker {victim} ({c.killed_leaderships} leaderships): every partition led again after "
              f"{c.failover_s} s", flush=True)
        while victim in zk.get_all_broker_ids():  # bounded by the session timeout
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"broker {victim}'s registration outlived {timeout_s:.0f} s")
            time.sleep(0.1)
        c.unclean_registered_s, c.unclean_full_isr_s = restart(
            target, zk, observer, victim, partitions, timeout_s, prof, "unclean")
        print(f"  restart (after kill -9): registered {c.unclean_registered_s} s, full ISR "
              f"{c.unclean_full_isr_s} s", flush=True)
        elect_preferred(target, observer, partitions, timeout_s)
    return c


def measure(kind: str, partitions: int, args: argparse.Namespace, label: str = "tidelog",
            src: Path | None = None) -> Row:
    workdir = Path(tempfile.mkdtemp(prefix=f"tidelog-scale-{kind}-{partitions}-"))
    target: Target | None = None
    try:
        with tidelog_from(src):
            print(f"{partitions} partitions, {label}: starting 3 brokers in {workdir} ...",
                  flush=True)
            target = Tidelog(workdir, label) if kind == "tidelog" else Kafka(workdir)
            with zookeeper(target.zookeeper) as zk:
                controller = zk.get_controller_id()
            assert controller is not None
            observer = target.address(controller)
            admin = AdminClient({"bootstrap.servers": target.bootstrap_servers, "log_level": 0})
            # With --profile, every broker from the creation to full ISR (no cycle needed).
            prof = Profiler(args.profile, target, partitions)
            prof.start(f"create-{label.replace(' ', '_')}", *target.broker_ids())
            create_s = create(admin, observer, partitions, args.step_timeout)
            print(f"  created in {create_s:.1f} s", flush=True)
            full_isr_s = wait_metadata(observer, full_isr(partitions), args.step_timeout)
            prof.stop()
            print(f"  full ISR after {full_isr_s} s ({create_s + (full_isr_s or 0):.1f} s after "
                  "the CreateTopics request)", flush=True)
            time.sleep(args.settle_seconds)  # let the first fetch rounds and checkpoints pass
            pids = [target.pid(b) for b in target.broker_ids()]
            load_before = load_average()
            # --idle-windows back-to-back windows; per broker the median window (noise on a
            # shared machine comes in bursts).
            windows: list[list[float]] = []
            for _ in range(args.idle_windows):
                before = {pid: cpu_seconds(pid) for pid in pids}
                t0 = time.monotonic()
                time.sleep(args.idle_seconds)
                elapsed = time.monotonic() - t0
                windows.append([100 * (cpu_seconds(pid) - before[pid]) / elapsed for pid in pids])
                print(f"  idle window: {', '.join(f'{c:.2f}%' for c in windows[-1])}", flush=True)
            rss = [rss_mib(pid) for pid in pids]
            if wait_metadata(observer, full_isr(partitions), 0.001) is None:
                # idle followers must stay in the ISR: a cheap idle that drops them is no win
                print("  WARNING: partitions left full ISR during the idle window", flush=True)
            row = Row(label, partitions, create_s, full_isr_s,
                      [statistics.median(w[i] for w in windows) for i in range(len(pids))], rss,
                      load_before, load_average())
            print(f"  idle CPU per broker: {', '.join(f'{c:.2f}%' for c in row.idle_cpu_pct)}; "
                  f"RSS {', '.join(f'{r:.0f}' for r in row.rss_mib)} MiB; load "
                  f"{row.load_before} -> {row.load_after}", flush=True)
            victims = [b for b in target.broker_ids() if b != controller]
            for n in range(args.cycles):
                row.cycles.append(cycle(target, victims[n % len(victims)], observer, partitions,
                                        args.step_timeout, args.profile if n == 0 else None))
            row.load_after = load_average()
            return row
    finally:
        if target is not None:
            target.down()
            Profiler(args.profile, target, partitions).keep_logs(label, args.logs or args.profile)
        shutil.rmtree(workdir, ignore_errors=True)


# -- reporting ---------------------------------------------------------------------------------------


def med(values: list[float | None]) -> float | None:
    """The median of the cycles that finished; None when any did not (it timed out)."""
    if not values or any(v is None for v in values):
        return None
    return statistics.median(v for v in values if v is not None)


def fmt(v: float | None, unit: str = " s") -> str:
    return "timed out" if v is None else f"{v:.1f}{unit}"


STEPS: list[tuple[str, Callable[[Cycle], float | None]]] = [
    ("controlled shutdown: leaders moved", lambda c: c.shutdown_leaders_s),
    ("controlled shutdown: process exited", lambda c: c.shutdown_exit_s),
    ("restart after it: registered (logs loaded)", lambda c: c.clean_registered_s),
    ("restart after it: full ISR", lambda c: c.clean_full_isr_s),
    ("kill -9: every partition led", lambda c: c.failover_s),
    ("restart after kill -9: registered (logs recovered)", lambda c: c.unclean_registered_s),
    ("restart after kill -9: full ISR", lambda c: c.unclean_full_isr_s),
]


def table(rows: list[Row]) -> str:
    lines = ["| target | partitions (RF=3) | create | full ISR | idle CPU per broker (% of a "
             "core) | median | RSS per broker | load avg before -> after |",
             "|---|---:|---:|---:|---|---:|---|---|"]
    for r in rows:
        lines.append(
            f"| {r.target} | {r.partitions:,} | {r.create_s:.1f} s | {fmt(r.full_isr_s)} | "
            f"{', '.join(f'{c:.2f}' for c in r.idle_cpu_pct)} | "
            f"{statistics.median(r.idle_cpu_pct):.2f}% | "
            f"{', '.join(f'{m:.0f}' for m in r.rss_mib)} MiB | {r.load_before} -> {r.load_after} |")
    with_cycles = [r for r in rows if r.cycles]
    if not with_cycles:
        return "\n".join(lines)
    lines += ["", "Faults, median over the cycles (each cycle's figure in brackets); "
              "leaderships: what the stopped broker led.", "",
              "| step | " + " | ".join(f"{r.target}, {r.partitions:,}" for r in with_cycles) + " |",
              "|---|" + "---:|" * len(with_cycles)]
    lines.append("| leaderships moved (controlled shutdown; kill -9) | " + " | ".join(
        "; ".join(f"{c.leaderships}, {c.killed_leaderships}" for c in r.cycles)
        for r in with_cycles) + " |")
    for name, get in STEPS:
        cells = []
        for r in with_cycles:
            values = [get(c) for c in r.cycles]
            each = ", ".join("t/o" if v is None else f"{v:.1f}" for v in values)
            cells.append(f"{fmt(med(values))} ({each})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    ratios = []
    for r in with_cycles:
        kafka = next((k for k in with_cycles if k.target.startswith("Apache Kafka")
                      and k.partitions == r.partitions), None)
        if kafka is None or r is kafka:
            continue
        parts = []
        for name, get in [("create", None), *STEPS]:
            mine = r.create_s if get is None else med([get(c) for c in r.cycles])
            theirs = kafka.create_s if get is None else med([get(c) for c in kafka.cycles])
            if mine is not None and theirs:
                parts.append(f"{name} {mine / theirs:.2f}x")
        ratios.append(f"- {r.target} / Kafka at {r.partitions:,} partitions: " + "; ".join(parts))
    if ratios:
        lines += ["", "Ratios (tidelog / Apache Kafka, same run; below 1 is faster):", "", *ratios]
    return "\n".join(lines)


def write_doc(command: str, machine: str, body: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    block = f"### run {stamp}\n\nMachine: {machine}.\nCommand: `{command}`\n\n{body}\n"
    intro = (f"{SECTION}\n\n`bench/scale.py`. A fresh 3-broker cluster per row, one topic at "
             "RF=3; after full ISR and a settling pause, each broker's CPU time "
             "(/proc/<pid>/stat utime+stime) over idle windows with no client traffic "
             "(per broker the median of --idle-windows), as a share of one core. Goal (issue 12 item 2): <= 2% per broker at 5,000 "
             "partitions, <= 3% at 10,000.\n")
    append_run(DOC, SECTION, intro, block)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--partitions", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--targets", default="tidelog",
                    help="comma-separated: tidelog, kafka (Apache Kafka 3.9, ZooKeeper mode)")
    ap.add_argument("--cycles", type=int, default=0,
                    help="controlled shutdown / restart / kill -9 / restart cycles per cluster "
                         "(0: the idle measurement only)")
    ap.add_argument("--idle-seconds", type=float, default=20.0)
    ap.add_argument("--idle-windows", type=int, default=3,
                    help="idle windows of --idle-seconds each; per broker the median")
    ap.add_argument("--settle-seconds", type=float, default=5.0)
    ap.add_argument("--step-timeout", "--isr-timeout", type=float, default=600.0,
                    help="bound on each wait: topic creation, full ISR, each fault step")
    ap.add_argument("--baseline", metavar="REV", action="append", default=[],
                    help="also measure tidelog at git revision REV ('REV without C1,C2': with "
                         "those commits' changes to src reverted), after the working tree at "
                         "each partition count: before/after in the same run")
    ap.add_argument("--profile", type=Path, metavar="DIR",
                    help="py-spy the tidelog brokers from the topic's creation to full ISR (all "
                         "three) and through the first cycle's steps (the controller and the "
                         "stopped broker), collapsed stacks into DIR; the brokers' logs are "
                         "copied there too")
    ap.add_argument("--logs", type=Path, metavar="DIR",
                    help="copy each tidelog broker's server.log into DIR before its cluster's "
                         "dir is removed")
    ap.add_argument("--no-write-doc", action="store_true")
    args = ap.parse_args()
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if set(targets) - {"tidelog", "kafka"}:
        ap.error(f"unknown targets: {sorted(set(targets) - {'tidelog', 'kafka'})}")
    machine = machine_description()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tidelog-scale-src-") as tmp:
        sources: list[tuple[str, str, Path | None]] = []
        if "tidelog" in targets:
            sources.append(("tidelog", "tidelog", None))
        for n, spec in enumerate(args.baseline):
            print(f"tidelog at {spec}: exporting and building ...", flush=True)
            src = baseline_source(spec, Path(tmp) / str(n))
            # Bytecode, as an installed package has it: with PYTHONDONTWRITEBYTECODE (set in
            # this machine's environment) every broker start compiled all of tidelog first,
            # 2-5 s of each "registered" figure here.
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(src)], check=True,
                           capture_output=True)
            sources.append(("tidelog", f"tidelog {spec}", src))
        if "kafka" in targets:
            sources.append(("kafka", "Apache Kafka 3.9", None))
        # one cluster at a time: two clusters of 10,000 partitions would not fit in memory
        for n in args.partitions:
            for kind, label, src in sources:
                rows.append(measure(kind, n, args, label, src))
                print("\n" + table(rows) + "\n", flush=True)
    body = table(rows)
    print("\n" + body)
    if not args.no_write_doc:
        write_doc("python bench/scale.py " + " ".join(sys.argv[1:]), machine, body)
        print(f"\nappended to {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
