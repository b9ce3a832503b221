"""`tidelog reassign generate|execute|verify|cancel|list --bootstrap-server B` (Kafka's
kafka-reassign-partitions, the same JSON files and the same messages).

- generate: `--topics-to-move-json-file F --broker-list 2,3,4`: the current assignment of the
  topics and a proposed one over the listed brokers (Kafka's rack-unaware round-robin with a
  random start, as kafka-reassign-partitions).
- execute: `--reassignment-json-file F [--throttle BYTES_PER_S]
  [--replica-alter-log-dirs-throttle BYTES_PER_S] [--timeout MS]`: prints the current
  assignment (for a rollback), sets the throttles when asked (each moving topic's
  leader.replication.throttled.replicas = the current replicas, follower... = the new ones; the
  brokers' leader/follower.replication.throttled.rate; with the log dir throttle, the
  replica.alter.log.dirs.io.max.bytes.per.second of each broker a replica moves between log
  dirs on) and sends AlterPartitionReassignments; then each replica the plan gives a log dir
  is sent there with AlterReplicaLogDirs, retried while its broker does not host it yet
  (REPLICA_NOT_AVAILABLE) until --timeout.
- verify: `--reassignment-json-file F`: each partition's state, then each log dir move's
  (DescribeLogDirs); once every move completed, the throttles are cleared (the brokers' rates
  and log dir throttle, the topics' throttled replicas).
- cancel: `--reassignment-json-file F`: AlterPartitionReassignments with no target (the
  partitions go back to their original replicas).
- list: the reassignments in progress (ListPartitionReassignments).

A plan's `log_dirs` must match its `replicas` in length (Kafka's check and message); `any`
lets the broker choose.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

T = TypeVar("T")
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4
OP_SET, OP_DELETE = 0, 1
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
LOG_DIR_RATE = "replica.alter.log.dirs.io.max.bytes.per.second"
ANY_LOG_DIR = "any"  # Kafka's AnyLogDir: the broker picks the directory


def _err(msg: str) -> None:
    click.echo(f"Error: {msg}", err=True)
    sys.exit(1)


def _plan_json(assignment: dict[tuple[str, int], list[int]]) -> str:
    """Kafka's formatAsReassignmentJson."""
    parts = [{"topic": t, "partition": p, "replicas": rs, "log_dirs": [ANY_LOG_DIR] * len(rs)}
             for (t, p), rs in sorted(assignment.items())]
    return json.dumps({"version": 1, "partitions": parts}, separators=(",", ":"))


def _java_list(items: list[Any]) -> str:
    return "[" + ", ".join(map(str, items)) + "]"


# (topic, partition, broker) -> the log dir the plan names for that replica
Moves = dict[tuple[str, int, int], str]


def _read_plan(path: str) -> tuple[dict[tuple[str, int], list[int]], Moves]:
    """Kafka's parsePartitionReassignmentData: each partition's target replicas, and the log
    dir of each replica whose plan entry is not `any`."""
    try:
        obj = json.loads(Path(path).read_text())
        plan: dict[tuple[str, int], list[int]] = {}
        moves: Moves = {}
        for p in obj["partitions"]:
            key = (str(p["topic"]), int(p["partition"]))
            replicas = [int(r) for r in p["replicas"]]
            log_dirs = [str(d) for d in p.get("log_dirs", [ANY_LOG_DIR] * len(replicas))]
            plan[key] = replicas
            if len(log_dirs) != len(replicas):
                _err(f"Size of replicas list {_java_list(replicas)} is different from size of "
                     f"log dirs list {_java_list(log_dirs)} for partition {_tp(key)}")
            moves.update({(*key, r): d for r, d in zip(replicas, log_dirs, strict=True)
                          if d != ANY_LOG_DIR})
        return plan, moves
    except (OSError, ValueError, KeyError, TypeError) as e:
        _err(f"cannot read the reassignment {path}: {e}")
        raise AssertionError from e  # unreachable: _err exits


def _replica(r: tuple[str, int, int]) -> str:
    """Kafka's TopicPartitionReplica.toString."""
    return f"{r[0]}-{r[1]}-{r[2]}"


def _tp(key: tuple[str, int]) -> str:
    return f"{key[0]}-{key[1]}"


async def _current(client: Any, topics: set[str]) -> dict[tuple[str, int], list[int]]:
    meta = await client.refresh_metadata(sorted(topics))
    out: dict[tuple[str, int], list[int]] = {}
    for t in sorted(topics):
        tm = meta.topics.get(t)
        if tm is None or tm.error:
            _err(f"org.apache.kafka.common.errors.UnknownTopicOrPartitionException: "
                 f"Topic {t} not found.")
        for p, pm in sorted(tm.partitions.items()):
            out[(t, p)] = list(pm.replicas)
    return out


