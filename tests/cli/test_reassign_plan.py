"""`tidelog reassign` reads Kafka's reassignment JSON: `log_dirs` as long as `replicas`
(Kafka's message otherwise, before anything is sent); a dir other than `any` is a log dir move
for that replica."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from tidelog.cli.reassign_cmd import _execute_moves, _read_plan, reassign
from tidelog.protocol.errors import ErrorCode

NOWHERE = "127.0.0.1:9"  # never reached: the plan is refused first


def plan_file(tmp_path: Path, **partition: object) -> str:
    entry = {"topic": "moving", "partition": 0, "replicas": [2, 3, 4], **partition}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"version": 1, "partitions": [entry]}))
    return str(path)


def test_a_plan_with_any_log_dir_or_none_is_read(tmp_path: Path) -> None:
    assert _read_plan(plan_file(tmp_path, log_dirs=["any"] * 3)) == ({("moving", 0): [2, 3, 4]},
                                                                     {})
    assert _read_plan(plan_file(tmp_path)) == ({("moving", 0): [2, 3, 4]}, {})


def test_a_log_dir_other_than_any_is_a_move_of_that_replica(tmp_path: Path) -> None:
    assert _read_plan(plan_file(tmp_path, log_dirs=["any", "/data/b", "any"])) == (
        {("moving", 0): [2, 3, 4]}, {("moving", 0, 3): "/data/b"})


@pytest.mark.parametrize("command", ["execute", "verify", "cancel"])
def test_log_dirs_not_as_long_as_replicas_are_refused_before_anything_is_sent(
        tmp_path: Path, command: str) -> None:
    result = CliRunner().invoke(reassign, [
        command, "--bootstrap-server", NOWHERE,
        "--reassignment-json-file", plan_file(tmp_path, log_dirs=["any"])])
    assert result.exit_code == 1
    assert ("Error: Size of replicas list [2, 3, 4] is different from size of log dirs list "
            "[any] for partition moving-0") in result.output


class Brokers:
    """The cluster as `tidelog reassign` sees it through its client: each broker answers
    AlterReplicaLogDirs from a script (REPLICA_NOT_AVAILABLE until its replica exists)."""

    def __init__(self, not_yet: int) -> None:
        self.not_yet = not_yet
        self.sent: list[tuple[int, Any]] = []

    async def send(self, broker: int, request: Any) -> Any:
        from tidelog.protocol.messages import alter_replica_log_dirs as m

        self.sent.append((broker, request))
        code = ErrorCode.REPLICA_NOT_AVAILABLE if self.not_yet > 0 else ErrorCode.NONE
        self.not_yet -= 1
        return m.AlterReplicaLogDirsResponse(results=[m.AlterReplicaLogDirTopicResult(
            t.name, [m.AlterReplicaLogDirPartitionResult(p, code) for p in t.partitions])
            for d in request.dirs for t in d.topics])


def test_a_move_is_retried_while_its_replica_is_not_hosted_yet(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Kafka's executeMoves: a replica new to its broker answers REPLICA_NOT_AVAILABLE until
    the reassignment created it there; the move is sent again until it starts."""
    brokers = Brokers(not_yet=2)
    asyncio.run(_execute_moves(brokers, {("moving", 0, 3): "/data/b"}, timeout_ms=10_000))
    assert [b for b, _ in brokers.sent] == [3, 3, 3]
    assert [d.path for d in brokers.sent[0][1].dirs] == ["/data/b"]
    assert capsys.readouterr().out == ("Successfully started moving log directory to /data/b "
                                       "for replica moving-0 with broker 3 \n")


def test_a_move_that_never_starts_times_out_with_kafkas_message() -> None:
    result = CliRunner().invoke(_timeout_cli, [])
    assert result.exit_code == 1
    assert "Timed out before log directory move could be started for: moving-0-3" \
        in result.output


@click.command()
def _timeout_cli() -> None:
    asyncio.run(_execute_moves(Brokers(not_yet=10**6), {("moving", 0, 3): "/data/b"},
                               timeout_ms=250))
