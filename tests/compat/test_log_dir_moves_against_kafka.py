"""A replica moved between two log dirs of one broker (JBOD) with Apache Kafka 3.9's own tools,
against Kafka and against tidelog, each a one-broker cluster with two log.dirs:
kafka-reassign-partitions --execute with a plan naming the other dir, --verify until the move
completed, kafka-log-dirs --describe before and after, a plan naming a dir the broker does not
have; the outputs are the same on both (log dir paths reduced to their role), and every record
is read back. Then `tidelog reassign` moves the replica back on tidelog. A move with
--replica-alter-log-dirs-throttle sets the broker's replica.alter.log.dirs.io.max.bytes.per.second
(kafka-configs --describe shows it) and --verify clears it, alike on both."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from tidelog_clusters import running_local_cluster

from tidelog.testing.kafka_cluster import KafkaCluster, kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

REASSIGN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"
TOPICS = "org.apache.kafka.tools.TopicCommand"
LOG_DIRS = "org.apache.kafka.tools.LogDirsCommand"
CONFIGS = "kafka.admin.ConfigCommand"
RECORDS = 300


def two_dirs(base: Path) -> dict[str, str]:
    return {"log.dirs": f"{base / 'disk-a'},{base / 'disk-b'}",
            "zookeeper.session.timeout.ms": "6000", "offsets.topic.replication.factor": "1"}


@pytest.fixture(scope="module")
def kafka_jbod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    d = tmp_path_factory.mktemp("kafka-jbod").resolve()
    cluster = KafkaCluster(d)
    cluster.up(1, overrides=two_dirs(d))
    try:
        yield cluster.bootstrap_servers, d
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def tidelog_jbod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    d = tmp_path_factory.mktemp("tidelog-jbod").resolve()
    with running_local_cluster(d, 1, two_dirs(d)) as cluster:
        yield cluster.bootstrap_servers, d


def tool(main_class: str, *args: str) -> tuple[int, str]:
    r = kafka_tool(main_class, *args)
    return r.returncode, r.stdout + ("" if r.returncode == 0 else r.stderr.split("\n")[0])


def replica_dirs(bootstrap: str, topic: str) -> list[tuple[str, bool, int]]:
    """kafka-log-dirs --describe: (log dir, is future, offset lag) of each log of the topic."""
    code, out = tool(LOG_DIRS, "--bootstrap-server", bootstrap, "--describe", "--topic-list",
                     topic)
    assert code == 0, out
    doc = json.loads(out.strip().splitlines()[-1])
    return sorted((ld["logDir"], p["isFuture"], p["offsetLag"]) for b in doc["brokers"]
                  for ld in b["logDirs"] for p in ld["partitions"])


def plan(path: Path, topic: str, log_dir: str) -> str:
    path.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": [1], "log_dirs": [log_dir]}]}))
    return str(path)


def wait_until(cond: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def count_records(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chk-{time.time_ns()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([CkTopicPartition(topic, 0, 0)])
    n = 0
    deadline = time.monotonic() + 60
    try:
        while n < RECORDS and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                n += 1
    finally:
        c.close()
    return n


def scenario(bootstrap: str, base: Path) -> list[Any]:
    bs = ("--bootstrap-server", bootstrap)
    r = kafka_tool(TOPICS, *bs, "--create", "--topic", "jbod", "--partitions", "1",
                   "--replication-factor", "1")
    assert r.returncode == 0, r.stderr
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    acked: list[int] = []
    for i in range(RECORDS):
        p.produce("jbod", b"v%04d" % i + b"." * 500, partition=0,
                  on_delivery=lambda e, m: acked.append(1) if e is None else None)
    p.flush(60)
    assert len(acked) == RECORDS
    ((source, _, _),) = wait_until(lambda: replica_dirs(bootstrap, "jbod"), 30, "the log")
    a, b = str(base / "disk-a"), str(base / "disk-b")
    target = b if source == a else a
    roles = {source: "SOURCE", target: "TARGET", str(base): "BASE"}

    def normal(x: Any) -> Any:
        if isinstance(x, str):
            for path, role in roles.items():
                x = x.replace(path, role)
            return x
        if isinstance(x, list | tuple):
            return type(x)(normal(e) for e in x)
        return x

    move = plan(base / "move.json", "jbod", target)
    seen: list[Any] = [
        replica_dirs(bootstrap, "jbod"),
        tool(REASSIGN, *bs, "--execute", "--reassignment-json-file", move),
        wait_until(lambda: (v := tool(REASSIGN, *bs, "--verify", "--reassignment-json-file",
                                      move)) and "completed successfully" in v[1] and v,
                   120, "the log dir move to complete"),
        replica_dirs(bootstrap, "jbod"),
        tool(REASSIGN, *bs, "--execute", "--reassignment-json-file",
             plan(base / "nowhere.json", "jbod", str(base / "no-such-dir"))),
        count_records(bootstrap, "jbod"),
    ]
    return normal(seen)


def test_kafka_reassign_partitions_moves_a_replica_between_log_dirs_as_on_kafka(
        kafka_jbod: tuple[str, Path], tidelog_jbod: tuple[str, Path]) -> None:
    on_kafka = scenario(*kafka_jbod)
    on_tidelog = scenario(*tidelog_jbod)
    assert on_tidelog == on_kafka, (on_kafka, on_tidelog)
    assert on_kafka[0] == [("SOURCE", False, 0)] and on_kafka[3] == [("TARGET", False, 0)]
    assert on_kafka[4][0] != 0 and "Failed to alter dir for jbod-0-1" in on_kafka[4][1]
    assert on_kafka[-1] == RECORDS


def test_tidelog_reassign_moves_the_replica_back(tidelog_jbod: tuple[str, Path]) -> None:
    from tidelog.cli.reassign_cmd import reassign

    bootstrap, base = tidelog_jbod
    r = kafka_tool(TOPICS, "--bootstrap-server", bootstrap, "--create", "--topic", "back",
                   "--partitions", "1", "--replication-factor", "1")
    assert r.returncode == 0, r.stderr
    ((source, _, _),) = wait_until(lambda: replica_dirs(bootstrap, "back"), 30, "the log")
    target = str(base / ("disk-b" if source.endswith("disk-a") else "disk-a"))
    move = plan(base / "back.json", "back", target)
    run = CliRunner()
    out = run.invoke(reassign, ["execute", "--bootstrap-server", bootstrap,
                                "--reassignment-json-file", move])
    assert out.exit_code == 0, out.output
    assert (f"Successfully started moving log directory to {target} for replica back-0 with "
            "broker 1 ") in out.output
    verified = wait_until(lambda: (v := run.invoke(reassign, [
        "verify", "--bootstrap-server", bootstrap, "--reassignment-json-file", move]))
        and "completed successfully" in v.output and v, 60, "the move")
    assert "Reassignment of replica back-0-1 completed successfully." in verified.output
    assert replica_dirs(bootstrap, "back") == [(target, False, 0)]


def kafkas_reassign(bootstrap: str, action: str, *args: str) -> tuple[int, str]:
    """Kafka's kafka-reassign-partitions --<action>."""
    return tool(REASSIGN, "--bootstrap-server", bootstrap, f"--{action}", *args)


