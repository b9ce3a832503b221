"""Apache Kafka itself, as the reference the compatibility tests compare tidelog with.

`KafkaCluster(D).up(3)` is the mirror of `tidelog cluster up`: a private ZooKeeper
(`tidelog.cluster.zookeeper`, in `D/zookeeper/`) and three Apache Kafka 3.9 brokers in ZooKeeper
mode (`java ... kafka.Kafka D/kafka-N/server.properties`, log in `D/kafka-N/server.log`), every
server bound to 127.0.0.1. It waits (bounded) until every broker's Metadata lists every broker,
and `down()` stops them by PID. Every JVM dies with the process that started it
(PR_SET_PDEATHSIG), so a killed test run leaves no broker behind.

The classpath is `interop/target/lib/*`, which `make interop` fills from Maven Central
(interop/pom.xml pins the version); `TIDELOG_KAFKA_CLASSPATH` overrides it. `kafka_tool()` runs
Kafka's command-line tools (kafka-topics, console producer and consumer, ...) from the same jars.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.cluster.zookeeper import HOST, ZooKeeperServer, _die_with_parent, pick_free_port

__all__ = ["KafkaBroker", "KafkaCluster", "KafkaClusterError", "kafka_classpath", "kafka_tool",
           "wait_for_metadata"]

REPO = Path(__file__).resolve().parents[3]
LIB_DIR = REPO / "interop" / "target" / "lib"
# The Java clients' harness (interop/src/main/java), compiled by `make interop`.
HARNESS_CLASSES = REPO / "interop" / "target" / "classes"
JAVA = "/usr/bin/java"

# Small heaps and the C1 compiler only: three brokers, ZooKeeper and tidelog share two cores.
JVM_OPTIONS = (
    "-Xms64m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xss512k",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.sasl.client=false",  # no JAAS file: skip the SASL attempt and its warning
)

# Settings that only make the reference cluster start quickly and small; none of them shows in
# what a client observes of a topic (they are not topic-config synonyms).
KAFKA_ONLY_SETTINGS = {
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.replica.fetchers": "1",
    "background.threads": "2",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(2 * 1024 * 1024),  # 128 MiB of heap by default
    "zookeeper.connection.timeout.ms": "20000",
}

LOG4J = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.apache.zookeeper=WARN
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
log4j.logger.org.apache.kafka.clients=WARN
"""

TOOLS_LOG4J = "log4j.rootLogger=WARN, stderr\n" \
    "log4j.appender.stderr=org.apache.log4j.ConsoleAppender\n" \
    "log4j.appender.stderr.Target=System.err\n" \
    "log4j.appender.stderr.layout=org.apache.log4j.PatternLayout\n" \
    "log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n\n"


class KafkaClusterError(RuntimeError):
    """The reference cluster could not be found, started or stopped."""


def kafka_classpath() -> str:
    """`interop/target/lib/*` (`make interop` fetches it), or `TIDELOG_KAFKA_CLASSPATH`."""
    override = os.environ.get("TIDELOG_KAFKA_CLASSPATH")
    if override:
        return override
    if not any(LIB_DIR.glob("kafka_2.13-*.jar")):
        raise KafkaClusterError(f"Apache Kafka's jars are not in {LIB_DIR}: run `make interop`")
    return str(LIB_DIR / "*")


