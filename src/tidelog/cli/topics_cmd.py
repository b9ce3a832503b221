"""`tidelog topics create|list|describe|delete --bootstrap-server B` (Kafka's kafka-topics).

`describe` prints Kafka's lines (`Topic: t  PartitionCount: ..`, then `Topic: t  Partition: p
Leader: l  Replicas: ..  Isr: ..`), and under each partition every replica's log end offset,
its own high watermark and its lag behind the leader. The partition's HW is the leader's answer
to a consumer's ListOffsets(latest). Each replica is asked by its own broker with Kafka's
debugging replica id (-2), which followers serve too: its LEO by ListOffsets, its HW by an empty
Fetch (a follower's HW is min(its LEO, the leader's HW from its last fetch), seed 001).
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import Any

import click

DEBUGGING_REPLICA_ID = -2
LATEST_TIMESTAMP = -1


def _err(msg: str) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(1)


def _bootstrap(f: Any) -> Any:
    return click.option("--bootstrap-server", "bootstrap", required=True,
                        envvar="TIDELOG_BOOTSTRAP_SERVERS",
                        help="host:port[,host:port...] of any brokers.")(f)


def _run(coro: Any) -> Any:
    from tidelog.client.errors import KafkaClientError

    try:
        return asyncio.run(coro)
    except KafkaClientError as e:
        _err(str(e))
    except ValueError as e:
        _err(str(e))


@click.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


@topics.command()
@_bootstrap
@click.option("--topic", required=True)
@click.option("--partitions", default=-1, type=int,
              help="Partition count (default: the broker's num.partitions).")
@click.option("--replication-factor", default=-1, type=int,
              help="Replicas per partition (default: the broker's default.replication.factor).")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE",
              help="A topic config override (repeatable).")
@click.option("--if-not-exists", is_flag=True, help="No error when the topic exists.")
def create(bootstrap: str, topic: str, partitions: int, replication_factor: int,
           configs: tuple[str, ...], if_not_exists: bool) -> None:
    """Create a topic."""
    from tidelog.client.cluster import KafkaClient, NewTopic
    from tidelog.protocol.errors import ErrorCode

    cfg: dict[str, str | None] = {}
    for item in configs:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            _err(f"--config {item!r} is not of the form key=value")
        cfg[k.strip()] = v

    async def main() -> Any:
        async with KafkaClient(bootstrap) as client:
            return (await client.create_topics(
                [NewTopic(topic, partitions, replication_factor, cfg)]))[topic]

    error = _run(main())
    if error is not None:
        if if_not_exists and error.code_value == ErrorCode.TOPIC_ALREADY_EXISTS:
            return
        _err(f"topic {topic!r} not created: {error}")
    click.echo(f"Created topic {topic}.")


@topics.command("list")
@_bootstrap
def list_topics(bootstrap: str) -> None:
    """List every topic, one per line."""
    from tidelog.client.cluster import KafkaClient

    async def main() -> list[str]:
        async with KafkaClient(bootstrap) as client:
            meta = await client.refresh_metadata(None)
            return sorted(meta.topics)

    for name in _run(main()):
        click.echo(name)


@topics.command()
@_bootstrap
@click.option("--topic", required=True)
def delete(bootstrap: str, topic: str) -> None:
    """Delete a topic (the controller removes it from every replica)."""
    from tidelog.client.cluster import KafkaClient

    async def main() -> Any:
        async with KafkaClient(bootstrap) as client:
            return (await client.delete_topics([topic])).get(topic)

    error = _run(main())
    if error is not None:
        _err(f"topic {topic!r} not deleted: {error}")
    click.echo(f"Deleted topic {topic}.")


@topics.command()
@_bootstrap
@click.option("--topic", required=True)
@click.option("--partitions", required=True, type=int,
              help="The new partition count (more than today's).")
@click.option("--replica-assignment", default=None, metavar="B:B,B:B",
              help="The new partitions' replicas, as kafka-topics: one colon-separated "
                   "broker list per new partition, comma-separated.")
def alter(bootstrap: str, topic: str, partitions: int, replica_assignment: str | None) -> None:
    """Add partitions to a topic (kafka-topics --alter --partitions)."""
    from tidelog.client.cluster import KafkaClient

    assignments = None
    if replica_assignment:
        try:
            assignments = {topic: [[int(b) for b in part.split(":")]
                                   for part in replica_assignment.split(",")]}
        except ValueError:
            _err(f"--replica-assignment {replica_assignment!r} is not of the form 1:2,2:3")

    async def main() -> Any:
        async with KafkaClient(bootstrap) as client:
            return (await client.create_partitions({topic: partitions},
                                                   assignments=assignments))[topic]

    error = _run(main())
    if error is not None:
        _err(f"partitions of {topic!r} not added: {error}")
    click.echo(f"Topic {topic} now has {partitions} partitions.")


@topics.command("delete-records")
@_bootstrap
@click.option("--topic", required=True)
@click.option("--partition", "partitions", multiple=True, type=int, required=True,
              help="A partition (repeatable).")
@click.option("--offset", required=True, type=int,
              help="Delete every record before it (-1: up to the high watermark).")
def delete_records(bootstrap: str, topic: str, partitions: tuple[int, ...], offset: int) -> None:
    """Delete the records before an offset (kafka-delete-records)."""
    from tidelog.client.cluster import KafkaClient
    from tidelog.client.metadata import TopicPartition

    async def main() -> Any:
        async with KafkaClient(bootstrap) as client:
            return await client.delete_records(
                {TopicPartition(topic, p): offset for p in partitions})

    results = _run(main())
    click.echo("Records delete operation completed:")
    failed = False
    for tp, r in sorted(results.items(), key=lambda kv: kv[0].partition):
        if isinstance(r, int):
            click.echo(f"partition: {tp.topic}-{tp.partition}\tlow_watermark: {r}")
        else:
            failed = True
            click.echo(f"partition: {tp.topic}-{tp.partition}\terror: {r}")
    if failed:
        sys.exit(1)


@topics.command("elect-leaders")
@_bootstrap
@click.option("--election-type", type=click.Choice(["preferred", "unclean"]), required=True)
@click.option("--topic", default=None)
@click.option("--partition", "partition", default=None, type=int)
@click.option("--all-topic-partitions", is_flag=True)
def elect_leaders(bootstrap: str, election_type: str, topic: str | None, partition: int | None,
                  all_topic_partitions: bool) -> None:
    """Elect leaders (kafka-leader-election): one partition, or every partition."""
    from tidelog.client.cluster import KafkaClient
    from tidelog.client.metadata import TopicPartition
    from tidelog.protocol.errors import ErrorCode

    if all_topic_partitions == (topic is not None):
        _err("give either --topic and --partition or --all-topic-partitions")
    if topic is not None and partition is None:
        _err("--topic needs --partition")
    asked = None if all_topic_partitions else [TopicPartition(topic or "", partition or 0)]

    async def main() -> Any:
        async with KafkaClient(bootstrap) as client:
            return await client.elect_leaders(asked, unclean=election_type == "unclean")

    results = _run(main())
    elected = sorted(f"{tp.topic}-{tp.partition}" for tp, e in results.items() if e is None)
    if elected:
        click.echo(f"Successfully completed leader election ({election_type.upper()}) for "
                   f"partitions {', '.join(elected)}")
    for tp, e in sorted(results.items(), key=lambda kv: (kv[0].topic, kv[0].partition)):
        if e is not None:
            click.echo(f"Error completing leader election ({election_type.upper()}) for "
                       f"partition: {tp.topic}-{tp.partition}: {e}")
    if any(e is not None and e.code_value != ErrorCode.ELECTION_NOT_NEEDED
           for e in results.values()):
        sys.exit(1)


@dataclass
class ReplicaOffsets:
    broker: int
    log_end_offset: int | None
    error: str | None = None
    high_watermark: int | None = None


@dataclass
class PartitionDescription:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    high_watermark: int | None
    offsets: list[ReplicaOffsets]


async def _replica_leo(client: Any, broker: int, topic: str, partition: int) -> ReplicaOffsets:
    from tidelog.client.errors import KafkaClientError
    from tidelog.protocol.errors import ErrorCode
    from tidelog.protocol.messages.list_offsets import (
        ListOffsetsPartition,
        ListOffsetsRequest,
        ListOffsetsTopic,
    )

    request = ListOffsetsRequest(
        replica_id=DEBUGGING_REPLICA_ID,
        isolation_level=0,
        topics=[ListOffsetsTopic(topic, [ListOffsetsPartition(partition, -1, LATEST_TIMESTAMP,
                                                              max_num_offsets=1)])],
    )
    try:
        conn = await asyncio.wait_for(client.connection(broker), 5)
        version = conn.pick_version(request.API_KEY)
        response = await conn.send(request, version, timeout_ms=5000)
    except (KafkaClientError, TimeoutError, OSError) as e:
        return ReplicaOffsets(broker, None, f"unreachable: {e}")
    p = response.topics[0].partitions[0]
    if p.error_code:
        try:
            name = ErrorCode(p.error_code).name
        except ValueError:
            name = str(p.error_code)
        return ReplicaOffsets(broker, None, name)
    offset = p.offset if version >= 1 else (p.old_style_offsets or [-1])[0]
    return ReplicaOffsets(broker, offset, None, await _replica_hw(conn, topic, partition, offset))


async def _replica_hw(conn: Any, topic: str, partition: int, leo: int) -> int | None:
    """The replica's own HW: an empty Fetch at its LEO with the debugging replica id."""
    from tidelog.client.errors import KafkaClientError
    from tidelog.protocol.messages.fetch import FetchPartition, FetchRequest, FetchTopic

    request = FetchRequest(
        replica_id=DEBUGGING_REPLICA_ID, max_wait_ms=0, min_bytes=0, max_bytes=1,
        topics=[FetchTopic(topic=topic, partitions=[FetchPartition(
            partition=partition, fetch_offset=leo, partition_max_bytes=1)])])
    try:
        response = await conn.send(request, timeout_ms=5000)  # by topic name: v12 at most
    except (KafkaClientError, TimeoutError, OSError):
        return None
    data = response.responses[0].partitions[0]
    return None if data.error_code else int(data.high_watermark)