def tidelogs_reassign(bootstrap: str, action: str, *args: str) -> tuple[int, str]:
    """`tidelog reassign <action>`, with Kafka's tool's arguments."""
    from tidelog.cli.reassign_cmd import reassign

    out = CliRunner().invoke(reassign, [action, "--bootstrap-server", bootstrap, *args])
    return out.exit_code, out.output


def throttled_move(bootstrap: str, base: Path, topic: str = "slow",
                   reassign_tool: Any = kafkas_reassign) -> list[Any]:
    """--execute --replica-alter-log-dirs-throttle sets the broker's
    replica.alter.log.dirs.io.max.bytes.per.second; --verify clears it once the move is done."""
    bs = ("--bootstrap-server", bootstrap)
    r = kafka_tool(TOPICS, *bs, "--create", "--topic", topic, "--partitions", "1",
                   "--replication-factor", "1")
    assert r.returncode == 0, r.stderr
    ((source, _, _),) = wait_until(lambda: replica_dirs(bootstrap, topic), 30, "the log")
    target = str(base / ("disk-b" if source.endswith("disk-a") else "disk-a"))
    move = plan(base / f"{topic}.json", topic, target)
    describe = (CONFIGS, *bs, "--entity-type", "brokers", "--entity-name", "1", "--describe")
    seen: list[Any] = [
        reassign_tool(bootstrap, "execute", "--reassignment-json-file", move,
                      "--replica-alter-log-dirs-throttle", "1000000"),
        tool(*describe),
        wait_until(lambda: (v := reassign_tool(bootstrap, "verify", "--reassignment-json-file",
                                               move)) and "completed successfully" in v[1] and v,
                   120, "the throttled move to complete"),
        tool(*describe),
    ]
    assert replica_dirs(bootstrap, topic) == [(target, False, 0)]
    return [(code, out.replace(target, "TARGET").replace(topic, "TOPIC")) for code, out in seen]


def test_the_replica_alter_log_dirs_throttle_is_set_and_cleared_as_on_kafka(
        kafka_jbod: tuple[str, Path], tidelog_jbod: tuple[str, Path]) -> None:
    on_kafka = throttled_move(*kafka_jbod)
    on_tidelog = throttled_move(*tidelog_jbod)
    assert on_tidelog == on_kafka, (on_kafka, on_tidelog)
    assert on_kafka[0][0] == 0 and "replica-alter-dir throttle" in on_kafka[0][1]
    assert "replica.alter.log.dirs.io.max.bytes.per.second=1000000" in on_kafka[1][1]
    assert "replica.alter.log.dirs.io.max.bytes.per.second" not in on_kafka[3][1]


def test_tidelog_reassign_sets_and_clears_the_log_dir_throttle_as_kafkas_tool(
        kafka_jbod: tuple[str, Path], tidelog_jbod: tuple[str, Path]) -> None:
    """`tidelog reassign execute --replica-alter-log-dirs-throttle`, then verify: the same
    output and broker configs as Kafka's tool, against Kafka and against tidelog."""
    by_kafkas_tool = throttled_move(*kafka_jbod, topic="slow-k")
    on_kafka = throttled_move(*kafka_jbod, topic="slow-tk", reassign_tool=tidelogs_reassign)
    on_tidelog = throttled_move(*tidelog_jbod, topic="slow-t", reassign_tool=tidelogs_reassign)
    assert on_kafka == by_kafkas_tool, (by_kafkas_tool, on_kafka)
    assert on_tidelog == by_kafkas_tool, (by_kafkas_tool, on_tidelog)
    assert "The replica-alter-dir throttle limit was set to 1000000 B/s" in on_kafka[0][1]