def kafka_tool(main_class: str, *args: str, input: str | None = None, timeout_s: float = 120,
               heap_mb: int = 256) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's command-line tools (`main_class`, e.g. `kafka.admin.TopicCommand` or
    `org.apache.kafka.tools.ConsoleProducer`) or the harness (`tidelog.interop.Harness`) on the
    reference classpath; returns its result."""
    log4j = LIB_DIR.parent / "tools-log4j.properties"
    if not log4j.exists():
        log4j.parent.mkdir(parents=True, exist_ok=True)
        log4j.write_text(TOOLS_LOG4J)
    classpath = os.pathsep.join([str(HARNESS_CLASSES), kafka_classpath()])
    cmd = [JAVA, f"-Xmx{heap_mb}m", *JVM_OPTIONS, f"-Dlog4j.configuration=file:{log4j}",
           "-cp", classpath, main_class, *args]
    return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout_s,
                          stdin=None if input is not None else subprocess.DEVNULL,
                          preexec_fn=_die_with_parent)


@dataclass
class KafkaBroker:
    id: int
    port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def config(self) -> Path:
        return self.dir / "server.properties"

    @property
    def log_file(self) -> Path:
        return self.dir / "server.log"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 3) -> str:
        try:
            rows = self.log_file.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        bad = [r for r in rows if " ERROR " in r or "Exception" in r] or rows
        return " | ".join(r.strip() for r in bad[-lines:]) or "(empty log)"


class KafkaCluster:
    """A private ZooKeeper and N Apache Kafka brokers on 127.0.0.1, owned by this object."""

    def __init__(self, directory: str | Path, heap_mb: int = 384,
                 jvm_options: Sequence[str] = JVM_OPTIONS) -> None:
        """`jvm_options`: the brokers' JVM flags besides the heap (the default trades speed for
        a quick start; a benchmark drops -XX:TieredStopAtLevel=1 to let the JIT optimise)."""
        self.dir = Path(directory).resolve()
        self.heap_mb = heap_mb
        self.jvm_options = tuple(jvm_options)
        self.zookeeper: ZooKeeperServer | None = None
        self.brokers: dict[int, KafkaBroker] = {}

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.address for _, b in sorted(self.brokers.items()))

    def broker_properties(self, broker_id: int, port: int, n_brokers: int,
                          overrides: Mapping[str, str]) -> dict[str, str]:
        assert self.zookeeper is not None
        props = {
            "broker.id": str(broker_id),
            "listeners": f"PLAINTEXT://{HOST}:{port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
            "log.dirs": str(self.dir / f"kafka-{broker_id}" / "data"),
            "zookeeper.connect": self.zookeeper.connect_string,
            "offsets.topic.replication.factor": str(min(3, n_brokers)),
            "transaction.state.log.replication.factor": str(min(3, n_brokers)),
            "transaction.state.log.min.isr": str(min(2, n_brokers)),
            "group.initial.rebalance.delay.ms": "0",
            **KAFKA_ONLY_SETTINGS,
        }
        props.update(overrides)
        return props

    def up(self, n_brokers: int = 3, overrides: Mapping[str, str] | None = None,
           timeout_s: float = 180.0) -> KafkaCluster:
        """Start ZooKeeper and `n_brokers` brokers; return once every broker's Metadata lists all
        of them. On failure everything started here is stopped again."""
        deadline = time.monotonic() + timeout_s
        classpath = kafka_classpath()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "log4j.properties").write_text(LOG4J)
        try:
            self.zookeeper = ZooKeeperServer(self.dir / "zookeeper", die_with_parent=True)
            self.zookeeper.start(timeout_s=60)
            for broker_id in range(1, n_brokers + 1):
                b = KafkaBroker(broker_id, pick_free_port(), self.dir / f"kafka-{broker_id}")
                b.dir.mkdir(parents=True, exist_ok=True)
                props = self.broker_properties(broker_id, b.port, n_brokers, overrides or {})
                b.config.write_text("# written by tidelog.testing.kafka_cluster\n"
                                    + "".join(f"{k}={v}\n" for k, v in props.items()))
                self.brokers[broker_id] = b
                self._spawn(b, classpath)
            wait_for_metadata([b.address for b in self.brokers.values()], n_brokers, deadline,
                              alive=self._check_alive)
        except BaseException:
            self.down()
            raise
        return self

    def stop_broker(self, broker_id: int, timeout_s: float = 60.0) -> None:
        """SIGTERM (a controlled shutdown: the controller moves leaders away and shrinks ISRs);
        SIGKILL if it has not exited after `timeout_s`."""
        proc = self.brokers[broker_id].proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def start_broker(self, broker_id: int, timeout_s: float = 120.0) -> None:
        """Start a stopped broker again (same port, config and data); returns once every broker
        lists all of them again."""
        b = self.brokers[broker_id]
        if b.alive():
            return
        self._spawn(b, kafka_classpath())
        wait_for_metadata([x.address for x in self.brokers.values()], len(self.brokers),
                          time.monotonic() + timeout_s, alive=self._check_alive)

    def _spawn(self, b: KafkaBroker, classpath: str) -> None:
        cmd = [JAVA, f"-Xmx{self.heap_mb}m", *self.jvm_options,
               f"-Dlog4j.configuration=file:{self.dir / 'log4j.properties'}",
               f"-Dkafka.logs.dir={b.dir}", "-cp", classpath, "kafka.Kafka", str(b.config)]
        with open(b.log_file, "ab") as log:
            b.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=subprocess.STDOUT, cwd=b.dir,
                                      start_new_session=True, preexec_fn=_die_with_parent)

    def _check_alive(self) -> None:
        for b in self.brokers.values():
            if not b.alive():
                raise KafkaClusterError(f"Kafka broker {b.id} exited during startup: "
                                        f"{b.log_tail()}")

    def down(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every broker (a controlled shutdown), SIGKILL after `timeout_s`, then ZooKeeper."""
        running = [b for b in self.brokers.values() if b.alive()]
        for b in running:
            assert b.proc is not None
            with contextlib.suppress(ProcessLookupError):
                b.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for b in running:
            assert b.proc is not None
            try:
                b.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                b.proc.kill()
                b.proc.wait(timeout=10)
        if self.zookeeper is not None:
            self.zookeeper.stop()

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


def wait_for_metadata(addresses: Sequence[str], n_brokers: int, deadline: float,
                      alive: Callable[[], None] | None = None) -> None:
    """Until each of `addresses` answers Metadata listing `n_brokers` brokers and a controller
    (a broker serves Metadata before the controller's UpdateMetadata has told it the others).
    `alive`, if given, is called each round and raises when a process died."""
    from tidelog.client.connection import BrokerConnection
    from tidelog.protocol.messages.metadata import MetadataRequest

    async def brokers_seen(address: str) -> int:
        host, port = address.rsplit(":", 1)
        conn = BrokerConnection(host, int(port), request_timeout_ms=3000)
        try:
            await conn.connect(timeout_s=3)
            r = await conn.send(MetadataRequest(topics=[]))
            return len(r.brokers) if r.controller_id >= 0 else 0
        except Exception:  # noqa: BLE001 - not serving yet
            return 0
        finally:
            await conn.close()

    pending = list(addresses)
    while pending:
        if alive is not None:
            alive()
        pending = [a for a in pending if asyncio.run(brokers_seen(a)) < n_brokers]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise KafkaClusterError(f"brokers {pending} did not list {n_brokers} brokers in time")
        time.sleep(0.3)