async def describe_topics(bootstrap: str, names: list[str] | None) -> tuple[dict[str, Any],
                                                                           list[PartitionDescription]]:
    """Metadata and offsets of `names` (every topic when None)."""
    from tidelog.client.cluster import KafkaClient
    from tidelog.client.metadata import TopicPartition

    async with KafkaClient(bootstrap, retries=2) as client:
        meta = await client.refresh_metadata(names)
        topics_meta = {n: t for n, t in sorted(meta.topics.items())
                       if names is None or n in names}
        out: list[PartitionDescription] = []
        for name, t in topics_meta.items():
            for p, pm in sorted(t.partitions.items()):
                hw: int | None = None
                if pm.leader >= 0:
                    try:
                        res = await asyncio.wait_for(
                            client.list_offsets({TopicPartition(name, p): LATEST_TIMESTAMP}), 10)
                        got = res[TopicPartition(name, p)]
                        hw = got.offset if not got.error else None
                    except Exception:  # noqa: BLE001 - show the rest even if one leader is down
                        hw = None
                offsets = await asyncio.gather(
                    *(_replica_leo(client, r, name, p) for r in pm.replicas))
                out.append(PartitionDescription(name, p, pm.leader, pm.leader_epoch,
                                                tuple(pm.replicas), tuple(pm.isr), hw,
                                                list(offsets)))
        return topics_meta, out