async def _to_controller(client: Any, request: Any) -> Any:
    return await client.send(await client._controller(), request)


async def _alter_configs(client: Any, broker: int | None, resources: list[Any]) -> None:
    from tidelog.protocol.errors import ErrorCode
    from tidelog.protocol.messages import incremental_alter_configs as m_iac

    target = broker if broker is not None else sorted(client.metadata.brokers)[0]
    response = await client.send(target, m_iac.IncrementalAlterConfigsRequest(
        resources=resources))
    for r in response.responses:
        if r.error_code:
            _err(f"{ErrorCode(r.error_code).name}: {r.error_message}")


def _ops(configs: dict[str, str | None]) -> list[Any]:
    from tidelog.protocol.messages import incremental_alter_configs as m_iac

    return [m_iac.AlterableConfig(k, OP_DELETE if v is None else OP_SET, v)
            for k, v in configs.items()]


async def _set_throttles(client: Any, current: dict[tuple[str, int], list[int]],
                         plan: dict[tuple[str, int], list[int]], rate: int) -> None:
    """Kafka's modifyReassignmentThrottle: moving partitions' sources throttled as leaders,
    destinations as followers; the rate on every broker taking part."""
    from tidelog.protocol.messages import incremental_alter_configs as m_iac

    leaders: dict[str, list[str]] = {}
    followers: dict[str, list[str]] = {}
    for key, target in sorted(plan.items()):
        now = current.get(key, [])
        if now == target:
            continue
        leaders.setdefault(key[0], []).extend(f"{key[1]}:{b}" for b in now)
        followers.setdefault(key[0], []).extend(
            f"{key[1]}:{b}" for b in target if b not in now)
    for topic in sorted(leaders):
        await _alter_configs(client, None, [m_iac.AlterConfigsResource(RESOURCE_TOPIC, topic, _ops({
            LEADER_REPLICAS: ",".join(leaders[topic]),
            FOLLOWER_REPLICAS: ",".join(followers.get(topic, []))}))])
    brokers = sorted({b for rs in (*current.values(), *plan.values()) for b in rs})
    for b in brokers:
        await _alter_configs(client, b, [m_iac.AlterConfigsResource(
            RESOURCE_BROKER, str(b), _ops({LEADER_RATE: str(rate), FOLLOWER_RATE: str(rate)}))])


async def _set_log_dir_throttle(client: Any, moves: Moves, rate: int) -> None:
    """Kafka's modifyLogDirThrottle: the rate on each broker a replica moves between log dirs
    on."""
    from tidelog.protocol.messages import incremental_alter_configs as m_iac

    for b in sorted({b for _, _, b in moves}):
        await _alter_configs(client, b, [m_iac.AlterConfigsResource(
            RESOURCE_BROKER, str(b), _ops({LOG_DIR_RATE: str(rate)}))])


async def _clear_throttles(client: Any, plan: dict[tuple[str, int], list[int]]) -> None:
    """Kafka's clearAllThrottles: the broker-level rates (and log dir throttle) of the live
    brokers and those the plan names, then the plan's topics' throttled replicas."""
    from tidelog.protocol.messages import incremental_alter_configs as m_iac

    meta = await client.refresh_metadata([])
    brokers = sorted(set(meta.brokers) | {b for rs in plan.values() for b in rs})
    click.echo(f"Clearing broker-level throttles on broker{'s' if len(brokers) != 1 else ''} "
               f"{','.join(map(str, brokers))}")
    for b in brokers:
        await _alter_configs(client, b, [m_iac.AlterConfigsResource(
            RESOURCE_BROKER, str(b),
            _ops({LEADER_RATE: None, FOLLOWER_RATE: None, LOG_DIR_RATE: None}))])
    topics = sorted({t for t, _ in plan})
    click.echo(f"Clearing topic-level throttles on topic{'s' if len(topics) != 1 else ''} "
               f"{','.join(topics)}")
    for t in topics:
        await _alter_configs(client, None, [m_iac.AlterConfigsResource(
            RESOURCE_TOPIC, t, _ops({LEADER_REPLICAS: None, FOLLOWER_REPLICAS: None}))])


async def _ongoing(client: Any) -> dict[tuple[str, int], Any]:
    from tidelog.protocol.errors import ErrorCode
    from tidelog.protocol.messages import list_partition_reassignments as m_lpr

    response = await _to_controller(client, m_lpr.ListPartitionReassignmentsRequest())
    if response.error_code:
        _err(f"{ErrorCode(response.error_code).name}: {response.error_message}")
    return {(t.name, p.partition_index): p for t in response.topics for p in t.partitions}


async def _alter(client: Any, targets: dict[tuple[str, int], list[int] | None]
                 ) -> dict[tuple[str, int], tuple[int, str | None]]:
    from tidelog.protocol.errors import ErrorCode
    from tidelog.protocol.messages import alter_partition_reassignments as m_apr

    topics: dict[str, list[Any]] = {}
    for (t, p), rs in sorted(targets.items()):
        topics.setdefault(t, []).append(m_apr.ReassignablePartition(p, rs))
    response = await _to_controller(client, m_apr.AlterPartitionReassignmentsRequest(
        topics=[m_apr.ReassignableTopic(t, ps) for t, ps in topics.items()]))
    if response.error_code:
        _err(f"{ErrorCode(response.error_code).name}: {response.error_message}")
    return {(t.name, p.partition_index): (p.error_code, p.error_message)
            for t in response.responses for p in t.partitions}


async def _alter_replica_log_dirs(client: Any, moves: Moves) -> set[tuple[str, int, int]]:
    """Kafka's alterReplicaLogDirs (the tool's): one AlterReplicaLogDirs per broker; the
    replicas it accepted. REPLICA_NOT_AVAILABLE (not hosted yet) is left for the next try,
    any other error ends the command."""
    from tidelog.protocol.errors import ErrorCode
    from tidelog.protocol.messages import alter_replica_log_dirs as m_arld

    started: set[tuple[str, int, int]] = set()
    for broker in sorted({b for _, _, b in moves}):
        dirs: dict[str, dict[str, list[int]]] = {}
        for (t, p, b), d in sorted(moves.items()):
            if b == broker:
                dirs.setdefault(d, {}).setdefault(t, []).append(p)
        response = await client.send(broker, m_arld.AlterReplicaLogDirsRequest(dirs=[
            m_arld.AlterReplicaLogDir(path=d, topics=[
                m_arld.AlterReplicaLogDirTopic(name=t, partitions=ps) for t, ps in ts.items()])
            for d, ts in dirs.items()]))
        for topic in response.results:
            for part in topic.partitions:
                replica = (topic.topic_name, part.partition_index, broker)
                if part.error_code == ErrorCode.NONE:
                    started.add(replica)
                elif part.error_code != ErrorCode.REPLICA_NOT_AVAILABLE:
                    _err(f"Failed to alter dir for {_replica(replica)}: "
                         f"{ErrorCode(part.error_code).name}")
    return started


async def _execute_moves(client: Any, moves: Moves, timeout_ms: int) -> None:
    """Kafka's executeMoves: retried every 100 ms until each replica's move started."""
    pending = dict(moves)
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        started = await _alter_replica_log_dirs(client, pending)
        for r in sorted(started):
            click.echo(f"Successfully started moving log directory to {pending[r]} for replica "
                       f"{r[0]}-{r[1]} with broker {r[2]} ")
            del pending[r]
        if not pending:
            return
        if time.monotonic() >= deadline:
            _err(f"Timed out before log directory move{'s' if len(pending) > 1 else ''} could "
                 "be started for: " + ",".join(_replica(r) for r in sorted(pending)))
        await asyncio.sleep(0.1)


async def _replica_log_dirs(client: Any, replicas: set[tuple[str, int, int]]
                            ) -> dict[tuple[str, int, int], tuple[str | None, str | None]]:
    """Kafka's describeReplicaLogDirs: each replica's (current dir, future dir), from the
    DescribeLogDirs of its broker; a replica found in no online dir is left out."""
    from tidelog.protocol.messages import describe_log_dirs as m_dld

    out: dict[tuple[str, int, int], tuple[str | None, str | None]] = {}
    for broker in sorted({b for _, _, b in replicas}):
        topics: dict[str, list[int]] = {}
        for t, p, b in sorted(replicas):
            if b == broker:
                topics.setdefault(t, []).append(p)
        response = await client.send(broker, m_dld.DescribeLogDirsRequest(topics=[
            m_dld.DescribableLogDirTopic(topic=t, partitions=ps) for t, ps in topics.items()]))
        for result in response.results:
            if result.error_code:
                continue
            for topic in result.topics:
                for part in topic.partitions:
                    replica = (topic.name, part.partition_index, broker)
                    if replica not in replicas:
                        continue
                    current, future = out.get(replica, (None, None))
                    if part.is_future_key:
                        future = result.log_dir
                    else:
                        current = result.log_dir
                    out[replica] = (current, future)
    return out