def format_description(topics_meta: dict[str, Any], parts: list[PartitionDescription]) -> str:
    lines: list[str] = []
    for name, t in topics_meta.items():
        if t.error:
            lines.append(f"Topic: {name}\tError: {t.error}")
            continue
        rf = max((len(pm.replicas) for pm in t.partitions.values()), default=0)
        lines.append(f"Topic: {name}\tPartitionCount: {len(t.partitions)}\t"
                     f"ReplicationFactor: {rf}")
        for d in (d for d in parts if d.topic == name):
            lines.append(
                f"\tTopic: {name}\tPartition: {d.partition}\tLeader: "
                f"{d.leader if d.leader >= 0 else 'none'}\tReplicas: "
                f"{','.join(map(str, d.replicas))}\tIsr: {','.join(map(str, d.isr))}\t"
                f"LeaderEpoch: {d.leader_epoch}\tHW: "
                f"{d.high_watermark if d.high_watermark is not None else '?'}")
            leader_leo = next((o.log_end_offset for o in d.offsets if o.broker == d.leader), None)
            for o in d.offsets:
                role = "leader" if o.broker == d.leader else (
                    "in-sync" if o.broker in d.isr else "out-of-sync")
                if o.log_end_offset is None:
                    lines.append(f"\t\tReplica: {o.broker}\t({role})\tLEO: ?\tHW: ?\tLag: ?\t"
                                 f"{o.error}")
                    continue
                lag = (leader_leo - o.log_end_offset) if leader_leo is not None else None
                hw = o.high_watermark if o.high_watermark is not None else "?"
                lines.append(f"\t\tReplica: {o.broker}\t({role})\tLEO: {o.log_end_offset}\t"
                             f"HW: {hw}\tLag: {lag if lag is not None else '?'}")
    return "\n".join(lines)


@topics.command()
@_bootstrap
@click.option("--topic", "names", multiple=True, help="Topic(s) to describe (default: all).")
def describe(bootstrap: str, names: tuple[str, ...]) -> None:
    """Kafka's Topic/Partition/Leader/Replicas/Isr, plus each replica's LEO, HW and lag."""
    topics_meta, parts = _run(describe_topics(bootstrap, list(names) or None))
    missing = [n for n in names if n not in topics_meta]
    if missing:
        _err(f"unknown topic(s): {', '.join(missing)}")
    text = format_description(topics_meta, parts)
    if text:
        click.echo(text)