async def _verify_moves(client: Any, moves: Moves) -> bool:
    """Kafka's verifyReplicaMoves: a line per replica; True when every move completed."""
    found = await _replica_log_dirs(client, set(moves))
    done = True
    lines = []
    for r, target in sorted(moves.items()):
        t, p, b = r
        if r not in found:
            done = False
            lines.append(f"Partition {t}-{p} cannot be found in any live log directory on "
                         f"broker {b}.")
            continue
        current, future = found[r]
        if current is None:
            done = False
            lines.append(f"Partition {t}-{p} is not found in any live log dir on broker {b}. "
                         "There is likely an offline log directory on the broker.")
        elif future is None and current == target:
            lines.append(f"Reassignment of replica {_replica(r)} completed successfully.")
        elif future is None:
            done = False
            lines.append(f"Partition {t}-{p} on broker {b} is not being moved from log dir "
                         f"{current} to {target}.")
        elif future == target:
            done = False
            lines.append(f"Reassignment of replica {_replica(r)} is still in progress.")
        else:
            done = False
            lines.append(f"Partition {t}-{p} on broker {b} is being moved to log dir {future} "
                         f"instead of {target}.")
    click.echo("\n".join(lines))
    return done


def _with_client(bootstrap: str, body: Callable[[Any], Awaitable[T]]) -> T:
    """Run `body(client)` with a client of the cluster, closed afterwards; a client error
    ends the command with its message."""
    from tidelog.client.cluster import KafkaClient
    from tidelog.client.errors import KafkaClientError

    async def main() -> T:
        client = KafkaClient(bootstrap, retries=3)
        await client.start()
        try:
            return await body(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except KafkaClientError as e:
        _err(str(e))
        raise AssertionError from e  # unreachable: _err exits


_bootstrap = click.option("--bootstrap-server", "bootstrap", required=True,
                          envvar="TIDELOG_BOOTSTRAP_SERVERS",
                          help="host:port[,host:port...] of any brokers (or "
                               "$TIDELOG_BOOTSTRAP_SERVERS).")
_plan = click.option("--reassignment-json-file", "plan_file", required=True,
                     type=click.Path(exists=True, dir_okay=False),
                     help='The plan, as kafka-reassign-partitions writes it: {"version":1,'
                          '"partitions":[{"topic":..,"partition":..,"replicas":[..]}]}.')


@click.group()
def reassign() -> None:
    """Move partitions' replicas between brokers (Kafka's kafka-reassign-partitions)."""


@reassign.command()
@_bootstrap
@click.option("--topics-to-move-json-file", "topics_file", required=True,
              type=click.Path(exists=True, dir_okay=False),
              help='The topics to spread: {"version":1,"topics":[{"topic":"t"}]}.')
@click.option("--broker-list", required=True, help="The brokers to move the topics to: 2,3,4")
def generate(bootstrap: str, topics_file: str, broker_list: str) -> None:
    """Propose an assignment of the topics over the brokers."""
    from tidelog.controller.admin import assign_replicas_to_brokers

    topics = {str(t["topic"]) for t in json.loads(Path(topics_file).read_text())["topics"]}
    brokers = sorted({int(b) for b in broker_list.split(",") if b.strip()})

    current = _with_client(bootstrap, lambda client: _current(client, topics))
    proposed: dict[tuple[str, int], list[int]] = {}
    for t in sorted(topics):
        parts = sorted(p for (tt, p) in current if tt == t)
        rf = len(current[(t, parts[0])]) if parts else 0
        if rf > len(brokers):
            _err(f"Replication factor: {rf} larger than available brokers: {len(brokers)}.")
        for p, rs in assign_replicas_to_brokers(brokers, len(parts), rf).items():
            proposed[(t, p)] = rs
    click.echo("Current partition replica assignment")
    click.echo(_plan_json(current))
    click.echo("")
    click.echo("Proposed partition reassignment configuration")
    click.echo(_plan_json(proposed))


@reassign.command()
@_bootstrap
@_plan
@click.option("--throttle", type=int, default=-1,
              help="Bytes per second each moving replica may replicate at, leader and follower "
                   "side (leader/follower.replication.throttled.rate). Default: -1, unthrottled.")
@click.option("--replica-alter-log-dirs-throttle", "log_dir_throttle", type=int, default=-1,
              help="Bytes per second the replicas moving between log dirs of one broker are "
                   "copied at (that broker's replica.alter.log.dirs.io.max.bytes.per.second). "
                   "Default: -1, unthrottled.")
@click.option("--timeout", "timeout_ms", type=int, default=10_000,
              help="How long (ms) to wait for each log dir move to start: a replica new to its "
                   "broker cannot move before it is created there. Default: 10000.")
def execute(bootstrap: str, plan_file: str, throttle: int, log_dir_throttle: int,
            timeout_ms: int) -> None:
    """Start the reassignment in the file."""
    plan, moves = _read_plan(plan_file)

    async def main(client: Any) -> None:
        current = await _current(client, {t for t, _ in plan})
        click.echo("Current partition replica assignment\n")
        click.echo(_plan_json({k: current[k] for k in plan if k in current}))
        click.echo("\nSave this to use as the --reassignment-json-file option during rollback")
        if throttle >= 0 or log_dir_throttle >= 0:
            click.echo("Warning: You must run --verify periodically, until the reassignment "
                       "completes, to ensure the throttle is removed.")
        if throttle >= 0:
            await _set_throttles(client, current, plan, throttle)
            click.echo(f"The inter-broker throttle limit was set to {throttle} B/s")
        if log_dir_throttle >= 0:
            await _set_log_dir_throttle(client, moves, log_dir_throttle)
            click.echo(f"The replica-alter-dir throttle limit was set to {log_dir_throttle} B/s")
        results = await _alter(client, dict(plan))
        failed = {k: r for k, r in results.items() if r[0]}
        if failed:
            _err("Error reassigning partition(s):\n" + "\n".join(
                f"{_tp(k)}: {msg}" for k, (_, msg) in sorted(failed.items())))
        click.echo("Successfully started partition reassignment"
                   f"{'s' if len(plan) > 1 else ''} for "
                   + ",".join(_tp(k) for k in sorted(plan)))
        if moves:
            await _execute_moves(client, moves, timeout_ms)

    _with_client(bootstrap, main)


@reassign.command()
@_bootstrap
@_plan
def verify(bootstrap: str, plan_file: str) -> None:
    """Report each partition's move and log dir move; clear the throttles once every move
    completed."""
    plan, moves = _read_plan(plan_file)

    async def main(client: Any) -> None:
        ongoing = await _ongoing(client)
        current = await _current(client, {t for t, _ in plan})
        click.echo("Status of partition reassignment:")
        done = True
        for key, target in sorted(plan.items()):
            if key in ongoing:
                done = False
                click.echo(f"Reassignment of partition {_tp(key)} is still in progress.")
            elif current.get(key) == target:
                click.echo(f"Reassignment of partition {_tp(key)} is completed.")
            else:
                done = False
                click.echo(f"There is no active reassignment of partition {_tp(key)}, but "
                           f"replica set is {','.join(map(str, current.get(key, [])))} "
                           f"rather than {','.join(map(str, target))}.")
        # Kafka prints the log dir moves' lines here, an empty line when there are none.
        moves_done = await _verify_moves(client, moves)
        if done and moves_done:
            await _clear_throttles(client, plan)

    _with_client(bootstrap, main)


@reassign.command()
@_bootstrap
@_plan
def cancel(bootstrap: str, plan_file: str) -> None:
    """Cancel the reassignments in the file: back to the original replicas."""
    plan, _ = _read_plan(plan_file)

    async def main(client: Any) -> None:
        results = await _alter(client, {k: None for k in plan})
        cancelled = sorted(k for k, (code, _) in results.items() if code == 0)
        if cancelled:
            click.echo("Successfully cancelled partition reassignment"
                       f"{'s' if len(cancelled) > 1 else ''} for: "
                       + ",".join(_tp(k) for k in cancelled))
        else:
            click.echo("None of the specified partition reassignments are active.")

    _with_client(bootstrap, main)


@reassign.command(name="list")
@_bootstrap
def list_cmd(bootstrap: str) -> None:
    """The reassignments in progress."""

    async def main(client: Any) -> None:
        ongoing = await _ongoing(client)
        if not ongoing:
            click.echo("No partition reassignments found.")
            return
        click.echo("Current partition reassignments:")
        for key, p in sorted(ongoing.items()):
            click.echo(f"{_tp(key)}: replicas: {','.join(map(str, p.replicas))}. adding: "
                       f"{','.join(map(str, p.adding_replicas))}. removing: "
                       f"{','.join(map(str, p.removing_replicas))}.")

    _with_client(bootstrap, main)
